"""Measure this host's rates, then time and predict the step-time test's cases; print JSON.

Run by ``tests/test_step_time.py`` in a process of its own, as ``bench/step_time_accuracy.py``
runs (one thread; glibc keeping freed memory, as ``asrfit train`` does on a CPU).
Usage: ``python tests/_step_time_child.py ROUNDS WARMUP STEPS``.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from asrfit.profiles.host import measure_host_rates
from bench import _grid
from bench._timing import time_cases

# The base setups of the held-out families of docs/benchmarks.md, "Step time: predicted vs
# measured (CPU)": the cases behind its held-out figure.
CASES = [
    _grid.Case("hubert", "fp32", False, "adafactor", 2, 1.5, 10),
    _grid.Case("wavlm", "fp32", False, "sgd", 2, 1.0, 8),
    _grid.Case("parakeet-tdt", "fp32", False, "adamw", 2, 1.5, 10),
]


def main() -> None:
    rounds, warmup, steps = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    rates = measure_host_rates(1, passes=2)  # as the published run's rates: best of 2 passes
    rows = time_cases(CASES, rates, warmup=warmup, steps=steps, rounds=rounds)
    out = []
    for row in rows:
        chunks = [row.steps_seconds[i : i + steps] for i in range(0, len(row.steps_seconds), steps)]
        out.append(
            {
                "case": row.case.name,
                "predicted_seconds": row.predicted_seconds,
                "round_medians": [statistics.median(c) for c in chunks],
                "load": [row.load_before, row.load_after],
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
