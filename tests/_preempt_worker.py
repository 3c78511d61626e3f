"""One rank of the preemption test (tests/test_preemption.py), started by torchrun.

``python -m torch.distributed.run --nproc_per_node 2 tests/_preempt_worker.py OUT MODE``:
MODE ``reference`` trains STEPS steps; ``signal`` sends SIGTERM to rank 1 alone during step
SIGNAL_AT and records where each rank stopped; ``resume`` continues from the latest
checkpoint to STEPS; ``full`` gives rank 0 a real file-size limit for its checkpoint at
step SIGNAL_AT (``--save-every`` 2 steps) and records each rank's error. Rank 0 saves the
final weights as ``OUT/final.pt``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import torch
from _frames import FrameModel
from test_ddp import make_data, make_plan, make_trainer

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.train.interrupt import TrainingInterrupted
from asrfit.train.step import OptimizerStep
from asrfit.utils.process_exit import exit_process

STEPS = 5
SIGNAL_AT = 2


def main(out: Path, mode: str) -> int:
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data, durations = make_data()
    plan = make_plan()
    torch.manual_seed(0)
    trainer = make_trainer(
        FrameModel(),
        2,
        plan=plan,
        out_dir=out,
        keep_last=2,
        save_every_steps=SIGNAL_AT if mode == "full" else None,
    )
    sampler = MemoryBudgetSampler(durations, plan, seed=3, num_replicas=world, rank=rank)
    if mode == "signal" and rank == 1:
        real_run = OptimizerStep.run

        def run_step(self, window):
            if self.state.global_step + 1 == SIGNAL_AT:  # the step in progress: it finishes
                os.kill(os.getpid(), signal.SIGTERM)
            return real_run(self, window)

        OptimizerStep.run = run_step
    if mode == "full" and rank == 0:  # no room for the checkpoint: writes fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and "format_version" in obj:
                resource.setrlimit(
                    resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
                )
            return real_save(obj, f, *args, **kwargs)

        torch.save = save
    try:
        return run(trainer, sampler, data, durations, out, mode, rank)
    finally:  # leaves the gloo group (its threads stay: the process ends by exit_process)
        trainer.end_training()


def run(trainer, sampler, data, durations, out: Path, mode: str, rank: int) -> int:
    try:
        trainer.train(
            sampler,
            dataset=data,
            durations=durations,
            max_steps=STEPS,
            resume_from="latest" if mode == "resume" else None,
        )
    except TrainingInterrupted as stop:
        record = {
            "step": stop.step,
            "signal": stop.signal_name,
            "status": stop.exit_status,
            "checkpoint": None if stop.checkpoint is None else str(stop.checkpoint),
        }
        (out / f"stopped-rank{rank}.json").write_text(json.dumps(record))
        return stop.exit_status
    except OSError as exc:
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # to record the error
        record = {"type": type(exc).__name__, "message": str(exc)}
        (out / f"error-rank{rank}.json").write_text(json.dumps(record))
        return 1
    if rank == 0:
        torch.save(trainer.unwrapped_model.state_dict(), out / "final.pt")
    return 0


if __name__ == "__main__":
    status = main(Path(sys.argv[1]), sys.argv[2])
    print(f"rank {os.environ['RANK']}: main returned {status}", file=sys.stderr, flush=True)
    exit_process(status)
