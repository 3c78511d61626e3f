"""The planner's optimizer-state traces: the full step against the optimizer step alone.

Question (2026-11-25): Does tracing the optimizer step alone (each parameter given a gradient of
its own shape) give the full step's optimizer phase?

Answer: Yes: the optimizer phase's and ``zero_grad``'s peaks, the state, the parameters and the
optimizer's kernel rows equal to the byte for wav2vec2-base, whisper-small and
parakeet-tdt-0.6b-v2 with AdamW, Adafactor and 8-bit AdamW (and XLS-R-1B at reduced depth), at
1.6-3.4x less CPU per trace (docs/benchmarks.md, "the optimizer-state traces without forward and
backward").

The planner traces one tiny step per (precision, optimizer) for the optimizer phase's peak
and the model states, neither of which depends on the batch. That trace used to run the
forward and backward pass first; now (``simulate_step(..., forward_backward=False)``) each
trainable parameter gets a gradient of its own shape, as backward leaves it, and only the
optimizer step is traced. This bench traces both ways, one after the other in one process,
and checks that the optimizer phase's peak, the state, the parameters and the optimizer's
kernel rows are the same.

Run: ``PYTHONPATH=src python -m bench investigations.optimizer_alone [--models wav2vec2-base whisper-small
parakeet-tdt-0.6b-v2] [--scaled]``; ``--scaled`` traces through ``scaled_step`` as the planner
does (repeated layers at reduced depth where that is worth it: XLS-R-1B). CPU seconds are this
process's own, per trace.
"""

from __future__ import annotations

import argparse
import logging
import time

from asrfit.memory.fit.depth import scaled_step
from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import StepMemory, simulate_step
from asrfit.memory.step import BatchShape
from asrfit.plan.costs import DEPTH_WORTH

# (precision, input length of about 1 s as the planner's tiny shape: samples, or mel frames;
# Whisper's encoder takes 30 s)
CASES = {
    "wav2vec2-base": ("fp16", 16_000),
    "whisper-small": ("bf16", 3_000),
    "parakeet-tdt-0.6b-v2": ("bf16", 100),
    "xls-r-300m": ("bf16", 16_000),
    "xls-r-1b": ("bf16", 16_000),
}
PHASES = ("optimizer", "zero_grad")


def _same(a: StepMemory, b: StepMemory) -> bool:
    return (
        a.phase_peaks_bytes.get("optimizer") == b.phase_peaks_bytes.get("optimizer")
        and a.phase_peaks_bytes.get("zero_grad") == b.phase_peaks_bytes.get("zero_grad")
        and a.optimizer_state_bytes == b.optimizer_state_bytes
        and a.breakdown_bytes["parameters"] == b.breakdown_bytes["parameters"]
        and a.cost.select(PHASES).rows == b.cost.select(PHASES).rows
    )


def main() -> None:
    """Trace each model's optimizer-state steps both ways and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["wav2vec2-base", "whisper-small", "parakeet-tdt-0.6b-v2"]
    )
    parser.add_argument("--scaled", action="store_true", help="trace as the planner does")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    trace = (
        (lambda *a, **k: scaled_step(*a, worth=DEPTH_WORTH, **k)) if args.scaled else simulate_step
    )
    print(
        "| model | precision | optimizer | full step CPU s | optimizer alone CPU s | optimizer-phase peak MiB | same |"
    )
    print("|---|---|---|---:|---:|---:|---|")
    for name in args.models:
        precision, length = CASES[name]
        adapter, _ = resolve_adapter(name)
        shape = BatchShape(1, length, 1)
        simulate_step(adapter, shape, Setup(precision=precision), steps=1)  # imports, caches
        for optimizer in ("adamw", "adafactor", "adamw8bit"):
            setup = Setup(precision=precision, optimizer=optimizer)
            started = time.process_time()
            full = trace(adapter, shape, setup, steps=1)
            middle = time.process_time()
            alone = trace(adapter, shape, setup, steps=1, forward_backward=False)
            ended = time.process_time()
            print(
                f"| {name} | {precision} | {optimizer} | {middle - started:.2f} | "
                f"{ended - middle:.2f} | {alone.phase_peaks_bytes['optimizer'] / 2**20:,.1f} | "
                f"{_same(full, alone)} |"
            )


if __name__ == "__main__":
    main()
