"""One rank of the preemption test (tests/test_preemption.py), started by torchrun.

``python -m torch.distributed.run --nproc_per_node 2 tests/_preempt_worker.py OUT MODE``:
MODE ``reference`` trains STEPS steps; ``signal`` sends SIGTERM to rank 1 alone during step
SIGNAL_AT and records where each rank stopped; ``resume`` continues from the latest
checkpoint to STEPS. Rank 0 saves the final weights as ``OUT/final.pt``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
from _frames import FrameModel
from test_ddp import make_data, make_plan, make_trainer

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.train.interrupt import TrainingInterrupted
from asrfit.train.step import StepMixin

STEPS = 5
SIGNAL_AT = 2


def main(out: Path, mode: str) -> int:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data, durations = make_data()
    plan = make_plan()
    torch.manual_seed(0)
    trainer = make_trainer(FrameModel(), 2, plan=plan, out_dir=out, keep_last=2)
    sampler = MemoryBudgetSampler(durations, plan, seed=3, num_replicas=world, rank=rank)
    if mode == "signal" and rank == 1:
        real_step = StepMixin._step

        def step(self, window):
            if self.global_step + 1 == SIGNAL_AT:  # the step in progress: it finishes
                os.kill(os.getpid(), signal.SIGTERM)
            return real_step(self, window)

        StepMixin._step = step
    try:
        trainer.train(sampler, dataset=data, durations=durations, max_steps=STEPS,
                      resume_from="latest" if mode == "resume" else None)
    except TrainingInterrupted as stop:
        record = {"step": stop.step, "signal": stop.signal_name, "status": stop.exit_status,
                  "checkpoint": None if stop.checkpoint is None else str(stop.checkpoint)}
        (out / f"stopped-rank{rank}.json").write_text(json.dumps(record))
        return stop.exit_status
    if rank == 0:
        torch.save(trainer.unwrapped_model.state_dict(), out / "final.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
