"""The CPU step-time model against real steps: three small models of the held-out families,
predicted on fake tensors and timed on this machine."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).resolve().parent / "_step_time_child.py"

# docs/benchmarks.md, "Step time: predicted vs measured (CPU)": held out (other families, not
# fitted), vs the median step: median |error| 7.6 %.
PUBLISHED_HELD_OUT = 0.076
# On a shared machine a whole round can run 1.3-1.5x slow (the same section); the best of
# three interleaved rounds drops most of that, and this allowance takes the rest.
SHARED_MACHINE_ALLOWANCE = 0.124
# Round medians of one case within this ratio: the rounds agree, the machine was quiet enough.
QUIET_SPREAD = 1.25
MAX_CHILD_RUNS = 3


@pytest.mark.slow
def test_predicted_step_times_are_within_the_published_error() -> None:
    cores = os.cpu_count() or 1
    if os.getloadavg()[0] > cores:
        pytest.skip(
            f"load average {os.getloadavg()[0]:.1f} on {cores} cores: other processes would "
            "be timed with the steps"
        )
    env = {k: v for k, v in os.environ.items() if k != "ASRFIT_HOST_MALLOC"}
    env["OMP_NUM_THREADS"] = "1"
    # the child imports bench.*: the repository root on its path, beside the package's source
    root = CHILD.parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root)])
    rows: list[dict] = []
    for _ in range(MAX_CHILD_RUNS):
        result = subprocess.run(
            [sys.executable, str(CHILD), "3", "3", "5"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        fresh = json.loads(result.stdout.strip().splitlines()[-1])
        if not rows:
            rows = fresh
        else:  # the same cases timed again: more rounds for each case's best
            for row, again in zip(rows, fresh, strict=True):
                assert row["case"] == again["case"]
                row["round_medians"] += again["round_medians"]
                row["load"] = [
                    min(row["load"][0], again["load"][0]),
                    max(row["load"][1], again["load"][1]),
                ]
        # a busy moment slows whole rounds, never speeds one up: where a case's rounds disagree
        # by more than a quiet machine's spread, its best round may still be a slow one, so
        # time every case again, until one run's rounds agree (the bound is not widened)
        if all(max(r["round_medians"]) <= QUIET_SPREAD * min(r["round_medians"]) for r in fresh):
            break
    errors = []
    for row in rows:
        measured = min(row["round_medians"])  # the best of the interleaved rounds
        errors.append(abs(row["predicted_seconds"] - measured) / measured)
    table = "\n".join(
        f"{r['case']}: predicted {r['predicted_seconds'] * 1e3:.1f} ms, round medians "
        + " / ".join(f"{m * 1e3:.1f}" for m in r["round_medians"])
        + f" ms, |error| {e:.1%}, load {r['load'][0]:.1f}-{r['load'][1]:.1f}"
        for r, e in zip(rows, errors, strict=True)
    )
    assert len(rows) == 3
    # The absolute error is printed, not asserted: it carries a host-wide factor (the CI host
    # ran these cases 27-30 % faster than predicted, another 2-core host a median 28 % slower:
    # docs/step_time.md, "Other hosts"), which is what `asrfit calibrate` is for. Relative
    # times decide between setups and the factor cancels in them: each time over the
    # geometric mean of the three, predicted against measured.
    predicted = [r["predicted_seconds"] for r in rows]
    measured = [min(r["round_medians"]) for r in rows]
    relative = [
        abs(
            (p / statistics.geometric_mean(predicted)) / (m / statistics.geometric_mean(measured))
            - 1
        )
        for p, m in zip(predicted, measured, strict=True)
    ]
    assert statistics.median(relative) <= PUBLISHED_HELD_OUT + SHARED_MACHINE_ALLOWANCE, (
        "relative errors " + ", ".join(f"{e:.1%}" for e in relative) + "\n" + table
    )
