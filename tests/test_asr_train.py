"""End to end on a tiny demo corpus: plan, train in stages, score, save, load, resume."""

from __future__ import annotations

import json

import pytest
import torch

from asrfit.recipes.demo import write_demo_corpus
from asrfit.recipes.run import RunConfig, train_asr

TINY = {"d_model": 48, "encoder_layers": 2, "encoder_attention_heads": 2, "conv_kernel_size": 7}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    write_demo_corpus(out, num_train=64, num_dev=12, num_test=12, max_seconds=3.0, seed=1)
    return out


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    cfg = RunConfig(
        model="conformer-ctc-small",
        train=str(corpus / "train.jsonl"),
        dev=str(corpus / "dev.jsonl"),
        test=str(corpus / "test.jsonl"),
        out_dir=str(tmp_path_factory.mktemp("run")),
        target_batch=8,
        epochs=6,
        learning_rate=3e-3,
        stages=[0.5, 1.0],
        random_init=True,
        model_overrides=TINY,
        spec_augment=False,
    )
    return cfg, train_asr(cfg)


@pytest.mark.slow
def test_loss_falls_and_cer_improves(run) -> None:
    _, report = run
    stage2 = [e for e in report.epochs if e.stage == 2]
    assert [e.stage for e in report.epochs] == [1] * 6 + [2] * 6
    first, last = report.epochs[0], report.epochs[-1]
    assert last.train_loss < 0.7 * first.train_loss
    assert min(e.dev.cer for e in stage2) < first.dev.cer - 0.05
    assert report.best_dev_cer == min(e.dev.cer for e in report.epochs)
    # the test split is scored once with the best dev model, on utterances drawn like dev's:
    # its CER is near the best dev CER (0.23 and 0.22 when written) and far below the first
    # epoch's (1.0: nothing learnt yet); a model that does not learn, or a test scored with
    # other weights, fails here
    assert report.test is not None
    assert report.test.cer < 0.5 * first.dev.cer
    assert abs(report.test.cer - report.best_dev_cer) < 0.1


@pytest.mark.slow
def test_stage_two_starts_from_stage_one(run) -> None:
    cfg, report = run
    stage1 = [e for e in report.epochs if e.stage == 1]
    stage2 = [e for e in report.epochs if e.stage == 2]
    # stage 2 sees twice the data with the weights stage 1 ended with: its first loss is
    # far below stage 1's first (random weights)
    assert stage2[0].train_loss < stage1[0].train_loss * 0.8
    assert stage2[-1].steps > stage1[-1].steps  # twice the data per epoch
    assert (
        len(list((__import__("pathlib").Path(cfg.out_dir) / "stage1" / "checkpoints").glob("*.pt")))
        >= 1
    )


@pytest.mark.slow
def test_saved_model_loads_and_predicts_identically(run) -> None:
    from transformers import AutoModelForCTC, AutoTokenizer

    from asrfit.data.dataset import SpeechDataset, utterances_from
    from asrfit.data.features import Frontend, LogMel
    from asrfit.data.text import CharVocabulary
    from asrfit.recipes.evaluate import transcribe

    cfg, report = run
    best = report.best_dir
    model = AutoModelForCTC.from_pretrained(best)
    vocab = CharVocabulary.load(best)
    assert AutoTokenizer.from_pretrained(best).get_vocab() == {
        t: i for i, t in enumerate(vocab.tokens)
    }
    pre = json.loads((__import__("pathlib").Path(best) / "preprocessor_config.json").read_text())
    frontend = Frontend("asrfit_conformer", LogMel(n_mels=pre["feature_size"]))
    test = SpeechDataset(utterances_from(cfg.test), vocab, frontend, keep_unknown=True)
    frames = model.output_lengths if hasattr(model, "output_lengths") else None
    assert frames is not None

    def out_frames(n: int) -> int:
        return int(model.output_lengths(torch.tensor([n]))[0])

    first, _ = transcribe(model, test, out_frames)
    model.save_pretrained(cfg.out_dir + "/copy")
    again, _ = transcribe(AutoModelForCTC.from_pretrained(cfg.out_dir + "/copy"), test, out_frames)
    assert first == again
    from asrfit.recipes.evaluate import error_rates

    assert error_rates(test.texts, first)[1] == pytest.approx(report.test.cer)


@pytest.mark.slow
def test_resume_continues_the_last_stage(run) -> None:
    cfg, report = run
    more = RunConfig.from_dict({**cfg.to_dict(), "epochs": 7, "resume": True, "test": None})
    resumed = train_asr(more)
    # the report keeps the 12 epochs already scored (run_state.json), then one more per stage:
    # stage 1 had finished (6 of 7 epochs are not redone: it continues for one more epoch)
    assert [(e.stage, e.epoch) for e in resumed.epochs[:12]] == [
        (e.stage, e.epoch) for e in report.epochs
    ]
    new = resumed.epochs[12:]
    assert [(e.stage, e.epoch) for e in new] == [(1, 7), (2, 7)]
    assert new[1].steps > report.epochs[-1].steps


@pytest.mark.slow
def test_resumed_to_train_longer_keeps_its_steps_and_follows_the_longer_schedule(
    corpus, tmp_path
) -> None:
    # reference: a fresh run of the longer length, whose schedule the resumed run must follow
    common = {
        "model": "conformer-ctc-small",
        "train": str(corpus / "train.jsonl"),
        "target_batch": 8,
        "epochs": 10,
        "learning_rate": 3e-3,
        "random_init": True,
        "model_overrides": TINY,
        "spec_augment": False,
        "tensorboard": False,
    }

    def steps(folder) -> list[dict]:
        rows = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
        return [r for r in rows if r["kind"] == "step"]

    train_asr(RunConfig(**common, out_dir=str(tmp_path / "run"), max_steps=6))
    train_asr(RunConfig(**common, out_dir=str(tmp_path / "run"), max_steps=10, resume=True))
    train_asr(RunConfig(**common, out_dir=str(tmp_path / "fresh"), max_steps=10))
    resumed, fresh = steps(tmp_path / "run"), steps(tmp_path / "fresh")
    assert [r["step"] for r in resumed] == list(range(1, 11))  # the first six kept, none twice
    later = [r["learning_rate"] for r in resumed[6:]]
    assert later == pytest.approx([r["learning_rate"] for r in fresh[6:]])  # not the old end's 0
    assert all(rate > 0 for rate in later)
    # the report numbers epochs from 1, and names the one --max-steps cut short as the next
    epochs = json.loads((tmp_path / "fresh" / "report.json").read_text())["epochs"]
    per_epoch = epochs[0]["steps"]
    assert 5 < per_epoch < 10  # 64 utterances in batches of at most 8: one whole epoch, then part
    assert [(e["epoch"], e["steps"]) for e in epochs] == [(1, per_epoch), (2, 10)]
    assert epochs[0]["fraction"] == 1.0
    assert epochs[1]["fraction"] == pytest.approx((10 - per_epoch) / per_epoch)
    table = (tmp_path / "fresh" / "report.md").read_text()
    assert f"| 1 | 2 ({(10 - per_epoch) / per_epoch:.0%} of it) | 10 |" in table


def test_resuming_with_another_model_is_refused_by_name(corpus, tmp_path) -> None:
    from asrfit.errors import ConfigError

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run_config.json").write_text(
        json.dumps({"model": "conformer-ctc-tiny", "model_overrides": {}})
    )
    cfg = RunConfig(
        model="conformer-ctc-small",
        train=str(corpus / "train.jsonl"),
        out_dir=str(folder),
        resume=True,
        random_init=True,
    )
    with pytest.raises(
        ConfigError, match=r"trained with --model 'conformer-ctc-tiny'.*'conformer-ctc-small'"
    ):
        train_asr(cfg)
    same = RunConfig.from_dict(
        {**cfg.to_dict(), "model": "conformer-ctc-tiny", "model_overrides": {"d_model": 48}}
    )
    with pytest.raises(ConfigError, match=r"--set \{\}.*'d_model': 48"):
        train_asr(same)


@pytest.mark.slow
def test_a_plan_of_the_manifest_as_given_trains_its_long_audio(corpus, tmp_path) -> None:
    # `asrfit plan` profiles the manifest as given (a 61 s talk among 3 s clips); the run
    # validates and chunks it (train.clean.jsonl): the plan is still the one for this data,
    # and its buckets hold the talk's pieces, so nothing is dropped
    import numpy as np
    import soundfile as sf

    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    for row in rows:
        row["audio_filepath"] = str(corpus / row["audio_filepath"])
    talk = tmp_path / "talk.wav"
    sf.write(talk, 0.01 * np.random.default_rng(0).standard_normal(61 * 16000), 16000)
    rows.append({"audio_filepath": str(talk), "duration": 61.0, "text": rows[0]["text"] * 10})
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hardware = HardwareProfile.resolve("auto")
    saved = plan(
        hardware,
        DatasetProfile.from_source(str(manifest)),
        "conformer-ctc-tiny",
        target_effective_batch=8,
    ).save(tmp_path / "plan.json")
    report = train_asr(
        RunConfig(
            model="conformer-ctc-tiny",
            train=str(manifest),
            out_dir=str(tmp_path / "run"),
            plan=str(saved),
            target_batch=8,
            max_steps=2,
            random_init=True,
            tensorboard=False,
            gpu="auto",
        )
    )
    assert not any("not_batched" in reason for reason in report.skipped), report.skipped


@pytest.mark.slow
def test_utterances_the_plan_cannot_batch_are_listed_and_counted(corpus, tmp_path) -> None:
    # a plan whose buckets end at 3 s but which chunks only above 20 s (as CLI plans of long
    # audio were before their chunks got buckets), forced onto data with a 10 s clip: the
    # sampler cannot batch it, so it is a skip like any other (skipped.jsonl, --max-skipped)
    import numpy as np
    import soundfile as sf

    from asrfit.errors import ConfigError
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    short = tmp_path / "short.jsonl"
    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    for row in rows:
        row["audio_filepath"] = str(corpus / row["audio_filepath"])
    short.write_text("".join(json.dumps(r) + "\n" for r in rows))
    saved = plan(
        HardwareProfile.resolve("auto"),
        DatasetProfile.from_source(str(short)),
        "conformer-ctc-tiny",
        target_effective_batch=8,
    ).save(tmp_path / "plan.json")
    edited = json.loads(saved.read_text())
    edited["data"]["max_seconds"] = 20.0
    saved.write_text(json.dumps(edited))
    clip = tmp_path / "long.wav"
    sf.write(clip, 0.01 * np.random.default_rng(0).standard_normal(10 * 16000), 16000)
    rows.append({"audio_filepath": str(clip), "duration": 10.0, "text": rows[0]["text"]})
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = {
        "model": "conformer-ctc-tiny",
        "train": str(manifest),
        "plan": str(saved),
        "force_plan": True,
        "target_batch": 8,
        "max_steps": 1,
        "random_init": True,
        "tensorboard": False,
        "gpu": "auto",
    }
    report = train_asr(RunConfig(**common, out_dir=str(tmp_path / "run")))
    key = "not_batched: longer than the largest bucket"
    assert [v for k, v in report.skipped.items() if k.startswith(key)] == [1]
    listed = [
        json.loads(line) for line in (tmp_path / "run" / "skipped.jsonl").read_text().splitlines()
    ]
    assert [e["reason"][: len(key)] for e in listed] == [key]
    with pytest.raises(ConfigError, match=key):
        train_asr(RunConfig(**common, out_dir=str(tmp_path / "strict"), max_skipped=0.01))
