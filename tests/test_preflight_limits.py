"""The pre-flight measures real passes on the CPU and lowers limits a low prediction set too high."""

from __future__ import annotations

import pytest
import torch
from _frames import frame_units
from torch import nn

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.profiles.calibration import (
    Calibration,
    machine_key,
    read_calibration,
    write_calibration,
)
from asrfit.testing import plans
from asrfit.train.checkpoint import latest_checkpoint
from asrfit.train.config import TrainingConfig
from asrfit.train.held_memory import held_bytes
from asrfit.train.preflight import PreflightResult
from asrfit.train.preflight_limits import lowered_limits, step_time_notes
from asrfit.train.trainer import MemoryEfficientTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
HIDDEN = 4096
FRAMES_PER_SECOND = 25  # the plan's input rate: a 4 s utterance is 100 frames
HEADROOM = 16 * 2**20


def test_held_bytes_counts_the_allocator_bytes_of_a_closed_form_pass():
    def allocate():
        a = torch.empty(250_000)  # 1,000,000 bytes
        b = torch.empty(500_000)  # 2,000,000 bytes: 3,000,000 live here
        del a
        c = torch.empty(100_000)  # 2,400,000 live
        return b.numel() + c.numel()

    out, held = held_bytes(allocate, CPU)
    assert out == 600_000
    assert held == 3_000_000
    _, nothing = held_bytes(lambda: None, CPU)
    assert nothing == 0


class WideFrames(nn.Module):
    """``(B, T, 4)`` frames to ``(B, T, 3)`` logits through ``HIDDEN`` units (real activations)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, HIDDEN)
        self.head = nn.Linear(HIDDEN, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.proj(x)))


class SizeRecorder:
    """A summed per-frame loss that records the size of every micro-batch it runs."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, model, batch):
        self.shapes.append(tuple(batch["x"].shape[:2]))
        logits = model(batch["x"])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, 3), batch["labels"].reshape(-1), ignore_index=-100, reduction="sum"
        )
        return loss, frame_units(batch)


class Frames(torch.utils.data.Dataset):
    """A map-style dataset over a list of samples (the trainer makes its sampler)."""

    def __init__(self, samples: list[dict]) -> None:
        self.samples = samples

    def __getitem__(self, index: int) -> dict:
        return self.samples[index]

    def __len__(self) -> int:
        return len(self.samples)


def make_data(n: int = 24):
    g = torch.Generator().manual_seed(3)
    durations = [float(1 + (i * 7) % 4) for i in range(n)]  # 1-4 s
    data = []
    for seconds in durations:
        t = round(seconds * FRAMES_PER_SECOND)
        data.append(
            {"x": torch.randn(t, 4, generator=g), "labels": torch.randint(0, 3, (t,), generator=g)}
        )
    return data, durations


def make_plan(headroom_bytes: int, bytes_per_frame: float) -> Plan:
    """A CPU plan of two buckets of limit 8; usable = a full batch's prediction + headroom.

    ``bytes_per_frame`` is the cost model's per-utterance, per-frame activation bytes: 1 byte
    is the deliberately low prediction (the real pass holds kilobytes per frame).
    """
    model = PeakModel(
        c0_bytes=1e6, a_bytes_per_step=bytes_per_frame, b_bytes_per_step2=0.0, c_bytes_per_label=0.0
    )
    plan = plans.make_plan(
        (8, 8),
        bucket_edges_seconds=(0.0, 2.0, 4.0),
        model="wide-frames",
        gpu="cpu-only",
        usable_bytes=1,
        setup=Setup(precision="fp32", optimizer="adamw"),
        gradient_accumulation_steps=2,
        target_effective_batch="16 utterances",
        cost_model=model,
        expandable_segments=False,
        input_frames_per_second=FRAMES_PER_SECOND,
        labels_per_second=FRAMES_PER_SECOND,
    )
    plan.usable_bytes = plan.predicted_reserved_bytes(8, 100, 100) + headroom_bytes
    for b in plan.buckets:
        b.predicted_peak_bytes = plan.predicted_reserved_bytes(8, b.max_input_length, 100)
    return plan


class Crash(Exception):
    pass


class KillAt:
    """A run listener that kills the run when step ``step`` is done (before its checkpoint)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, event) -> None:
        if event.step == self.step:
            raise Crash


def run(
    out_dir,
    *,
    plan,
    seed=0,
    max_steps=6,
    resume_from=None,
    save_every_steps=None,
    loss_fn=None,
    listeners=(),
):
    data, durations = make_data()
    torch.manual_seed(seed)
    trainer = MemoryEfficientTrainer(
        WideFrames(),
        TrainingConfig(gradient_accumulation_steps=2, warmup_steps=1, learning_rate=0.05),
        plan=plan,
        loss_fn=loss_fn or SizeRecorder(),
        units_fn=frame_units,
        out_dir=out_dir,
        progress=False,
        save_every_steps=save_every_steps,
        listeners=listeners,
    )
    trainer.train(
        Frames(data),
        durations=durations,
        label_lengths=[len(s["labels"]) for s in data],
        max_steps=max_steps,
        resume_from=resume_from,
    )
    return trainer


def test_a_real_step_over_a_low_prediction_lowers_limits_then_trains_and_resumes_exactly(
    tmp_path,
):
    # 1 byte per frame predicted, 16 MiB of headroom at a full batch of 4 s (100 frames); the
    # real pass holds tens of kilobytes per frame (the tanh's input and output, gradients)
    plan = make_plan(headroom_bytes=HEADROOM, bytes_per_frame=1.0)
    loss = SizeRecorder()
    full = run(tmp_path / "full", plan=plan, loss_fn=loss)

    (longest,) = [r for r in full.preflight_results if r.bucket == 1]
    assert longest.batch_size == 8 and max(make_data()[1][i] for i in longest.indices) == 4.0
    # what the pass held, against an independent count: at least the tanh input and output
    # of every frame (2 x B x T x HIDDEN float32)
    assert longest.held_bytes >= 2 * 8 * 100 * HIDDEN * 4
    assert longest.excess_bytes > HEADROOM

    # the reference: the largest batch (brute force over 1..8) whose prediction plus the
    # measured excess, per utterance of this full-length batch, fits the usable memory
    def need(n: int) -> float:
        return plan.predicted_reserved_bytes(n, 100, 100) + longest.excess_bytes * n / 8

    want = max([n for n in range(1, 9) if need(n) <= plan.usable_bytes] or [1])
    assert 1 < want < 8
    new = full.plan.buckets[1].batch_size
    assert new == want
    assert full.plan.buckets[0].batch_size == 8  # no pessimistic batch measured it over
    assert plan.buckets[1].batch_size == 8  # the caller's plan is left as it was
    assert full.micro_limits.limits == {1: new}
    assert any(f"its limit goes from 8 to {new}" in note for note in full.preflight_notes)
    assert Plan.load(tmp_path / "full" / "plan.adjusted.json").buckets[1].batch_size == new

    # training went on: every step ran; the sampler kept its batches, those of bucket 1
    # (longer than 2 s, 50 frames) up to 8, and every pass of them after the pre-flight ran
    # at most `new` utterances, within the same optimizer steps
    assert full.global_step == 6
    data, durations = make_data()
    sampler = MemoryBudgetSampler(durations, plan, label_lengths=[len(s["labels"]) for s in data])
    assert full.sampler.state_dict()["limits"] == [8, 8]
    assert max(len(b) for b in sampler if max(durations[i] for i in b) > 2) > new
    trained = loss.shapes[len(full.preflight_results) :]
    assert max(b for b, t in trained if t > 50) <= new
    assert max(b for b, t in trained if t <= 50) > new  # bucket 0 keeps its limit

    # a run killed in step 4 and resumed from its checkpoint of step 3 (fresh weights,
    # trainer and sampler) trains on the same batches and ends with the same weights, bit
    # for bit
    with pytest.raises(Crash):
        run(
            tmp_path / "cut",
            plan=make_plan(HEADROOM, 1.0),
            save_every_steps=3,
            listeners=[KillAt(4)],
        )
    assert latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "checkpoint-00000003.pt"
    resumed = run(tmp_path / "cut", plan=make_plan(HEADROOM, 1.0), seed=123, resume_from="latest")
    assert resumed.preflight_results == []  # no pre-flight on resume: the saved limits hold
    assert resumed.plan.buckets[1].batch_size == new
    assert resumed.micro_limits.limits == full.micro_limits.limits
    assert [r.indices for r in resumed.history] == [r.indices for r in full.history[3:]]
    for a, b in zip(
        resumed.unwrapped_model.parameters(), full.unwrapped_model.parameters(), strict=True
    ):
        assert torch.equal(a, b)


def test_a_prediction_that_covers_the_real_step_lowers_nothing(tmp_path):
    # negative control: 20 kB per frame predicted, far above what the pass holds
    plan = make_plan(headroom_bytes=HEADROOM, bytes_per_frame=200_000.0)
    trainer = run(tmp_path, plan=plan, max_steps=2)
    assert all(r.excess_bytes < 0 for r in trainer.preflight_results)
    assert [b.batch_size for b in trainer.plan.buckets] == [8, 8]
    assert trainer.micro_limits.limits == {}
    assert not (tmp_path / "plan.adjusted.json").exists()


def test_the_calibration_in_use_keeps_the_excess_free_afterwards(tmp_path, monkeypatch):
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    path = write_calibration(
        Calibration(
            key=machine_key("cpu"),
            written="2026-01-01T00:00:00",
            device="cpu",
            rates={},
            unmodelled_peak_bytes=1000,
        )
    )
    trainer = run(tmp_path / "run", plan=make_plan(HEADROOM, 1.0), max_steps=1)
    excess = max(r.excess_bytes for r in trainer.preflight_results)
    after = read_calibration(path)
    assert after.unmodelled_peak_bytes == excess > 1000
    assert after.measurements["preflight"]["unmodelled_peak_bytes_before"] == 1000


def _result(bucket, batch_size, held, predicted_batch, seconds=1.0, predicted_seconds=None):
    return PreflightResult(
        "longest utterance",
        batch_size,
        list(range(batch_size)),
        bucket,
        0,
        None,
        seconds,
        held,
        0,
        predicted_batch,
        predicted_seconds,
    )


def test_lowered_limits_scale_the_excess_with_the_batch():
    plan = make_plan(headroom_bytes=HEADROOM, bytes_per_frame=20_000.0)
    predicted = 8 * 100 * 20_000  # batch-dependent bytes of 8 x 100 frames
    result = _result(1, 8, held=3 * predicted, predicted_batch=predicted)  # measured 3x

    def need(n: int) -> float:  # prediction, and twice as much again: the excess per utterance
        return plan.predicted_reserved_bytes(n, 100, 100) + 2 * predicted * n / 8

    want = max(n for n in range(1, 9) if need(n) <= plan.usable_bytes)
    (low,) = lowered_limits(plan, [result])
    assert (low.bucket, low.old_limit, low.new_limit) == (1, 8, want)
    assert 1 < want < 8
    assert low.excess_bytes == 2 * predicted
    assert low.corrected_bytes <= plan.usable_bytes < low.needed_bytes
    # an excess within the headroom lowers nothing
    assert lowered_limits(plan, [_result(1, 8, predicted + HEADROOM // 2, predicted)]) == []


def test_step_time_notes_name_passes_off_by_more_than_a_quarter():
    near = _result(1, 8, 0, 0, seconds=1.2, predicted_seconds=1.0)
    slow = _result(1, 8, 0, 0, seconds=1.3, predicted_seconds=1.0)
    fast = _result(0, 8, 0, 0, seconds=0.5, predicted_seconds=1.0)
    unknown = _result(0, 8, 0, 0, seconds=9.0, predicted_seconds=None)
    notes = step_time_notes([near, slow, fast, unknown])
    assert len(notes) == 2
    assert "(+30%, over 25%)" in notes[0] and "bucket 1" in notes[0]
    assert "(-50%, over 25%)" in notes[1]


def test_the_run_report_says_what_the_preflight_found():
    from asrfit.recipes.run_report import RunConfig, RunReport

    def report(preflight: list[str]) -> str:
        return RunReport(
            config=RunConfig(model="m", train="t", out_dir="o"),
            model_class="M",
            parameters=1,
            trainable_parameters=1,
            pretrained=False,
            gpu="cpu-only",
            device="cpu",
            plan_summary=[],
            predicted_peak_bytes=0,
            measured_peak_bytes=0,
            measured_peak_kind="rss",
            predicted_audio_seconds_per_second=1.0,
            measured_audio_seconds_per_second=1.0,
            skipped={},
            epochs=[],
            best_dev_cer=None,
            best_dev_wer=None,
            test=None,
            wall_seconds=1.0,
            best_dir="b",
            preflight=preflight,
        ).markdown()

    slow = step_time_notes([_result(1, 8, 0, 0, seconds=2.0, predicted_seconds=1.0)])
    text = report([f"stage 0: {note}" for note in slow])
    assert "## Pre-flight" in text and "took 2.00 s" in text and "(+100%, over 25%)" in text
    assert "## Pre-flight" not in report([])


def test_held_bytes_leaves_a_running_profile_alone():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        out, held = held_bytes(lambda: torch.empty(10).numel(), CPU)
    assert (out, held) == (10, None)
