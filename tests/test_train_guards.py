"""Trainer guards: NaN/inf steps skipped and counted, stop after a streak; OOM-lowered limits
split micro-batches without changing which utterances share a step; no gradients left behind."""

from __future__ import annotations

import math

import pytest
import torch
from _frames import FrameModel, frame_loss, frame_units
from test_oom import FakeOOMLoss, ListSampler, make_dataset, make_plan

from asrfit.train.config import TrainingConfig
from asrfit.train.guards import MicroBatchLimits, NonFiniteGuard, NonFiniteLossError, presplit
from asrfit.train.oom import BatchTooLargeError
from asrfit.train.trainer import MemoryEfficientTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(model, loss_fn, accumulation=1, **kwargs):
    config = TrainingConfig(
        gradient_accumulation_steps=accumulation, warmup_steps=0, learning_rate=0.05
    )
    return MemoryEfficientTrainer(
        model,
        config,
        loss_fn=loss_fn,
        units_fn=frame_units,
        progress=False,
        preflight=False,
        **kwargs,
    )


class PoisonLoss:
    """The frame loss, NaN for batches holding a poisoned utterance (by its first value)."""

    def __init__(self, poisoned_first_values):
        self.poisoned = poisoned_first_values

    def __call__(self, model, batch):
        loss, units = frame_loss(model, batch)
        firsts = {float(v) for v in batch["x"][:, 0, 0]}
        if firsts & self.poisoned:
            loss = loss * torch.tensor(float("nan"))
        return loss, units


def test_nan_step_is_skipped_counted_and_leaves_weights_finite():
    data = make_dataset(6)
    batches = [[0, 1], [2, 3], [4, 5]]
    poisoned = {float(data[2]["x"][0, 0])}
    torch.manual_seed(0)
    model = FrameModel()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = _trainer(model, PoisonLoss(poisoned), optimizer=sgd)
    trainer.train(batches, dataset=data, max_steps=3)
    assert trainer.nonfinite.skipped_steps == 1 and trainer.nonfinite.causes == {"loss": 1}
    assert all(torch.isfinite(p).all() for p in model.parameters())

    # reference: the same run where that step's gradient is zero (plain SGD then leaves the
    # weights as they are, as a skipped step must)
    def zero_loss(model, batch):
        loss, units = frame_loss(model, batch)
        return (loss * 0 if {float(v) for v in batch["x"][:, 0, 0]} & poisoned else loss), units

    torch.manual_seed(0)
    reference = FrameModel()
    ref = _trainer(reference, zero_loss, optimizer=torch.optim.SGD(reference.parameters(), lr=0.05))
    ref.train(batches, dataset=data, max_steps=3)
    assert ref.nonfinite.skipped_steps == 0
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_repeated_nan_steps_stop_with_the_cause_and_the_utterances():
    data = make_dataset(8)
    trainer = _trainer(
        FrameModel(), PoisonLoss({float(d["x"][0, 0]) for d in data}), max_nonfinite_steps=3
    )
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train([[0, 1], [2, 3], [4, 5], [6, 7]], dataset=data, max_steps=4)
    message = str(info.value)
    assert "3 optimizer steps in a row" in message and "step 3" in message and "loss" in message
    assert "learning rate" in message
    assert all(p.grad is None for p in trainer.model.parameters())


def test_infinite_gradient_is_caught_without_clipping():
    data = make_dataset(4)

    def inf_grad_loss(model, batch):
        loss, units = frame_loss(model, batch)
        return loss + 0 * model.proj.weight.sum() * torch.tensor(float("inf")), units

    trainer = _trainer(FrameModel(), inf_grad_loss, max_nonfinite_steps=10)
    trainer.config.max_grad_norm = 0.0
    trainer.train([[0, 1], [2, 3]], dataset=data, max_steps=2)
    assert trainer.nonfinite.skipped_steps == 2


def test_guard_streak_resets_on_a_good_step():
    guard = NonFiniteGuard(max_consecutive=2)
    guard.record("loss", 1, "x")
    guard.record(None, 2, "x")
    guard.record("gradients", 3, "x")
    assert guard.skipped_steps == 2 and guard.streak == 1
    with pytest.raises(NonFiniteLossError):
        guard.record("loss", 4, "x")
    assert NonFiniteGuard.cause(math.inf, 1.0) == "loss"
    assert NonFiniteGuard.cause(1.0, math.nan) == "gradients"
    assert NonFiniteGuard.cause(1.0, 2.0) is None


def test_presplit_keeps_utterances_and_order():
    limits = MicroBatchLimits({0: 2})
    pieces = presplit(
        [[1, 2, 3, 4, 5], [6, 7, 8]],
        limits,
        bucket_of=lambda p: 0 if len(p) == 5 else 1,
        size_of=len,
        split=lambda p, s: (p[: s[0]], p[s[0] :]),
    )
    assert pieces == [[1, 2], [3, 4], [5], [6, 7, 8]]


def test_after_an_oom_lowering_each_step_keeps_its_utterances(tmp_path):
    """A run with OOMs (bucket 0 lowered to 2) trains the same steps as an OOM-free run."""
    data = make_dataset(16)
    durations = [1.0] * 12 + [5.0] * 4
    batches = [list(range(0, 6)), [12, 13], list(range(6, 12)), [14, 15]]

    def run(loss_fn):
        torch.manual_seed(0)
        sampler = ListSampler([list(b) for b in batches], buckets=[0, 1, 0, 1], durations=durations)
        trainer = MemoryEfficientTrainer(
            FrameModel(),
            TrainingConfig(gradient_accumulation_steps=2, warmup_steps=0, learning_rate=0.05),
            plan=make_plan(),
            loss_fn=loss_fn,
            units_fn=frame_units,
            out_dir=tmp_path / str(id(loss_fn)),
            progress=False,
            preflight=False,
            oom_limit=2,
        )
        trainer.train(sampler, dataset=data, max_steps=2)
        return trainer

    oom = FakeOOMLoss(frame_loss, limit=2)
    with_oom, without = run(oom), run(frame_loss)
    assert with_oom.micro_limits.limits == {0: 2}
    # the second step's 6 utterances of bucket 0 ran as 2 + 2 + 2 straight away (no new OOM)
    assert oom.sizes[-4:] == [2, 2, 2, 2]
    for a, b in zip(with_oom.history, without.history, strict=True):
        assert sorted(i for m in a.indices for i in m) == sorted(i for m in b.indices for i in m)
    for a, b in zip(with_oom.model.parameters(), without.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_persistent_oom_at_one_utterance_says_what_to_do():
    data = make_dataset(4)
    trainer = _trainer(FrameModel(), FakeOOMLoss(frame_loss, limit=0))
    with pytest.raises(BatchTooLargeError) as info:
        trainer.train([[0, 1]], dataset=data, max_steps=1)
    message = str(info.value)
    assert "single utterance" in message and "gradient checkpointing" in message
    assert "max_seconds" in message
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_failed_trainer_leaves_no_gradients_for_the_next():
    data = make_dataset(4)
    torch.manual_seed(0)
    model = FrameModel()
    failing = _trainer(model, FakeOOMLoss(frame_loss, limit=0))
    with pytest.raises(BatchTooLargeError):
        failing.train([[0, 1]], dataset=data, max_steps=1)
    # a gradient left on purpose (e.g. by user code) is not added to the next trainer's first step
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    torch.manual_seed(0)
    reference = FrameModel()
    reference.load_state_dict(model.state_dict())
    a, b = _trainer(model, frame_loss), _trainer(reference, frame_loss)
    a.train([[0, 1], [2, 3]], dataset=data, max_steps=2)
    b.train([[0, 1], [2, 3]], dataset=data, max_steps=2)
    for x, y in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
