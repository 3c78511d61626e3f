"""Two processes on CPU (gloo): sharded data, exact global accumulation, identical weights."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from _frames import FrameModel, frame_loss, frame_units
from accelerate.state import AcceleratorState

# Imported here, before the fork, so that the two processes do not import them again.
from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.testing import plans
from asrfit.train.config import TrainingConfig
from asrfit.train.trainer import MemoryEfficientTrainer

WORLD = 2
STEPS = 3
ACCUMULATION = 2


def make_plan() -> Plan:
    """Batch limits 4 and 2 over 0-4-12 s, half the utterances each; WORLD processes."""
    return plans.make_plan(
        (4, 2),
        bucket_edges_seconds=(0.0, 4.0, 12.0),
        utterance_fractions=(0.5, 0.5),
        setup=Setup(precision="fp32", optimizer="adamw", world_size=WORLD),
        gradient_accumulation_steps=ACCUMULATION,
        target_effective_batch="8 utterances",
    )


def make_data(n: int = 24):
    g = torch.Generator().manual_seed(11)
    durations = [float(d) for d in (torch.rand(n, generator=g) * 11.0 + 0.5)]
    data = [
        {
            "x": torch.randn(max(1, round(s)), 4, generator=g),
            "labels": torch.randint(0, 3, (max(1, round(s)),), generator=g),
        }
        for s in durations
    ]
    return data, durations


def make_trainer(model, accumulation, **kwargs):
    config = TrainingConfig(
        gradient_accumulation_steps=accumulation, warmup_steps=1, learning_rate=0.05
    )
    return MemoryEfficientTrainer(
        model,
        config,
        loss_fn=frame_loss,
        units_fn=frame_units,
        progress=False,
        preflight=False,
        cpu=True,
        **kwargs,
    )


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        ACCELERATE_USE_CPU="yes",
        GLOO_SOCKET_IFNAME="lo",
    )
    torch.set_num_threads(1)  # forked after the parent used OpenMP: stay single-threaded
    # Forked from a pytest process whose earlier tests set up a single-process Accelerate
    # state: drop it, so that this process reads RANK/WORLD_SIZE afresh.
    AcceleratorState._reset_state(reset_partial_state=True)
    data, durations = make_data()
    plan = make_plan()
    torch.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    trainer = make_trainer(FrameModel(), ACCUMULATION, plan=plan)
    assert trainer.accelerator.num_processes == WORLD
    sampler = MemoryBudgetSampler(durations, plan, seed=3, num_replicas=WORLD, rank=rank)
    trainer.train(sampler, dataset=data, durations=durations, max_steps=STEPS)
    record = {
        "indices": [r.indices for r in trainer.history],
        "losses": [r.loss for r in trainer.history],
        "distributed_type": str(trainer.accelerator.distributed_type),
        "limits": [int(x) for x in sampler.state_dict()["limits"]],
        "epoch_limits": [int(x) for x in sampler.state_dict()["epoch_limits"]],
        "plan_limits": list(plan.bucket_batch_sizes),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    torch.save(trainer.unwrapped_model.state_dict(), Path(out_dir, f"rank{rank}.pt"))
    trainer.end_training()  # a process that exits in its gloo group can abort


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_shard_data_and_agree(tmp_path):
    import torch.multiprocessing as mp

    # fork (as accelerate's debug_launcher does): the processes start in a second, not ~10 s.
    context = mp.start_processes(
        _worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=False, start_method="fork"
    )
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("the two training processes did not finish in 120 s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all("MULTI_CPU" in r["distributed_type"] for r in ranks)
    # Disjoint data: no utterance trained by both ranks.
    seen = [{i for step in r["indices"] for mb in step for i in mb} for r in ranks]
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    # Both ranks batch under the same bucket limits (the plan's: nothing ran out of memory).
    assert ranks[0]["limits"] == ranks[1]["limits"] == ranks[0]["plan_limits"]
    assert ranks[0]["epoch_limits"] == ranks[1]["epoch_limits"]
    # Same loss (the global mean) and bit-identical weights on both ranks.
    assert ranks[0]["losses"] == pytest.approx(ranks[1]["losses"], rel=1e-12)
    weights = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name

    # Independent reference: one process, rank 0's initial weights, each optimizer step on
    # the union of both ranks' micro-batches of that step.
    data, _ = make_data()
    torch.manual_seed(0)
    reference = make_trainer(FrameModel(), ACCUMULATION * WORLD)
    union = [mb for step in range(STEPS) for r in ranks for mb in r["indices"][step]]
    reference.train(union, dataset=data, max_steps=STEPS)
    assert [r.loss for r in reference.history] == pytest.approx(ranks[0]["losses"], rel=1e-5)
    for name, value in reference.unwrapped_model.state_dict().items():
        torch.testing.assert_close(weights[0][name], value, rtol=1e-5, atol=1e-6)
