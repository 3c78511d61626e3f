"""One process of the two-node test (``tests/test_two_nodes.py``), started by torchrun.

Trains ``FrameModel`` two optimizer steps with DDP over gloo: each step, this rank takes its
own ``batch`` utterances of the shared data, ``accumulation`` micro-batches of them before
each step. Saves the gradients of the first step and the final weights.

Usage: ``python -m torch.distributed.run ... _two_node_worker.py OUT BATCH ACCUMULATION``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from _frames import FrameModel  # the script's folder is on the path (tests/)
from torch.nn.parallel import DistributedDataParallel

STEPS = 2
FRAMES = 5
LR = 0.1


def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` utterances of ``FRAMES`` frames: inputs ``(n, FRAMES, 4)`` and labels ``(n, FRAMES)``."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, FRAMES, 4, generator=g), torch.randint(0, 3, (n, FRAMES), generator=g)


def mean_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per utterance (the usual loss of a batch)."""
    return torch.nn.functional.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1))


def main() -> None:
    out, batch, accumulation = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different weights on each node: DDP broadcasts rank 0's
    model = DistributedDataParallel(FrameModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_step = batch * accumulation * world
    x, y = data(per_step * STEPS)
    for step in range(STEPS):
        for k in range(accumulation):
            start = step * per_step + (k * world + rank) * batch  # this rank's micro-batch
            xb, yb = x[start : start + batch], y[start : start + batch]
            sync = k == accumulation - 1
            context = model.no_sync() if not sync else torch.enable_grad()
            with context:
                (mean_loss(model, xb, yb) / accumulation).backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
            torch.save(grads, out / f"grads{rank}.pt")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.save(model.module.state_dict(), out / f"weights{rank}.pt")
    info = f"{rank} {world} {os.environ['LOCAL_WORLD_SIZE']} {os.environ['GROUP_RANK']}\n"
    (out / f"rank{rank}.txt").write_text(info)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
