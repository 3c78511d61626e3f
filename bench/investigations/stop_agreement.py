"""What the per-step stop agreement costs: one all-reduce of one integer across processes.

Question (2026-11-28): What does the trainer's per-step stop agreement (one all-reduce of one
integer across processes) cost?

Answer: Little: median 407 us a step on 2 gloo CPU processes, against 5.6 ms for the all-reduce
of conformer-ctc-tiny's 1.1 M gradients that DDP makes every step anyway (docs/reliability.md).

Run: ``PYTHONPATH=src .venv/bin/python -m bench investigations.stop_agreement`` (it starts itself under
``torch.distributed.run`` with ``--processes`` CPU processes on gloo).

Each process times :meth:`asrfit.train.interrupt.InterruptRequest.agreed` (what the trainer
calls after every optimizer step with several processes) over ``--calls`` calls after 50
warm-up calls, ``--rounds`` times, and for scale one all-reduce of the gradients DDP already
makes every step: ``--parameters`` float32 values (1.1 M: ``conformer-ctc-tiny``). Rank 0
prints the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _measure(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from asrfit.train.interrupt import InterruptRequest

    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    class Processes:  # what agreed() reads of an Accelerator
        num_processes = dist.get_world_size()
        process_index = dist.get_rank()
        device = torch.device("cpu")

    request, acc = InterruptRequest(), Processes()
    for _ in range(50):
        request.agreed(acc)
    check = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.calls):
            request.agreed(acc)
        check.append((time.perf_counter() - start) / args.calls)
    grads = torch.zeros(args.parameters)
    for _ in range(3):
        dist.all_reduce(grads)
    reduce = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(grads)
        reduce.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"processes: {dist.get_world_size()} (gloo, CPU), torch {torch.__version__}")
        print(
            f"stop agreement (one int64 all-reduce): median {1e6 * statistics.median(check):.0f} us per step "
            f"({args.rounds} rounds of {args.calls} calls)"
        )
        print(
            f"gradient all-reduce of {args.parameters:,} float32 (DDP, every step): "
            f"median {1e3 * statistics.median(reduce):.2f} ms"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parameters", type=int, default=1_100_000)
    args = parser.parse_args()
    if "RANK" in os.environ:
        _measure(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(args.processes),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "0",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "127.0.0.1:0",
        __file__,
        *sys.argv[1:],
    ]
    raise SystemExit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
