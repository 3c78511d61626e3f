"""Checkpoints: atomic, keep the last N, restore RNGs; a resumed run continues exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from _frames import frame_loss, frame_units
from torch import nn

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.testing import plans
from asrfit.train.batching import AnalyticBatchSampler
from asrfit.train.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from asrfit.train.config import TrainingConfig
from asrfit.train.schedule import warmup_schedule
from asrfit.train.trainer import MemoryEfficientTrainer


def make_plan() -> Plan:
    """Batch limits 4, 3 and 2 over 0-4-8-12 s; accumulation 2 toward 8 utterances."""
    return plans.make_plan(
        (4, 3, 2),
        bucket_edges_seconds=(0.0, 4.0, 8.0, 12.0),
        utterance_fractions=(0.5, 0.4, 0.1),
        setup=Setup(precision="fp32", optimizer="adamw"),
        gradient_accumulation_steps=2,
        target_effective_batch="8 utterances",
    )


class DropoutModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.proj(x))))


def make_data(n: int = 20):
    g = torch.Generator().manual_seed(5)
    durations = [float(d) for d in (torch.rand(n, generator=g) * 11.5 + 0.5)]
    data = []
    for seconds in durations:
        t = max(1, round(seconds))
        data.append(
            {"x": torch.randn(t, 4, generator=g), "labels": torch.randint(0, 3, (t,), generator=g)}
        )
    return data, durations


class Crash(Exception):
    pass


class CrashAfter:
    """A loss that raises on call number ``n + 1`` (a simulated kill)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, model, batch):
        self.calls += 1
        if self.calls > self.n:
            raise Crash
        return frame_loss(model, batch)


def make_sampler(kind: str, durations, plan):
    if kind == "budget":
        return MemoryBudgetSampler(durations, plan, seed=7)
    return AnalyticBatchSampler(durations, lambda seconds: 3 if seconds < 6 else 2, seed=7)


def run(kind, out_dir, *, seed, loss_fn=frame_loss, resume_from=None, save_every_steps=None):
    data, durations = make_data()
    plan = make_plan()
    torch.manual_seed(seed)
    model = DropoutModel()
    config = TrainingConfig(gradient_accumulation_steps=2, warmup_steps=2, learning_rate=0.05)
    trainer = MemoryEfficientTrainer(
        model,
        config,
        plan=plan if kind == "budget" else None,
        loss_fn=loss_fn,
        units_fn=frame_units,
        out_dir=out_dir,
        progress=False,
        preflight=False,
        save_every_steps=save_every_steps,
    )
    sampler = make_sampler(kind, durations, plan)
    trainer.train(sampler, dataset=data, durations=durations, max_steps=6, resume_from=resume_from)
    return trainer, sampler


@pytest.mark.parametrize("kind", ["budget", "analytic"])
def test_resume_continues_like_an_uninterrupted_run(tmp_path, kind):
    full, sampler = run(kind, tmp_path / "full", seed=0)
    steps_per_epoch = -(-len(sampler) // 2)
    assert 3 < steps_per_epoch < 6  # step 3 is mid-epoch, steps 4-6 cross into the next epoch
    assert [r.epoch for r in full.history][-1] == 1

    crash = CrashAfter(3 * 2)  # two micro-batches per step: dies in step 4
    with pytest.raises(Crash):
        run(kind, tmp_path / "cut", seed=0, loss_fn=crash, save_every_steps=3)
    saved = latest_checkpoint(tmp_path / "cut" / "checkpoints")
    assert saved is not None and saved.name == "checkpoint-00000003.pt"

    # A fresh model (other initial weights), trainer and sampler, resumed from step 3.
    resumed, _ = run(kind, tmp_path / "cut", seed=123, resume_from="latest")
    assert [r.step for r in resumed.history] == [4, 5, 6]
    for got, want in zip(resumed.history, full.history[3:], strict=True):
        assert got.indices == want.indices
        assert got.epoch == want.epoch
        assert got.learning_rate == pytest.approx(want.learning_rate)
        assert got.loss == pytest.approx(want.loss, rel=1e-6)
    for a, b in zip(
        resumed.unwrapped_model.parameters(), full.unwrapped_model.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_resume_differs_without_rng_restore(tmp_path, monkeypatch):
    """Guard that the resume test can fail: dropout masks depend on the restored RNG."""
    import asrfit.train.checkpoint as ckpt

    full, _ = run("budget", tmp_path / "full", seed=0)
    with pytest.raises(Crash):
        run("budget", tmp_path / "cut", seed=0, loss_fn=CrashAfter(6), save_every_steps=3)
    monkeypatch.setattr(ckpt, "restore_rng_state", lambda state: None)
    resumed, _ = run("budget", tmp_path / "cut", seed=123, resume_from="latest")
    assert [r.indices for r in resumed.history] == [r.indices for r in full.history[3:]]
    assert resumed.history[0].loss != pytest.approx(full.history[3].loss, rel=1e-6)


def _toy():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = warmup_schedule(optimizer, 2, 10)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def test_save_load_roundtrip_rng_and_keep_last(tmp_path):
    model, optimizer, scheduler = _toy()
    for step in (1, 2, 3, 4):
        save_checkpoint(
            tmp_path,
            model=model,
            step=step,
            epoch=0,
            optimizer=optimizer,
            scheduler=scheduler,
            config=TrainingConfig(),
            plan=make_plan(),
            extra={"note": "x"},
            keep_last=2,
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-00000003.pt",
        "checkpoint-00000004.pt",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    expected = (random.random(), np.random.rand(), torch.rand(3))
    # Move every generator on, then load: they are back where they were at the save.
    random.random(), np.random.rand(), torch.rand(3)
    fresh = nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_sched = warmup_schedule(fresh_opt, 5, 50)
    info = load_checkpoint(
        "latest", directory=tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched
    )
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
    assert info.step == 4 and info.extra == {"note": "x"}
    assert Plan.from_dict(info.plan) == make_plan()
    assert TrainingConfig.from_dict(info.config) == TrainingConfig()
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(
        fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
    assert fresh_sched.last_epoch == 1 and fresh_sched.lr_lambdas[0].total_steps == 10


def test_interrupted_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model, optimizer, _ = _toy()
    first = save_checkpoint(tmp_path, model=model, step=1, optimizer=optimizer)
    before = first.read_bytes()

    def broken_save(obj, handle):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, model=model, step=2, optimizer=optimizer)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-00000001.pt",
        "checkpoint-00000001.pt.sha256",
    ]
    assert first.read_bytes() == before


def test_load_errors_name_the_problem(tmp_path):
    model = nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="no checkpoint"):
        load_checkpoint("latest", directory=tmp_path, model=model)
    with pytest.raises(ConfigError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "nope.pt", model=model)
    other = tmp_path / "checkpoint-00000001.pt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(ConfigError, match="not an asrfit checkpoint"):
        load_checkpoint(other, model=model)
    save_checkpoint(tmp_path, model=model, step=2)
    with pytest.raises(ConfigError, match="no optimizer state"):
        load_checkpoint(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1))


class _Planted:
    """A pickled object whose unpickling would run code: it creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_carrying_a_pickled_callable_is_refused_before_it_runs(tmp_path):
    from asrfit.train.checkpoint import read_checkpoint

    marker = tmp_path / "code-ran"
    planted = tmp_path / "checkpoint-00000001.pt"
    torch.save({"format_version": 1, "model": {}, "payload": _Planted(marker)}, planted)
    with pytest.raises(ConfigError, match="refused: it holds objects other than plain data"):
        read_checkpoint(planted)
    with pytest.raises(ConfigError, match=str(planted.name)):
        load_checkpoint(tmp_path, model=nn.Linear(3, 2))
    assert not marker.exists()
    # the control: the same file loaded without the guard does run the planted code
    torch.load(planted, weights_only=False)
    assert marker.exists()
