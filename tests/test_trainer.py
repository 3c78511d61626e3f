"""MemoryEfficientTrainer: exact accumulation against one big batch, schedule, precision, seed API."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os

import pytest
import torch
from torch import nn

from asrfit.errors import ConfigError, MissingDependencyError
from asrfit.train.batching import AnalyticBatchSampler, analytic_batch_limit, pad_collate
from asrfit.train.config import TrainingConfig
from asrfit.train.engines import configure_cuda_allocator
from asrfit.train.schedule import warmup_schedule
from asrfit.train.trainer import MemoryEfficientTrainer


class MaskedMeanModel(nn.Module):
    """Per-frame logits (B, T, 3) and per-utterance logits from a masked mean over frames."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.frame_head = nn.Linear(8, 3)
        self.utt_head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.proj(x))
        mask = (torch.arange(x.shape[1])[None, :] < lengths[:, None]).unsqueeze(-1)
        pooled = (h * mask).sum(1) / lengths[:, None]
        return self.frame_head(h), self.utt_head(pooled)


def utterance_loss(model, batch):
    _, logits = model(batch["x"], batch["lengths"])
    loss = nn.functional.cross_entropy(logits, batch["y"], reduction="sum")
    return loss, batch["x"].shape[0]


def frame_loss(model, batch):
    logits, _ = model(batch["x"], batch["lengths"])
    labels = batch["labels"]
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, 3), labels.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss, int((labels != -100).sum())


def frame_units(batch) -> int:
    return int((batch["labels"] != -100).sum())


def make_dataset(n: int = 8, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = int(torch.randint(2, 10, (1,), generator=g))
        out.append(
            {
                "x": torch.randn(t, 4, generator=g),
                "labels": torch.randint(0, 3, (t,), generator=g),
                "y": int(torch.randint(0, 3, (1,), generator=g)),
                "lengths": t,
            }
        )
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()


class RecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps a copy of the gradients it steps on."""

    def step(self, closure=None):
        self.seen_grads = [_grad(p) for g in self.param_groups for p in g["params"]]
        return super().step(closure)


@pytest.mark.parametrize(
    ("loss_fn", "units_fn"),
    [(utterance_loss, None), (frame_loss, frame_units)],
    ids=["utt", "frames"],
)
def test_accumulating_uneven_micro_batches_equals_one_big_batch(loss_fn, units_fn):
    data = make_dataset(8)
    lengths = {len(s["x"]) for s in data}
    assert len(lengths) > 2  # padding differs between the micro-batches and the big batch
    torch.manual_seed(0)
    model = MaskedMeanModel()
    reference = copy.deepcopy(model)

    # Reference: one batch of all 8, mean over its units, one AdamW step.
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.05, weight_decay=0.0)
    loss_sum, units = loss_fn(reference, pad_collate(data))
    (loss_sum / units).backward()
    ref_grads = [_grad(p) for p in reference.parameters()]
    ref_opt.step()

    optimizer = RecordingAdamW(model.parameters(), lr=0.05, weight_decay=0.0)
    config = TrainingConfig(gradient_accumulation_steps=3, warmup_steps=0, max_grad_norm=0.0)
    trainer = MemoryEfficientTrainer(
        model,
        config,
        loss_fn=loss_fn,
        units_fn=units_fn,
        optimizer=optimizer,
        progress=False,
        preflight=False,
    )
    trainer.train([[0, 1, 2], [3], [4, 5, 6, 7]], dataset=data, max_steps=1)

    assert trainer.history[0].micro_batch_sizes == [3, 1, 4]
    assert trainer.history[0].units == units
    for got, want in zip(optimizer.seen_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    for got, want in zip(trainer.unwrapped_model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # The logged loss is the big batch's mean.
    assert trainer.history[0].loss == pytest.approx(float(loss_sum.detach() / units), rel=1e-6)


def test_averaging_by_micro_batch_count_would_differ():
    """Guard that the test above can fail: per-micro-batch means averaged over K differ."""
    data = make_dataset(8)
    torch.manual_seed(0)
    model = MaskedMeanModel()
    total = torch.zeros(())
    for idx in ([0, 1, 2], [3], [4, 5, 6, 7]):
        loss_sum, units = frame_loss(model, pad_collate([data[i] for i in idx]))
        total = total + loss_sum / units / 3
    loss_sum, units = frame_loss(model, pad_collate(data))
    assert abs(float(total.detach()) - float(loss_sum.detach() / units)) > 1e-3


def test_units_fn_that_disagrees_with_loss_fn_is_an_error():
    data = make_dataset(4)
    torch.manual_seed(0)
    trainer = MemoryEfficientTrainer(
        MaskedMeanModel(),
        TrainingConfig(warmup_steps=0),
        loss_fn=frame_loss,
        progress=False,
        preflight=False,
    )
    with pytest.raises(ConfigError, match="units_fn"):
        trainer.train([[0, 1], [2, 3]], dataset=data, max_steps=1)


def test_linear_warmup_then_decay_by_hand():
    def factors(total_steps, steps):
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        schedule = warmup_schedule(optimizer, 2, total_steps)
        out = []
        for _ in range(steps):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        return out

    assert factors(6, 7) == [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert factors(None, 10)[2:] == [1.0] * 8  # constant after the warm-up


def test_schedule_matches_transformers_linear_warmup():
    from transformers import get_linear_schedule_with_warmup

    ours = warmup_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 3, 11)
    theirs = get_linear_schedule_with_warmup(
        torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 3, 11
    )
    assert [ours.lr_lambdas[0](s) for s in range(13)] == [
        theirs.lr_lambdas[0](s) for s in range(13)
    ]


def test_trainer_steps_follow_the_schedule():
    data = make_dataset(8)
    torch.manual_seed(0)
    config = TrainingConfig(learning_rate=0.2, warmup_steps=2)
    trainer = MemoryEfficientTrainer(
        MaskedMeanModel(), config, loss_fn=utterance_loss, progress=False, preflight=False
    )
    before = [p.detach().clone() for p in trainer.unwrapped_model.parameters()]
    trainer.train([[i] for i in range(6)], dataset=data, max_steps=6)
    # Schedule over 6 steps: factors 0, .5, 1, .75, .5, .25 of 0.2.
    lrs = [r.learning_rate for r in trainer.history]
    assert lrs == pytest.approx([0.0, 0.1, 0.2, 0.15, 0.1, 0.05])
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # decayed to 0 at step 6
    after = list(trainer.unwrapped_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_gradient_clipping_by_hand():
    data = make_dataset(4)
    torch.manual_seed(0)
    model = MaskedMeanModel()
    reference = copy.deepcopy(model)
    loss_sum, units = utterance_loss(reference, pad_collate(data))
    (loss_sum / units).backward()
    norm = torch.sqrt(sum((_grad(p) ** 2).sum() for p in reference.parameters()))
    assert norm > 0.01
    with torch.no_grad():
        for p in reference.parameters():
            p -= 1.0 * _grad(p) * (0.01 / norm)
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    config = TrainingConfig(warmup_steps=0, max_grad_norm=0.01)
    trainer = MemoryEfficientTrainer(
        model, config, loss_fn=utterance_loss, optimizer=sgd, progress=False, preflight=False
    )
    trainer.train([[0, 1, 2, 3]], dataset=data, max_steps=1)
    for got, want in zip(trainer.unwrapped_model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_cpu_trainer_steps_with_fused_adamw_as_the_per_tensor_loop_would():
    data = make_dataset(4)
    torch.manual_seed(0)
    model = MaskedMeanModel()
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    config = TrainingConfig(warmup_steps=1, learning_rate=1e-2)
    fused = MemoryEfficientTrainer(
        model, config, loss_fn=utterance_loss, progress=False, preflight=False
    )
    assert fused.optimizer.param_groups[0]["fused"] is True
    loop = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0, foreach=False)
    looped = MemoryEfficientTrainer(
        reference, config, loss_fn=utterance_loss, optimizer=loop, progress=False, preflight=False
    )
    for trainer in (fused, looped):
        trainer.train([[0, 1], [2, 3], [0, 3]], dataset=data, max_steps=3)
    trained = list(fused.unwrapped_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(trained, initial.parameters(), strict=True))
    for got, want in zip(trained, looped.unwrapped_model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_precision_on_cpu(caplog):
    with caplog.at_level(logging.WARNING):
        fp16 = MemoryEfficientTrainer(
            MaskedMeanModel(), TrainingConfig(fp16=True), progress=False, preflight=False
        )
    assert fp16.accelerator.mixed_precision == "no"
    assert "fp16 autocast needs CUDA" in caplog.text
    bf16 = MemoryEfficientTrainer(
        MaskedMeanModel(), TrainingConfig(bf16=True), progress=False, preflight=False
    )
    assert bf16.accelerator.mixed_precision == "bf16"


def test_gradient_checkpointing_switch():
    class WithSwitch(MaskedMeanModel):
        enabled = 0

        def gradient_checkpointing_enable(self):
            self.enabled += 1

    model = WithSwitch()
    MemoryEfficientTrainer(
        model, TrainingConfig(gradient_checkpointing=True), progress=False, preflight=False
    )
    assert model.enabled == 1
    off = WithSwitch()
    MemoryEfficientTrainer(off, TrainingConfig(), progress=False, preflight=False)
    assert off.enabled == 0


def test_expandable_segments_env(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert configure_cuda_allocator(True) is False
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert configure_cuda_allocator(True) is False  # too late once CUDA is up
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert configure_cuda_allocator(False) is False
    assert configure_cuda_allocator(True) is True
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert configure_cuda_allocator(True) is False
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_deepspeed_plan_without_deepspeed_says_what_to_install(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec

    def without_deepspeed(name, *args, **kwargs):  # as if deepspeed were not installed
        return None if name.split(".")[0] == "deepspeed" else find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", without_deepspeed)
    monkeypatch.setitem(__import__("sys").modules, "deepspeed", None)
    from asrfit.memory.setup import Setup
    from asrfit.testing import make_plan

    plan = make_plan(
        (8,),
        bucket_edges_seconds=(0.0, 4.0),
        usable_bytes=2**33,
        setup=Setup(precision="fp32", optimizer="adamw", zero_stage=2, world_size=2),
    )
    with pytest.raises(MissingDependencyError, match=r"pip install asrfit\[deepspeed\]"):
        MemoryEfficientTrainer(MaskedMeanModel(), plan=plan, progress=False)


def test_pad_collate_by_hand():
    batch = pad_collate(
        [
            {"input_values": [1.0, 2.0, 3.0], "labels": [5, 6], "text": "ab", "n": 3},
            {"input_values": [4.0], "labels": [7, 8, 9], "text": "c", "n": 1},
        ]
    )
    assert batch["input_values"].tolist() == [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]
    assert batch["labels"].tolist() == [[5, 6, -100], [7, 8, 9]]
    assert batch["text"] == ["ab", "c"]
    assert batch["n"].tolist() == [3, 1]
    features = pad_collate([{"f": [[1, 2], [3, 4]]}, {"f": [[5, 6]]}])["f"]
    assert features.tolist() == [[[1, 2], [3, 4]], [[5, 6], [0, 0]]]
    with pytest.raises(ConfigError, match="only the first dimension"):
        pad_collate([{"x": torch.zeros(2, 3)}, {"x": torch.zeros(2, 4)}])


def test_analytic_batch_limit_by_hand():
    # Base rule: 8 utterances at the percentile length 100 -> 4 at length 200, 16 at 50.
    kwargs = dict(
        percentile_length=100, base_batch_size=8, alpha_constant=1.2, parameter_bytes=1000
    )
    assert analytic_batch_limit(200, budget_bytes=None, **kwargs) == 4
    assert analytic_batch_limit(50, budget_bytes=None, **kwargs) == 16
    # Memory rule: budget 10_000 - 4 x 1000 states = 6000 bytes; 1.2 x 1000 x 2 per utterance
    # at length 200 -> floor(6000 / 2400) = 2, below the base rule's 4.
    assert analytic_batch_limit(200, budget_bytes=10_000, **kwargs) == 2
    assert analytic_batch_limit(10_000, budget_bytes=10_000, **kwargs) == 1


class HFStyleModel(nn.Module):
    """Returns an object with .loss, like a transformers model given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 4)

    def forward(self, input_values, labels):
        h = self.proj(input_values.unsqueeze(-1)).mean(1)
        target = (labels.clamp(min=0).sum(1) % 4).long()

        class Out:
            loss = nn.functional.cross_entropy(h, target)

        return Out()


def test_seed_api_train_epoch(tmp_path, caplog):
    g = torch.Generator().manual_seed(1)
    lengths = [int(x) for x in torch.randint(10, 200, (40,), generator=g)]
    dataset = [
        {
            "input_values": torch.randn(n, generator=g),
            "labels": torch.randint(0, 5, (3,), generator=g),
        }
        for n in lengths
    ]
    torch.manual_seed(0)
    config = TrainingConfig(
        max_memory_gb=12.0,
        accumulation_steps=4,
        learning_rate=1e-4,
        mixed_precision=True,
        adaptive_batching=True,
        sequence_length_percentile=95.0,
        alpha_constant=1.2,
    )
    trainer = MemoryEfficientTrainer(
        HFStyleModel(), config, progress=False, log_every_steps=1, out_dir=tmp_path
    )
    with caplog.at_level(logging.INFO, logger="asrfit"):
        loss = trainer.train_epoch(dataset)
    assert math.isfinite(loss) and loss > 0
    # Every utterance trained exactly once in the epoch.
    seen = sorted(i for r in trainer.history for idx in r.indices for i in idx)
    assert seen == list(range(40))
    # Batches follow the analytic rule: 8 utterances at the 95th-percentile length.
    p95 = float(torch.quantile(torch.tensor(lengths, dtype=torch.float64), 0.95))
    for record in trainer.history:
        for idx in record.indices:
            longest = max(lengths[i] for i in idx)
            assert len(idx) <= max(1, math.floor(8 * p95 / longest))
    assert any(len(idx) > 8 for r in trainer.history for idx in r.indices)  # short ones batch more
    assert all(len(r.indices) <= 4 for r in trainer.history)
    lines = [m for m in caplog.messages if m.startswith("step ")]
    assert lines and "loss" in lines[0] and "utterances" in lines[0] and "memory" in lines[0]
    # The monitor wrote one line per step; a checkpoint was written at the end.
    records = [json.loads(x) for x in (tmp_path / "memory.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [r.step for r in trainer.history]
    assert (tmp_path / "checkpoints").is_dir()
    # A second epoch continues the step count and reshuffles.
    steps = trainer.global_step
    trainer.train_epoch(dataset)
    assert trainer.epoch == 2 and trainer.global_step > steps


def test_analytic_sampler_shards_disjointly():
    lengths = [float(x) for x in range(1, 60)]
    limit = lambda n: 4  # noqa: E731
    shards = [AnalyticBatchSampler(lengths, limit, num_replicas=2, rank=r, seed=3) for r in (0, 1)]
    batches = [list(s) for s in shards]
    assert len(batches[0]) == len(batches[1])
    flat = [set(i for b in rank for i in b) for rank in batches]
    assert not flat[0] & flat[1]


def test_collated_batches_train_like_index_batches_and_bf16_runs():
    """A DataLoader-style iterable of collated batches gives the same run as index batches."""
    data = make_dataset(8)
    index_batches = [[0, 1, 2], [3], [4, 5], [6, 7]]
    torch.manual_seed(0)
    model = MaskedMeanModel()
    twin = copy.deepcopy(model)
    config = TrainingConfig(gradient_accumulation_steps=2, warmup_steps=0, learning_rate=0.05)
    by_index = MemoryEfficientTrainer(
        model, config, loss_fn=frame_loss, units_fn=frame_units, progress=False, preflight=False
    )
    by_index.train(index_batches, dataset=data, max_steps=2)
    by_batch = MemoryEfficientTrainer(
        twin, config, loss_fn=frame_loss, units_fn=frame_units, progress=False, preflight=False
    )
    loader = torch.utils.data.DataLoader(data, batch_sampler=index_batches, collate_fn=pad_collate)
    summary = by_batch.train(loader, max_steps=2)
    assert summary.steps == 2 and by_batch.history[0].indices is None
    assert [r.loss for r in by_batch.history] == pytest.approx([r.loss for r in by_index.history])
    for a, b in zip(twin.parameters(), by_index.unwrapped_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # bf16 autocast on the CPU trains too (losses close to the fp32 run's).
    torch.manual_seed(0)
    bf16 = MemoryEfficientTrainer(
        MaskedMeanModel(),
        dataclasses.replace(config, bf16=True),
        loss_fn=frame_loss,
        units_fn=frame_units,
        progress=False,
        preflight=False,
    )
    bf16.train(index_batches, dataset=data, max_steps=2)
    assert [r.loss for r in bf16.history] == pytest.approx(
        [r.loss for r in by_index.history], rel=0.05
    )
    assert [r.loss for r in bf16.history] != [r.loss for r in by_index.history]
