"""Parakeet-TDT traces with the loss's diagonal loop sampled, against the full loop.

Question (2026-11-25): Does tracing a few representative anti-diagonals of the TDT loss's
lattice give the same step as tracing the whole loop?

Answer: Yes: on three Parakeet-TDT-0.6B shapes no test uses, every phase's peak equal to the
byte, the priced kernel rows within 0.13 % in calls and 0.06 % in bytes, at 3.1-5.5x less CPU
per trace (docs/benchmarks.md, "Sampled against full"); ``tests/test_lattice.py`` checks it on a
tiny model.

Run: ``python -m bench investigations.lattice_sampling`` (about 3 minutes on 2 cores). For Parakeet-TDT-0.6B
(the bundled config, fake tensors) at three shapes that no test uses, one step is traced
with every anti-diagonal of the loss's lattice (``sample_lattice=False``) and with a few
representative ones (:mod:`asrfit.memory.trace.lattice`); prints the peaks, whether every phase's
peak is equal, the kernel rows the step-time model prices, and the CPU time of each trace.
"""

from __future__ import annotations

import logging
import time

from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape

CASES = [
    (BatchShape(2, 500, 40), Setup(precision=Precision.BF16, optimizer=OptimizerKind.SGD)),
    (BatchShape(4, 1500, 90), Setup(gradient_checkpointing=True, optimizer=OptimizerKind.SGD)),
    (
        BatchShape(8, 800, 50),
        Setup(precision=Precision.BF16, checkpoint_layers=12, optimizer=OptimizerKind.ADAMW),
    ),
]


def main() -> None:
    logging.disable(logging.WARNING)
    adapter, _ = resolve_adapter("parakeet-tdt-0.6b-v2")
    simulate_step(adapter, BatchShape(1, 200, 4), Setup(), steps=1)  # imports, first-call work
    print(
        "| batch (B, mel frames, labels) | setup | full peak MiB | sampled peak MiB | diff bytes "
        "| phase peaks equal | calls full / sampled | bytes moved diff "
        "| traced calls full / sampled | CPU s full / sampled |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for batch, setup in CASES:
        steps = 2 if setup.optimizer is OptimizerKind.ADAMW else 1  # the state in step 2
        runs, cpu = {}, {}
        for sampled in (False, True):
            started = time.process_time()
            runs[sampled] = simulate_step(
                adapter, batch, setup, steps=steps, sample_lattice=sampled
            )
            cpu[sampled] = time.process_time() - started
        f, q = runs[False], runs[True]
        print(
            f"| {batch.batch_size}, {batch.input_length}, {batch.label_length} "
            f"| {setup.describe()} | {f.peak_bytes / 2**20:,.1f} | {q.peak_bytes / 2**20:,.1f} "
            f"| {q.peak_bytes - f.peak_bytes:+,} | {f.phase_peaks_bytes == q.phase_peaks_bytes} "
            f"| {f.cost.calls:,} / {q.cost.calls:,} "
            f"| {100 * (q.cost.bytes_moved / f.cost.bytes_moved - 1):+.2f} % "
            f"| {f.traced_calls:,} / {q.traced_calls:,} | {cpu[False]:.1f} / {cpu[True]:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
