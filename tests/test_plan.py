"""The planner: limits fit and are maximal, agree with fresh simulations, accumulation by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from transformers import Wav2Vec2Config

from asrfit.memory.cuda.allocator import (
    EXPANDABLE_PAGES_BOUND_BYTES,
    MID_SEGMENT_BYTES,
    predict_cuda,
)
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.plan.effective_batch import accumulation as _accumulation
from asrfit.plan.plan import Bucket, Plan
from asrfit.plan.search import PlanError, plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.testing import make_bucket, write_manifest

MIB = 2**20


def _tiny_config() -> Wav2Vec2Config:
    cfg = Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32),
        conv_stride=(5, 4),
        conv_kernel=(10, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=30,
        feat_extract_norm="layer",
        layerdrop=0.0,
    )
    cfg.architectures = ["Wav2Vec2ForCTC"]
    return cfg


def _wide_config() -> Wav2Vec2Config:
    """0.4 B parameters in two layers: states (and an AdamW update's temporaries) that
    outweigh ZeRO's own 1.1 GiB of buckets and the activations of short batches."""
    cfg = _tiny_config()
    cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads = 4096, 16384, 32
    return cfg


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("ASRFIT_CACHE_DIR", str(tmp_path_factory.mktemp("simcache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DatasetProfile:
    folder = tmp_path_factory.mktemp("data")
    durations = [1.0 + 0.25 * i for i in range(40)]  # 1 .. 10.75 s
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": d, "text": "ab " * int(4 * d)}
        for i, d in enumerate(durations)
    ]
    return DatasetProfile.from_manifest(write_manifest(folder / "train.jsonl", rows))


def _hardware(monkeypatch: pytest.MonkeyPatch, usable_bytes: int) -> HardwareProfile:
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: usable_bytes))
    return HardwareProfile.from_name("L4")


def test_bucket_limits_fit_and_are_maximal(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    usable = 1200 * MIB
    p = plan(_hardware(monkeypatch, usable), dataset, _tiny_config(), target_hours=10.0)
    assert p.buckets[-1].max_seconds == pytest.approx(10.75)
    for b in p.buckets:
        reserved = p.predicted_reserved_bytes(b.batch_size, b.max_input_length, b.max_label_length)
        assert reserved == b.predicted_peak_bytes <= usable
        assert (
            p.predicted_reserved_bytes(b.batch_size + 1, b.max_input_length, b.max_label_length)
            > usable
        )
    # Short buckets take larger batches than long ones.
    assert p.buckets[0].batch_size > p.buckets[-1].batch_size
    assert sum(b.utterance_fraction for b in p.buckets) == pytest.approx(1.0)


def test_longest_bucket_agrees_with_a_fresh_two_step_simulation(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    """Independent of the fit: trace the longest bucket at its limit with the full two-step simulator."""
    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config(), target_hours=10.0)
    last = p.buckets[-1]
    step = simulate_step(
        hf_adapter(_tiny_config()),
        BatchShape(last.batch_size, last.max_input_length, last.max_label_length),
        p.setup,
    )

    def reserved(extra_bytes: int) -> int:
        return predict_cuda(
            step.peak_bytes,
            step.segment_bytes(p.expandable_segments) + extra_bytes,
            architecture=p.architecture,
            expandable_segments=p.expandable_segments,
        ).reserved_bytes

    # The published bound: the planner's figure within 0.14 % of the fresh one
    # (docs/history.md, "Bucket limits against fresh full simulations"). With expandable
    # segments the planner adds the pages' bound where the fresh figure has the pages this
    # trace fills, so its figure may also be up to that bound above (the same section).
    pages = EXPANDABLE_PAGES_BOUND_BYTES if p.expandable_segments else 0
    fresh, highest = reserved(0), reserved(pages)
    assert fresh * (1 - 0.0014) <= last.predicted_peak_bytes <= highest * (1 + 0.0014)


@pytest.mark.parametrize("expandable", [True, False], ids=["expandable", "classic"])
def test_memory_limited_bucket_limits_hold_under_fresh_full_simulations(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile, expandable: bool
) -> None:
    """Independent of the fit (issue 12): each bucket the budget limits is traced again with
    the full two-step simulator at its limit and one above; the reserved figure a fresh
    simulation gives (segments included) fits at the limit and not one above.

    With expandable segments the planner adds the pages' bound (less than 22 MiB), which no
    trace can place between traced shapes, so the check one above allows for it: one above,
    with the bound added, does not fit. With classic segments the blocks of 1-10 MiB share
    20 MiB segments, a step in the batch that the fit of the traced peaks smooths, so one
    above is checked with one such segment added. At this budget (1.2 GB, the bound 1.8 % of
    it) the limit can be one short of what fits where the pages or segments fall well."""
    usable = 1200 * MIB
    hardware = _hardware(monkeypatch, usable)
    p = plan(hardware, dataset, _tiny_config(), target_hours=10.0, expandable_segments=expandable)
    assert p.expandable_segments is expandable
    adapter = hf_adapter(_tiny_config())

    def fresh(b: Bucket, batch: int, pages: int = 0) -> int:
        step = simulate_step(
            adapter, BatchShape(batch, b.max_input_length, b.max_label_length), p.setup
        )
        return predict_cuda(
            step.peak_bytes,
            step.segment_bytes(expandable) + pages,
            architecture=p.architecture,
            expandable_segments=expandable,
        ).reserved_bytes

    checked = [p.buckets[0], p.buckets[len(p.buckets) // 2], p.buckets[-1]]
    pages = EXPANDABLE_PAGES_BOUND_BYTES if expandable else MID_SEGMENT_BYTES
    for b in checked:
        assert fresh(b, b.batch_size) <= usable < fresh(b, b.batch_size + 1, pages), b


def test_budget_below_model_states_names_what_was_tried(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    with pytest.raises(PlanError) as info:
        plan(_hardware(monkeypatch, 1 * MIB), dataset, _tiny_config())
    message = str(info.value)
    assert "Tried:" in message and "adamw8bit" in message and "zero3+offload" in message
    assert "zero3+offload+offload-params" in message
    # what it advises is what it did not try: not the 8-bit optimizer or any offload
    advice = message.split("Not tried, and not checked: ")[1].split("\n")[0]
    assert "more GPUs" in advice and "offload" not in advice
    assert "8-bit" not in advice and "shorter --max-seconds" not in advice


def test_parameters_offloaded_last_where_optimizer_offload_does_not_fit(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    """ZeRO-3 with the parameters on the CPU too is planned where nothing else fits (0.4 B
    parameters in two layers: ZeRO's own buckets, 1.1 GiB, outweighed by the states)."""
    cfg = _wide_config()
    with pytest.raises(PlanError) as info:
        plan(_hardware(monkeypatch, 1 * MIB), dataset, cfg)
    needs = {
        label: float(gib)
        for label, gib in re.findall(r"\n  (.+?): needs ([\d.]+) GiB", str(info.value))
    }
    params_off = [v for k, v in needs.items() if "+offload-params" in k]
    others = [v for k, v in needs.items() if "+offload-params" not in k]
    assert params_off and others and min(params_off) < min(others) - 0.1
    usable = round((min(others) - 0.05) * 2**30)
    p = plan(_hardware(monkeypatch, usable), dataset, cfg)
    assert p.setup.zero_stage == 3 and p.setup.offload_params and p.setup.offload_optimizer
    assert all(b.predicted_peak_bytes <= usable for b in p.buckets)
    # tried before, and too big: the optimizer state alone offloaded
    assert any("+ckpt adamw zero3+offloadx1" in line for line in p.rejected)
    # an offloaded state steps on the host, where bitsandbytes' 8-bit kernels do not run
    assert p.setup.optimizer.value != "adamw8bit"


def test_an_offloaded_optimizer_state_steps_on_the_host() -> None:
    """With the state offloaded (DeepSpeed's CPU optimizer), the traced update's temporaries
    and kernels are not the GPU's: its memory needs no longer depend on the optimizer, nor
    does its step time count the optimizer's GPU kernels (0.4 B parameters in two layers, whose
    AdamW update's temporaries outweigh the activations at these shapes)."""
    import torch

    from asrfit.memory.cache import model_key
    from asrfit.memory.setup import OptimizerKind
    from asrfit.plan.costs import CostEstimator
    from asrfit.plan.speed import step_time_fit
    from asrfit.profiles.host import device_rates

    cfg = _wide_config()
    adapter = hf_adapter(cfg)
    with torch.device("meta"):
        trainable = sum(p.numel() for p in adapter.build().parameters() if p.requires_grad)
    estimator = CostEstimator(adapter, model_key(adapter.name + repr(cfg)), trainable, 1600)
    rates = device_rates(HardwareProfile.from_name("L4"))

    def costs(optimizer: OptimizerKind, offload: bool):
        setup = Setup(
            precision="bf16", optimizer=optimizer, zero_stage=2, offload_optimizer=offload
        )
        return estimator.costs(setup, 160_000, 15.0 / 16_000, "ada")

    adamw, adafactor = costs(OptimizerKind.ADAMW, False), costs(OptimizerKind.ADAFACTOR, False)
    assert adamw.optimizer_peak_bytes > 0 and step_time_fit(adamw, rates).optimizer_seconds > 0
    shapes = [(1, 16_000, 15), (4, 80_000, 75), (2, 160_000, 150)]
    assert any(adamw.reserved_bytes(*s) > adafactor.reserved_bytes(*s) for s in shapes)
    off_adamw, off_adafactor = (
        costs(OptimizerKind.ADAMW, True),
        costs(OptimizerKind.ADAFACTOR, True),
    )
    for off in (off_adamw, off_adafactor):
        assert off.optimizer_peak_bytes == 0 and off.optimizer_cost is None
        assert step_time_fit(off, rates).optimizer_seconds == 0
    for s in shapes:
        assert off_adamw.reserved_bytes(*s) == off_adafactor.reserved_bytes(*s)
        assert off_adamw.reserved_bytes(*s) < adamw.reserved_bytes(*s)


def test_asrfit_memory_counts_an_offloaded_optimizer_on_the_host() -> None:
    """``asrfit memory`` (:func:`asrfit.memory.report.simulate`) as the planner: with the state
    offloaded, the GPU's figure does not depend on the optimizer."""
    from asrfit.memory.report import simulate

    cfg = _wide_config()

    def reserved(optimizer: str, offload: bool) -> int:
        setup = Setup(
            precision="bf16", optimizer=optimizer, zero_stage=2, offload_optimizer=offload
        )
        return simulate(cfg, batch_size=1, seconds=1.0, setup=setup, gpu="L4").cuda.reserved_bytes

    assert reserved("adamw", False) > reserved("adafactor", False)
    assert reserved("adamw", True) == reserved("adafactor", True) < reserved("adafactor", False)


def test_accumulation_by_hand() -> None:
    # Half the utterances in batches of 8, half in batches of 4: 0.5/8 + 0.5/4 = 0.1875 batches
    # per utterance, 16/3 utterances per micro-batch; 32 utterances per step -> 6 micro-batches.
    buckets = [
        make_bucket(0.0, 2.0, 8, utterance_fraction=0.5),
        make_bucket(2.0, 4.0, 4, utterance_fraction=0.5),
    ]
    accum, utts, hours, warnings = _accumulation(
        buckets, world=1, target_utts=32, target_hours=None
    )
    assert accum == 6
    assert utts == pytest.approx(32.0)
    assert hours == pytest.approx(32.0 * (0.5 * 1.0 + 0.5 * 3.0) / 3600)
    assert warnings == []
    accum, utts, _, warnings = _accumulation(buckets, world=4, target_utts=2, target_hours=None)
    assert accum == 1 and "best reachable: 4" in warnings[0]


def test_plan_round_trips_and_exports(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile, tmp_path: Path
) -> None:
    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config())
    path = p.save(tmp_path / "plan.json")
    assert Plan.load(path) == p
    data = json.loads(path.read_text())
    data["surprise"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="surprise"):
        Plan.load(path)
    # target 32 utterances: no bucket takes more than 32 on one GPU
    assert max(b.batch_size for b in p.buckets) <= 32


def test_cli_rejects_unknown_export_before_writing(tmp_path: Path) -> None:
    from asrfit.cli.main import cli

    manifest = write_manifest(
        tmp_path / "m.jsonl", [{"audio_filepath": "a.wav", "duration": 1.0, "text": "a"}]
    )
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--model",
            "wav2vec2-base",
            "--data",
            str(manifest),
            "--gpu",
            "H100-80GB",
            "--export",
            "bogus",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code != 0
    assert "deepspeed" in result.output and "lightning" in result.output
    assert not out.exists()


def test_setup_is_searched(monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile) -> None:
    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config())
    assert p.setup.precision.value == "bf16"  # L4 supports bf16
    assert isinstance(p.setup, Setup)
    assert p.alternatives  # other setups that fit are listed


def test_effective_batch_far_from_the_target_says_why() -> None:
    # Half the utterances in batches of 32, half in batches of 16: 0.5/32 + 0.5/16 = 3/64
    # micro-batches per utterance, 64/3 = 21.3 utterances per micro-batch; 32 asked for ->
    # round(1.5) = 2 micro-batches = 42.7 utterances, 33 % off: the plan must say why.
    buckets = [
        make_bucket(0.0, 2.0, 32, utterance_fraction=0.5),
        make_bucket(2.0, 4.0, 16, utterance_fraction=0.5),
    ]
    accum, utts, _, warnings = _accumulation(buckets, world=1, target_utts=32, target_hours=None)
    assert accum == 2 and utts == pytest.approx(128 / 3)
    assert len(warnings) == 1
    assert "averages 42.7 utterances, not the 32 asked for" in warnings[0]
    assert "longest bucket fits only 16 per micro-batch" in warnings[0]
    assert "21.3 with 1, 42.7 with 2, 64.0 with 3 micro-batches" in warnings[0]


def test_plan_in_words(monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile) -> None:
    from asrfit.plan.explain import explain_plan

    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config())
    rows = explain_plan(p)
    headings = [h for h, _ in rows]
    assert headings[:3] == ["Fits", "Chosen", "Batches"] and "Epoch" in headings
    text = dict(rows)
    first, last = p.buckets[0], p.buckets[-1]
    assert first.batch_size > last.batch_size  # 1200 MiB: memory limits the long buckets
    assert f"down to {last.batch_size} of up to {last.max_seconds:.1f} s" in text["Fits"]
    assert "the L4 (compute capability 8.9) computes in bf16" in text["Chosen"]
    assert p.setup.describe() in text["Chosen"]
    # every setup tried and not fitting, or fitting but slower, is named with its reason
    rejected = [s for h, s in rows if h == "Rejected"]
    assert all("fits, but slower or no faster" in s or "GiB usable" in s for s in rejected)
    assert len(rejected) == min(4, len(p.rejected)) + (len(p.rejected) > 4) + min(
        3, len(p.alternatives)
    )
    assert "fit residual" not in p.rests_on[0] and "MiB above any" in p.rests_on[0]


def test_plan_in_words_names_what_sets_a_limit_every_bucket_shares(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    """One batch in every bucket is the target's share only when it is that share: a model that
    pads every utterance alike (Whisper, 30 s) hits the same memory limit in every bucket."""
    from dataclasses import replace

    from asrfit.plan.explain import explain_plan

    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config())
    assert p.target_effective_batch == "32 utterances" and p.batch_cap == 32

    def fits(batch: int, **changes: Any) -> str:
        alike = [replace(b, batch_size=batch) for b in p.buckets]
        return dict(explain_plan(replace(p, buckets=alike, **changes)))["Fits"]

    assert "(the target batch, not memory, is the limit)" in fits(32)
    assert f"in all {len(p.buckets)} duration buckets" in fits(32)
    one = [replace(p.buckets[-1], batch_size=32, min_seconds=0.0, utterance_fraction=1.0)]
    assert (
        "32 utterances per micro-batch in its one duration bucket"
        in dict(explain_plan(replace(p, buckets=one)))["Fits"]
    )
    assert "(memory is the limit in every bucket alike)" in fits(8)
    # the target's share per process: 32 over 4 GPUs caps each at 8
    four = replace(p.setup, world_size=4)
    assert replace(p, setup=four).batch_cap == 8
    assert "(the target batch, not memory, is the limit)" in fits(8, setup=four)
    # a target in hours caps no batch
    assert replace(p, target_effective_batch="0.5 hours").batch_cap is None
    assert "(memory is the limit in every bucket alike)" in fits(
        32, target_effective_batch="0.5 hours"
    )


def test_cpu_plans_never_choose_8bit_adamw(monkeypatch):
    """bitsandbytes' 8-bit AdamW runs its state updates on CUDA: a CPU plan must not pick it."""
    from asrfit.memory.setup import OptimizerKind
    from asrfit.plan.search import candidate_setups
    from asrfit.profiles.hardware import HardwareProfile

    monkeypatch.setattr("asrfit.profiles.hardware.detect_devices", lambda: [])
    cpu = HardwareProfile.detect()
    assert cpu.source == "cpu-only"
    optimizers = {s.optimizer for s in candidate_setups(cpu, None, 1, True, False)}
    assert OptimizerKind.ADAMW_8BIT not in optimizers and OptimizerKind.ADAMW in optimizers
    t4 = HardwareProfile.resolve("T4")  # planning for a GPU elsewhere keeps it as a choice
    assert OptimizerKind.ADAMW_8BIT in {
        s.optimizer for s in candidate_setups(t4, None, 1, True, False)
    }


def test_plan_names_the_utterances_train_will_skip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    durations = [1.0 + 0.25 * i for i in range(40)]
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": d, "text": "ab " * int(4 * d)}
        for i, d in enumerate(durations)
    ]
    rows.insert(7, {"audio_filepath": "clip.wav", "duration": 0.01, "text": "a"})  # utterance 8
    rows.append({"audio_filepath": "talk.wav", "duration": 2.0, "text": "abc " * 23250})  # 42
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "train.jsonl", rows))
    assert (dataset.short_utterance_count, dataset.short_utterance_first) == (1, 8)
    assert dataset.chars_per_second_max == pytest.approx(93000 / 2.0)
    assert dataset.chars_per_second_max_utterance == 42
    p = plan(_hardware(monkeypatch, 1200 * MIB), dataset, _tiny_config(), target_hours=10.0)
    short = [w for w in p.warnings if "too_short" in w]
    dense = [w for w in p.warnings if "too_long_for_ctc" in w]
    assert len(short) == 1 and "utterance 8" in short[0] and "0.1 s" in short[0]
    # wav2vec2 with two strided convs (5 x 4) on 16 kHz audio: 800 encoder frames per second.
    assert len(dense) == 1 and "utterance 42" in dense[0] and "46,500" in dense[0]
    assert "800 encoder frames" in dense[0]


@pytest.mark.parametrize("seconds", [31.0, 45.0, 59.99, 60.0, 61.0, 95.0, 300.0])
def test_chunk_lengths_are_the_chunkers(seconds: float) -> None:
    # reference: asrfit.data.audio.chunk_bounds on real (noise) audio at 16 kHz
    from asrfit.data.audio import chunk_bounds
    from asrfit.plan.long_audio import chunk_seconds

    rate, limit = 16000, 30.0
    audio = np.random.default_rng(0).standard_normal(round(seconds * rate)).astype(np.float32)
    spans = chunk_bounds(audio, rate, limit)
    pieces = chunk_seconds(seconds, limit)
    assert len(pieces) == len(spans)
    # each real piece (its cuts moved to quiet points) fits the planned length, by at most
    # the two cuts' moves (0.5 s each)
    assert all(0 <= p - (e - s) / rate <= 2.0 for (s, e), p in zip(spans, pieces, strict=True))
    assert max(pieces) <= limit


def test_chunked_sample_lists_each_piece_and_thins_an_absurd_one_in_proportion() -> None:
    from asrfit.plan.long_audio import (
        MAX_CHUNKED_SAMPLE,
        chunk_pieces,
        chunk_seconds,
        chunked_sample,
    )

    limit = 30.0
    durations = np.array([3.0, 45.0, 95.0, 12.0])
    labels = np.array([40.0, 700.0, 1500.0, 200.0])
    got, got_labels = chunked_sample(durations, labels, limit)
    # reference: every piece of every utterance listed, labels shared by its real piece count
    want = [p for d in durations for p in chunk_seconds(float(d), limit)]
    want_labels = [
        -(-lab // len(chunk_seconds(float(d), limit)))
        for d, lab in zip(durations, labels, strict=True)
        for _ in chunk_seconds(float(d), limit)
    ]
    assert got.tolist() == want and got_labels.tolist() == want_labels
    # a bogus 1e9 s line among 1000 clips of 10 s: 33 M pieces scaled to MAX_CHUNKED_SAMPLE,
    # each utterance's count rounded (half a piece at most), so the clips' share is kept
    bogus = np.array([*[10.0] * 1000, 1e9])
    thin, _ = chunked_sample(bogus, None, limit)
    full = 1000 + chunk_pieces(1e9, limit)[1]  # pieces in all
    assert abs(thin.size - MAX_CHUNKED_SAMPLE) <= 0.5 * 1001
    assert abs((thin == 10.0).mean() - 1000 / full) <= 0.5 * 1000 / thin.size


def test_chunked_long_audio_gets_a_bucket_and_outlier_label_rates_are_left_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # 20 short clips, one 60 s talk (chunked at the 30 s floor of the long-audio rule) and a
    # 0.1 s clip with a long transcript (more labels than encoder frames: training skips it);
    # planned for this CPU as `asrfit plan --gpu auto` does here (the case that lost the talk)
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": 2.2 + 0.08 * i, "text": "hello world"}
        for i in range(20)
    ]
    rows.append({"audio_filepath": "talk.wav", "duration": 60.0, "text": "hello world " * 20})
    rows.append({"audio_filepath": "clip.wav", "duration": 0.1, "text": "abc " * 40})
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "train.jsonl", rows))
    monkeypatch.setattr("asrfit.profiles.hardware.detect_devices", lambda: [])
    p = plan(HardwareProfile.detect(), dataset, "conformer-ctc-tiny", target_effective_batch=4)
    assert p.data.max_seconds == 30.0
    # the talk's pieces, as the real chunker cuts them (noise audio), fit the longest bucket:
    # the sampler batches every one of them
    from asrfit.data.audio import chunk_bounds
    from asrfit.data.sampler import MemoryBudgetSampler

    talk = np.random.default_rng(0).standard_normal(60 * 16000).astype(np.float32)
    pieces = [(e - s) / 16000 for s, e in chunk_bounds(talk, 16000, p.data.max_seconds)]
    sampler = MemoryBudgetSampler([2.0, *pieces], p)
    assert sorted(i for batch in sampler for i in batch) == list(range(1 + len(pieces)))
    # labels per second from the clips CTC can align (the 0.1 s clip's 1,600/s left out)
    assert p.buckets[-1].max_label_length <= 30.0 * 25  # the Conformer's 25 frames/s
