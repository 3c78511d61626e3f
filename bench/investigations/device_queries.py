"""One traced step with ``prim.device`` answered in asrfit's outermost dispatch mode, and without.

Question (2026-11-25): Does answering ``prim.device`` in asrfit's outermost dispatch mode (as
``FakeTensor`` does) make a trace cheaper without changing the step?

Answer: Yes: 1.07-1.18x less CPU per trace (wav2vec2-base, whisper-small, parakeet-ctc-0.6b), a
third of the ops reaching the tracker, and the same step (peak, phase peaks, categories, FLOPs,
every kernel row) (docs/benchmarks.md, "Cold: device queries"). ``tests/test_simulator.py``
checks the equality.

Every ``tensor.device`` of a fake tensor is a ``prim.device`` op that travels down the whole
dispatch-mode stack of a trace (asrfit's op counter, composite and accumulation watchers,
storage tracker, then ``FakeTensorMode``). asrfit's modes now answer it themselves, as
``FakeTensor`` does (``asrfit.memory.trace.values.device_query``). This bench traces the same step
with the shortcut on and off, alternating in one process (so that load hits both alike), and
checks that the two steps are the same (peak, phase peaks, categories, FLOPs, kernel rows).

Run: ``PYTHONPATH=src python -m bench investigations.device_queries [--models wav2vec2-base whisper-small]
[--repeats 3]``. CPU seconds are this process's own (``time.process_time``), per trace.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import StepMemory, simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.trace import tracker as tracker_module
from asrfit.memory.trace import values

# one step each, as the planner traces them: a long batch, mixed precision, AdamW
CASES = {
    "wav2vec2-base": (BatchShape(2, 392_000, 380), Setup(precision="fp16", optimizer="adamw")),
    "whisper-small": (BatchShape(4, 3_000, 120), Setup(precision="bf16", optimizer="adamw")),
    "parakeet-ctc-0.6b": (BatchShape(2, 2_000, 100), Setup(precision="bf16", optimizer="adamw")),
}


def _same(a: StepMemory, b: StepMemory) -> bool:
    return (
        a.peak_bytes == b.peak_bytes
        and a.phase_peaks_bytes == b.phase_peaks_bytes
        and a.breakdown_bytes == b.breakdown_bytes
        and a.flops == b.flops
        and a.cost.rows == b.cost.rows
    )


def main() -> None:
    """Trace each model's step with the shortcut on and off and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["wav2vec2-base", "whisper-small"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    dispatch = tracker_module.StorageTracker.__torch_dispatch__
    reached: list[int] = []

    def counting(self: object, func: object, *rest: object) -> object:
        reached.append(1)
        return dispatch(self, func, *rest)  # type: ignore[arg-type]

    tracker_module.StorageTracker.__torch_dispatch__ = counting  # type: ignore[method-assign]
    print(
        "| model | batch (B, T, U), setup | CPU s on | CPU s off | off / on | ops reaching the tracker, on / off | same step |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for name in args.models:
        shape, setup = CASES[name]
        adapter, _ = resolve_adapter(name)
        simulate_step(adapter, shape, setup, steps=1)  # imports, caches
        seconds: dict[bool, list[float]] = {True: [], False: []}
        steps: dict[bool, StepMemory] = {}
        ops: dict[bool, int] = {}
        for _ in range(args.repeats):
            for on in (True, False):
                values.shortcut_device_queries = on
                reached.clear()
                started = time.process_time()
                steps[on] = simulate_step(adapter, shape, setup, steps=1)
                seconds[on].append(time.process_time() - started)
                ops[on] = len(reached)
        values.shortcut_device_queries = True
        on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
        print(
            f"| {name} | {shape.batch_size}, {shape.input_length}, {shape.label_length}; "
            f"{setup.describe()} | {on:.2f} | {off:.2f} | {off / on:.2f}x | "
            f"{ops[True]:,} / {ops[False]:,} | {_same(steps[True], steps[False])} |"
        )


if __name__ == "__main__":
    main()
