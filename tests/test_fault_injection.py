"""Fault injection: hostile manifests and audio (made by asrfit.testing.hostile), each asserting
what the user sees: a counted skip naming the line, or an error naming file, line, field, value
and what to do. See docs/reliability.md for the table these tests back."""

from __future__ import annotations

import json

import pytest
import torch

from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.text import CharVocabulary, TextNormalizer
from asrfit.data.validate import ValidationPolicy, validate_utterances
from asrfit.errors import ConfigError, ManifestError
from asrfit.plan.long_audio import long_audio_cap_seconds
from asrfit.recipes.asr_model import build_asr_model
from asrfit.recipes.run_safety import parse_save_every, recover_best
from asrfit.testing.dummies import write_dummy_audio, write_manifest
from asrfit.testing.hostile import HOSTILE_KINDS, hostile_corpus, write_non_utf8_manifest
from asrfit.utils.io import remove_stale_temporaries

pytestmark = pytest.mark.usefixtures("one_thread")

# What these tests check (counts, names, the long-audio rule, finite weights) does not depend on
# the model's size: one Conformer block of width 32 with an 8-channel front-end trains the five
# minutes of audio of the end-to-end test in about a third of the time of two blocks of 48.
TINY = {
    "d_model": 32,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "conv_kernel_size": 7,
    "subsampling_conv_channels": 8,
}


@pytest.fixture(scope="module")
def asr():
    vocab = CharVocabulary.build(["abcdefghijklmnopqrstuvwxyz "], TextNormalizer())
    return build_asr_model("conformer-ctc-tiny", vocab, pretrained=False, overrides=TINY), vocab


def _admit(case_manifest, asr_vocab, policy=None):
    model, vocab = asr_vocab
    utts, log = validate_utterances(utterances_from(case_manifest), policy)
    data = SpeechDataset(utts, vocab, model.frontend, **model.label_rules())
    log.merge(dict(data.skipped))
    log.entries += data.skip_entries
    return data, log


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_each_hostile_input_is_counted_or_named(kind, tmp_path, asr):
    case = hostile_corpus(tmp_path, kind, num_good=12)
    data, log = _admit(case.manifest, asr)
    if case.skip_reason is not None:
        assert dict(log.counts) == {case.skip_reason: 1}
        (entry,) = log.entries
        assert f"line {case.hostile_line} " in entry["where"]
        for word in case.message_words:
            assert word in entry["detail"], (word, entry["detail"])
        assert len(data) == 12
        return
    assert not log.counts
    assert len(data) == 13
    if case.replaced_reason is not None:  # only decoding tells: replaced in its batch, counted once
        samples = [data[i] for i in range(len(data))] + [data[i] for i in range(len(data))]
        assert all(torch.isfinite(s["input_features"]).all() for s in samples)
        assert data.replacements() == {case.replaced_reason: 1}
    if kind == "no_duration_field":
        assert sorted(data.durations).count(1.5) == 2  # good_0010 and the header-read one


def test_too_many_skips_stop_with_counts_and_the_knob(tmp_path, asr):
    case = hostile_corpus(tmp_path, "empty_file", num_good=12)
    _, log = _admit(case.manifest, asr)
    with pytest.raises(ConfigError) as info:
        log.check(ValidationPolicy(), "training data", "run/skipped.jsonl")
    message = str(info.value)
    assert "1 of 13 utterances (7.7%)" in message and "unreadable_audio: 1" in message
    assert "run/skipped.jsonl" in message and "--max-skipped" in message
    log.check(ValidationPolicy(max_skipped_fraction=0.1), "training data")  # settable


def test_duration_tolerance_is_settable(tmp_path, asr):
    audio = write_dummy_audio(tmp_path / "a.wav", duration_seconds=1.0)
    manifest = write_manifest(
        tmp_path / "m.jsonl", [{"audio_filepath": str(audio), "text": "a", "duration": 1.15}]
    )
    _, strict = validate_utterances(
        utterances_from(manifest), ValidationPolicy(duration_tolerance_seconds=0.1)
    )
    kept, loose = validate_utterances(
        utterances_from(manifest), ValidationPolicy(duration_tolerance_seconds=0.2)
    )
    assert dict(strict.counts) == {"duration_mismatch": 1} and not loose.counts and len(kept) == 1


def test_empty_manifest_says_it_is_empty(tmp_path):
    manifest = tmp_path / "empty.jsonl"
    manifest.write_text("\n\n")
    with pytest.raises(ManifestError, match="holds no utterances"):
        validate_utterances(utterances_from(manifest))


def test_non_utf8_manifest_is_rejected_alike_by_profile_and_train(tmp_path):
    from asrfit.profiles.dataset import DatasetProfile

    manifest, line = write_non_utf8_manifest(tmp_path)
    for read in (lambda: DatasetProfile.from_manifest(manifest), lambda: utterances_from(manifest)):
        with pytest.raises(ManifestError) as info:
            read()
        assert f"line {line}: not UTF-8" in str(info.value) and "0xe9" in str(info.value)


def test_long_audio_rule_chunks_a_five_minute_file(tmp_path, asr):
    durations = [1.0 + 0.01 * i for i in range(60)] + [300.0]
    cap, reason = long_audio_cap_seconds(durations)
    assert cap == 30.0 and "300.0 s" in reason and "chunked" in reason
    assert long_audio_cap_seconds([1.0, 20.0, 35.0])[0] is None  # 3 x p90 covers it
    audio = write_dummy_audio(tmp_path / "long.wav", duration_seconds=300.0)
    manifest = write_manifest(
        tmp_path / "m.jsonl",
        [{"audio_filepath": str(audio), "text": "a b c " * 50, "duration": 300.0}],
    )
    model, vocab = asr
    data = SpeechDataset(
        utterances_from(manifest), vocab, model.frontend, max_seconds=cap, long_utterances="chunk"
    )
    pieces = [u.duration_seconds for u in data.utterances]
    assert not data.skipped and len(pieces) == 11  # ceil(300 / 29): room to move each cut by 0.5 s
    assert max(pieces) <= 30.0 and min(pieces) > 25.0 and sum(pieces) == pytest.approx(300.0)


def test_save_every_parses_steps_and_minutes():
    assert parse_save_every("500") == (500, None)
    assert parse_save_every("30m") == (None, 30.0)
    assert parse_save_every("1.5min") == (None, 1.5)
    assert parse_save_every("0") == (None, None)
    with pytest.raises(ConfigError, match="steps"):
        parse_save_every("often")


def test_interrupted_best_write_is_recovered(tmp_path):
    best = tmp_path / "best"
    # killed between moving the old best aside and moving the new one in
    (tmp_path / "best.old").mkdir()
    (tmp_path / "best.old" / "scores.json").write_text('{"dev_cer": 0.5}')
    (tmp_path / "best.tmp").mkdir()
    (tmp_path / "best.tmp" / "scores.json").write_text('{"dev_cer": 0.4}')
    recover_best(best)
    assert json.loads((best / "scores.json").read_text())["dev_cer"] == 0.4
    assert not (tmp_path / "best.old").exists() and not (tmp_path / "best.tmp").exists()
    # killed while writing the new one (no scores.json yet): the old best stays
    (tmp_path / "best.tmp").mkdir()
    (tmp_path / "best.tmp" / "model.safetensors").write_bytes(b"half")
    recover_best(best)
    assert json.loads((best / "scores.json").read_text())["dev_cer"] == 0.4
    assert not (tmp_path / "best.tmp").exists()


def test_stale_temporaries_are_removed(tmp_path):
    (tmp_path / "stage1" / "checkpoints").mkdir(parents=True)
    stale = tmp_path / "stage1" / "checkpoints" / ".checkpoint-00000004.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")
    keep = tmp_path / "stage1" / "checkpoints" / "checkpoint-00000002.pt"
    keep.write_bytes(b"whole")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert keep.exists()


def _tiny_run(tmp_path, manifest):
    """One epoch of the tiny Conformer on ``manifest``, trained from random weights."""
    from asrfit.recipes.run import RunConfig

    return RunConfig(
        model="conformer-ctc-tiny",
        train=str(manifest),
        out_dir=str(tmp_path / "run"),
        target_batch=4,
        epochs=1,
        random_init=True,
        model_overrides=TINY,
    )


def _hostile_run(tmp_path, with_long_file: bool):
    from asrfit.testing.hostile import write_nonfinite_wav

    case = hostile_corpus(tmp_path, "no_duration_field", num_good=24)
    rows = [json.loads(line) for line in case.manifest.read_text().splitlines()]
    write_nonfinite_wav(tmp_path / "audio" / "nan.wav", seconds=1.0)
    rows.append({"audio_filepath": "audio/nan.wav", "text": "a lazy dog", "duration": 1.0})
    if with_long_file:
        write_dummy_audio(tmp_path / "audio" / "five_minutes.wav", duration_seconds=300.0)
        rows.append(
            {
                "audio_filepath": "audio/five_minutes.wav",
                "text": "the quick brown fox " * 60,
                "duration": 300.0,
            }
        )
    write_manifest(case.manifest, rows)
    return case.manifest


def test_train_end_to_end_with_nan_audio(tmp_path, monkeypatch):
    """`asrfit train` replaces the NaN file in its batch, counts it in report.json, stays finite,
    and ends its training once (leaving the process group, as torchrun's processes need)."""
    from asrfit.recipes.run import train_asr
    from asrfit.train.trainer import MemoryEfficientTrainer

    ended = []
    end_training = MemoryEfficientTrainer.end_training
    monkeypatch.setattr(
        MemoryEfficientTrainer, "end_training", lambda self: ended.append(end_training(self))
    )
    manifest = _hostile_run(tmp_path, with_long_file=False)
    cfg = _tiny_run(tmp_path, manifest)
    report = train_asr(cfg)
    assert len(ended) == 1
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["skipped"] == {"replaced_non_finite_audio": 1} and saved["skipped_total"] == 1
    assert saved["utterances_total"] == 26 and report.nonfinite_steps == 0
    # the plan was made for this CPU, so each epoch carries its predicted time beside the measured one
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    epoch = saved["epochs"][0]
    assert plan["gpu"] == "cpu-only" and epoch["wall_seconds"] > 0
    assert epoch["predicted_seconds"] == pytest.approx(
        epoch["audio_seconds"] / plan["predicted_throughput_seconds_per_second"]
    )
    final = torch.load(
        next((tmp_path / "run" / "stage1" / "checkpoints").glob("*.pt")), weights_only=True
    )
    assert all(torch.isfinite(v).all() for v in final["model"].values() if v.is_floating_point())
    assert (
        "1 of 26 training utterances skipped or replaced"
        in (tmp_path / "run" / "report.md").read_text()
    )


def test_five_minute_file_is_chunked_by_the_plans_rule(tmp_path, asr):
    """The plan sees 11 chunks of at most 30 s (no 300 s bucket), listed in train.clean.jsonl."""
    from asrfit.recipes.run import RunConfig
    from asrfit.recipes.run_data import plan_for

    manifest = _hostile_run(tmp_path, with_long_file=True)
    model, vocab = asr
    utts, _ = validate_utterances(utterances_from(manifest))
    cap, _ = long_audio_cap_seconds([u.duration_seconds for u in utts])
    data = SpeechDataset(
        utts, vocab, model.frontend, **model.label_rules(), max_seconds=cap, long_utterances="chunk"
    )
    cfg = RunConfig(
        model="conformer-ctc-tiny",
        train=str(manifest),
        out_dir=str(tmp_path / "run"),
        target_batch=4,
    )
    (tmp_path / "run").mkdir()
    plan, _ = plan_for(cfg, model, data, cap)
    assert plan.data.max_seconds == 30.0 and max(b.max_seconds for b in plan.buckets) <= 30.0
    clean = [
        json.loads(x) for x in (tmp_path / "run" / "train.clean.jsonl").read_text().splitlines()
    ]
    chunks = [r for r in clean if r["audio_filepath"].endswith("five_minutes.wav")]
    assert len(chunks) == 11 and sum(r["duration"] for r in chunks) == pytest.approx(300.0)
    assert [r.get("offset", 0.0) for r in chunks] == sorted(r.get("offset", 0.0) for r in chunks)


def test_utterances_the_sampler_cannot_batch_are_counted_in_report_json(tmp_path, monkeypatch):
    """A skip decided by the memory-budget sampler reaches report.json beside validation's."""
    import numpy as np

    from asrfit.data.sampler import MemoryBudgetSampler
    from asrfit.recipes.run import train_asr

    assign = MemoryBudgetSampler._assign

    def longest_over_budget(self, seconds):
        ids, members, skipped = assign(self, seconds)
        i = int(np.argmax(seconds))
        members[ids[i]] = members[ids[i]][members[ids[i]] != i]
        ids[i] = -1
        return ids, members, {**skipped, "over the memory budget on its own": 1}

    monkeypatch.setattr(MemoryBudgetSampler, "_assign", longest_over_budget)
    manifest = _hostile_run(tmp_path, with_long_file=False)
    cfg = _tiny_run(tmp_path, manifest)
    train_asr(cfg)
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["skipped"] == {
        "replaced_non_finite_audio": 1,
        "not_batched: over the memory budget on its own": 1,
    }
    assert saved["skipped_total"] == 2


@pytest.mark.slow  # one epoch over five minutes of audio
def test_train_end_to_end_with_a_five_minute_file(tmp_path, caplog):
    """The whole `asrfit train` on it, one epoch: the reason is logged, buckets stay <= 30 s."""
    import logging

    from asrfit.recipes.run import train_asr

    manifest = _hostile_run(tmp_path, with_long_file=True)
    caplog.set_level(logging.INFO)
    cfg = _tiny_run(tmp_path, manifest)
    train_asr(cfg)
    assert "1 utterance(s) up to 300.0 s are above max(30 s" in caplog.text
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert max(b["max_seconds"] for b in plan["buckets"]) <= 30.0
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["skipped"] == {"replaced_non_finite_audio": 1}


def test_cli_stops_above_the_skip_threshold_and_names_the_listing(tmp_path):
    from click.testing import CliRunner

    from asrfit.cli.main import cli

    case = hostile_corpus(tmp_path, "bad_header", num_good=12)
    result = CliRunner().invoke(
        cli,
        [
            "train",
            "--model",
            "conformer-ctc-tiny",
            "--data",
            str(case.manifest),
            "--out",
            str(tmp_path / "run"),
            "--random-init",
        ],
    )
    assert result.exit_code == 1
    assert "1 of 13 utterances (7.7%)" in result.output and "unreadable_audio: 1" in result.output
    assert "--max-skipped" in result.output
    (entry,) = [
        json.loads(x) for x in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()
    ]
    assert entry["reason"] == "unreadable_audio" and f"line {case.hostile_line} " in entry["where"]


def test_planner_applies_the_long_audio_rule_to_a_bogus_duration(tmp_path):
    """`asrfit plan` on a manifest claiming 1e9 s: a plan with buckets up to 30 s, not a 200 GB step.
    The rule is the data's, whatever the model: a model of TINY's size plans in a fraction of the
    time of conformer-ctc-tiny."""
    from asrfit.models.conformer.config import conformer_config
    from asrfit.plan.search import plan as make_plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    case = hostile_corpus(tmp_path, "huge_duration", num_good=30)
    result = make_plan(
        HardwareProfile.resolve("L4"),
        DatasetProfile.from_manifest(case.manifest),
        conformer_config(TINY["d_model"], **{k: v for k, v in TINY.items() if k != "d_model"}),
        target_effective_batch=8,
    )
    assert result.data.max_seconds == 30.0 and max(b.max_seconds for b in result.buckets) <= 30.0
    assert result.data.long_utterances == "chunk"
