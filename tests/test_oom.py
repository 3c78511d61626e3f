"""OOM recovery (fake OOMs on CPU, exact sequences of sizes tried) and the pre-flight check."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _frames import FrameModel, frame_loss, frame_units
from torch import nn

from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.testing import plans
from asrfit.train.config import TrainingConfig
from asrfit.train.oom import (
    BatchTooLargeError,
    BucketOOMCounter,
    halves,
    is_oom,
    run_with_recovery,
    split_batch,
)
from asrfit.train.preflight import pessimistic_batches
from asrfit.train.trainer import MemoryEfficientTrainer


def make_plan(limits=(32, 12, 5)) -> Plan:
    """Batch limits over 0-4-10-20 s; the last bucket has the highest predicted peak (the
    pre-flight's "largest bucket at its limit")."""
    return plans.make_plan(
        limits,
        bucket_edges_seconds=(0.0, 4.0, 10.0, 20.0),
        predicted_peak_bytes=(int(12e9), int(12.5e9), int(13e9)),
        setup=Setup(precision="fp32", gradient_checkpointing=False, optimizer="adamw"),
        gradient_accumulation_steps=2,
        target_effective_batch="32 utterances",
        long_utterance_fraction=0.01,
    )


class _OOMInBackward(torch.autograd.Function):
    """Identity whose backward raises a fake OOM for batches larger than ``limit``."""

    @staticmethod
    def forward(ctx, x, limit):
        ctx.limit = limit
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if grad.shape[0] > ctx.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (fake, backward)")
        return grad, None


class BackwardOOMModel(FrameModel):
    limit = 10**9

    def forward(self, x):
        h = _OOMInBackward.apply(torch.tanh(self.proj(x)), self.limit)
        return self.head(h)


class FakeOOMLoss:
    """Wraps a loss: records every batch size it is called with, OOMs above ``limit``."""

    def __init__(self, loss_fn, limit: int) -> None:
        self.loss_fn, self.limit, self.sizes = loss_fn, limit, []

    def __call__(self, model, batch):
        size = batch["x"].shape[0]
        self.sizes.append(size)
        if size > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate (fake, batch {size})"
            )
        return self.loss_fn(model, batch)


def make_dataset(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(2, 9, (1,), generator=g))
        out.append(
            {"x": torch.randn(t, 4, generator=g), "labels": torch.randint(0, 3, (t,), generator=g)}
        )
    return out


def train_once(model, batches, data, loss_fn, **kwargs):
    config = TrainingConfig(
        gradient_accumulation_steps=len(batches), warmup_steps=0, learning_rate=0.05
    )
    trainer = MemoryEfficientTrainer(
        model,
        config,
        loss_fn=loss_fn,
        units_fn=frame_units,
        progress=False,
        preflight=False,
        **kwargs,
    )
    trainer.train(batches, dataset=data, max_steps=1)
    return trainer


def assert_same_parameters(a: nn.Module, b: nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ pure helpers


def test_is_oom():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(torch.cuda.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert not is_oom(RuntimeError("size mismatch"))
    assert not is_oom(ValueError("out of memory"))
    assert not is_oom(BatchTooLargeError("out of memory on a single utterance"))


def test_a_real_cpu_allocation_failure_is_an_oom():
    try:
        torch.empty(2**50, dtype=torch.uint8)  # 1 PiB: the CPU allocator refuses it
    except RuntimeError as exc:
        failure = exc
    else:  # pragma: no cover - no machine has 1 PiB
        pytest.fail("a 1 PiB allocation succeeded")
    assert is_oom(failure), str(failure)


def test_halves_and_split_batch():
    assert halves(8) == (4, 4) and halves(5) == (3, 2) and halves(2) == (1, 1)
    batch = {
        "x": torch.arange(15).reshape(5, 3),
        "text": list("abcde"),
        "scale": torch.tensor(2.0),
        "table": torch.zeros(7, 2),
    }
    first, second = split_batch(batch, (3, 2))
    assert first["x"].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert second["x"].tolist() == [[9, 10, 11], [12, 13, 14]]
    assert first["text"] == ["a", "b", "c"] and second["text"] == ["d", "e"]
    assert first["scale"] is batch["scale"] and second["table"] is batch["table"]
    with pytest.raises(ValueError, match="do not add up"):
        split_batch(batch, (3, 3))


def test_run_with_recovery_sequence_of_sizes():
    tried = []

    def run(size, sync):
        tried.append((size, sync))
        if size > 3:
            raise torch.OutOfMemoryError("fake")
        return size

    report = run_with_recovery(
        [8, 3], run, size_of=lambda n: n, split=lambda n, sizes: sizes, restart=lambda: None
    )
    assert [s for s, _ in tried] == [8, 4, 2, 2, 4, 2, 2, 3]
    assert report.attempted_sizes == [8, 4, 2, 2, 4, 2, 2, 3]
    assert report.results == [2, 2, 2, 2, 3]
    # Only the window's last piece synchronises gradients.
    assert [sync for s, sync in tried if s <= 3] == [False, False, False, False, True]
    assert [size for _, size, _, _ in report.events] == [8, 4, 4]


def test_bucket_counter_lowers_after_limit():
    counter = BucketOOMCounter(oom_limit=2)
    assert counter.record(1, ok_size=4) is False
    assert counter.record(1, ok_size=3) is True
    assert counter.new_limit(1, current_limit=12) == 3
    assert counter.record(1, ok_size=2) is False  # counting starts again
    assert counter.record(None, ok_size=2) is False


# ------------------------------------------------------------------ through the trainer


def test_forward_oom_splits_and_matches_a_run_without_oom():
    data = make_dataset(11)
    torch.manual_seed(0)
    model = FrameModel()
    clean = train_once(copy.deepcopy(model), [list(range(8)), [8, 9, 10]], data, frame_loss)
    fake = FakeOOMLoss(frame_loss, limit=3)
    recovered = train_once(model, [list(range(8)), [8, 9, 10]], data, fake)
    assert fake.sizes == [8, 4, 2, 2, 4, 2, 2, 3]
    assert [(e.batch_size, e.phase, e.split_sizes) for e in recovered.oom_events] == [
        (8, "forward", (4, 4)),
        (4, "forward", (2, 2)),
        (4, "forward", (2, 2)),
    ]
    assert recovered.history[0].loss == pytest.approx(clean.history[0].loss, rel=1e-6)
    assert_same_parameters(recovered.unwrapped_model, clean.unwrapped_model)


def test_backward_oom_restarts_the_window_and_matches():
    data = make_dataset(9)
    torch.manual_seed(0)
    model = BackwardOOMModel()
    clean = train_once(copy.deepcopy(model), [[0, 1, 2], list(range(3, 9))], data, frame_loss)
    model.limit = 4
    seen = FakeOOMLoss(frame_loss, limit=10**9)  # records sizes, never fails in forward
    recovered = train_once(model, [[0, 1, 2], list(range(3, 9))], data, seen)
    # 3 ran; 6 failed in backward; restart: 3 again, then 6 as 3 + 3.
    assert seen.sizes == [3, 6, 3, 3, 3]
    assert [(e.batch_size, e.phase) for e in recovered.oom_events] == [(6, "backward")]
    assert_same_parameters(recovered.unwrapped_model, clean.unwrapped_model)


def test_single_utterance_oom_names_shape_and_knobs():
    data = make_dataset(2)
    torch.manual_seed(0)
    with pytest.raises(BatchTooLargeError) as info:
        train_once(FrameModel(), [[0, 1]], data, FakeOOMLoss(frame_loss, limit=0))
    message = str(info.value)
    assert "single utterance" in message
    assert f"x (1, {len(data[0]['x'])}, 4)" in message
    assert "gradient checkpointing" in message and "batch limit" in message


class ListSampler:
    """A batch sampler double: fixed index lists, bucket per batch, records lower_limit calls."""

    def __init__(self, batches, buckets, durations):
        self.batches, self.buckets, self.durations = batches, buckets, durations
        self.lowered = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)

    def bucket_of(self, batch):
        return self.buckets[self.batches.index(list(batch))]

    def lower_limit(self, bucket, new_batch_size):
        self.lowered.append((bucket, new_batch_size))


def test_repeated_ooms_lower_the_bucket_limit_and_write_the_plan(tmp_path):
    data = make_dataset(8)
    durations = [1.0] * 6 + [5.0, 5.0]
    sampler = ListSampler([list(range(6)), [6, 7]], buckets=[0, 1], durations=durations)
    torch.manual_seed(0)
    fake = FakeOOMLoss(frame_loss, limit=2)
    trainer = MemoryEfficientTrainer(
        FrameModel(),
        TrainingConfig(gradient_accumulation_steps=2, warmup_steps=0),
        plan=make_plan(),
        loss_fn=fake,
        units_fn=frame_units,
        out_dir=tmp_path,
        progress=False,
        preflight=False,
        oom_limit=2,
    )
    trainer.train(sampler, dataset=data, max_steps=1)
    assert fake.sizes == [6, 3, 2, 1, 3, 2, 1, 2]
    # Three OOMs in bucket 0; the second one lowers its limit from 32 to 2 (the size that ran):
    # the sampler keeps its batches, the trainer runs bucket 0 in pieces of at most 2.
    assert sampler.lowered == []
    assert trainer.micro_limits.limits == {0: 2}
    saved = Plan.load(tmp_path / "plan.adjusted.json")
    assert saved.bucket_batch_sizes == [2, 12, 5]
    assert trainer.plan.bucket_batch_sizes == [2, 12, 5]
    # The monitor compared the heaviest micro-batch with the plan's prediction.
    record = json.loads((tmp_path / "memory.jsonl").read_text().splitlines()[0])
    assert record["bucket"] == 1 and record["predicted_bytes"] > 0


# ------------------------------------------------------------------ pre-flight


def test_pessimistic_batches_by_hand():
    plan = make_plan()
    durations = [1.0, 3.0, 5.0, 12.0, 15.0, 25.0, 9.0, 2.0]
    labels = [50, 10, 20, 30, 40, 90, 5, 100]
    batches = pessimistic_batches(durations, plan=plan, label_lengths=labels)
    names = [b.name for b in batches]
    # "longest utterance" (index 4, 15 s; 25 s is above the plan) is the same set as the
    # largest bucket's batch, so it is left out.
    assert names == ["largest bucket at its limit", "longest transcript"]
    assert batches[0].indices == [4, 3, 4, 4, 4] and batches[0].bucket == 2
    assert batches[1].indices[:3] == [7, 1, 0] and len(batches[1].indices) == 32
    assert batches[1].bucket == 0
    assert batches[0].predicted_bytes == plan.predicted_reserved_bytes(5, 15 * 16000, 40)
    no_plan = pessimistic_batches([3.0, 1.0, 2.0], batch_limit=lambda seconds: 2)
    assert [(b.name, b.indices) for b in no_plan] == [("longest utterance", [0, 2])]


def test_preflight_oom_saves_batch_and_says_which_knob(tmp_path):
    data = make_dataset(8)
    durations = [1.0, 3.0, 5.0, 12.0, 15.0, 25.0, 9.0, 2.0]
    torch.manual_seed(0)
    model = FrameModel()
    before = copy.deepcopy(model)
    trainer = MemoryEfficientTrainer(
        model,
        TrainingConfig(warmup_steps=0),
        plan=make_plan(),
        out_dir=tmp_path,
        loss_fn=FakeOOMLoss(frame_loss, limit=4),
        units_fn=frame_units,
        progress=False,
    )
    with pytest.raises(BatchTooLargeError) as info:
        trainer.train([[0, 1]], dataset=data, durations=durations, max_steps=1)
    message = str(info.value)
    assert "largest bucket at its limit" in message and "5 utterances" in message
    assert "gradient checkpointing" in message and "8-bit" in message
    saved = torch.load(tmp_path / "preflight_failed_batch.pt", weights_only=True)
    assert saved["indices"] == [4, 3, 4, 4, 4]
    assert saved["batch"]["x"].shape[0] == 5
    assert trainer.global_step == 0
    assert all(p.grad is None for p in trainer.unwrapped_model.parameters())
    assert_same_parameters(trainer.unwrapped_model, before)


def test_preflight_passes_then_trains():
    data = make_dataset(8)
    durations = [1.0, 3.0, 5.0, 12.0, 15.0, 25.0, 9.0, 2.0]
    torch.manual_seed(0)
    fake = FakeOOMLoss(frame_loss, limit=100)
    trainer = MemoryEfficientTrainer(
        FrameModel(),
        TrainingConfig(warmup_steps=0),
        plan=make_plan(),
        loss_fn=fake,
        units_fn=frame_units,
        progress=False,
    )
    trainer.train([[0, 1]], dataset=data, durations=durations, max_steps=1)
    assert [r.name for r in trainer.preflight_results] == ["largest bucket at its limit"]
    assert trainer.preflight_results[0].measured_bytes is None  # CPU: nothing measured
    assert fake.sizes == [5, 2]  # the pre-flight batch, then the training batch
    assert trainer.global_step == 1


def test_a_real_cpu_allocation_failure_is_out_of_memory():
    # 1 PiB is beyond any x86-64/arm64 user address space (128-256 TiB): the CPU allocator
    # fails for real ("DefaultCPUAllocator: can't allocate memory"), with any overcommit setting.
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**50, dtype=torch.uint8)
    assert is_oom(info.value)
    assert not is_oom(RuntimeError("shape mismatch"))
