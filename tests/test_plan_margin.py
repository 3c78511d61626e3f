"""The planner's safety margin covers the simulator's worst measured under-prediction."""

from __future__ import annotations

import re
from pathlib import Path

from asrfit.plan import margin

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def test_constant_covers_the_benchmarked_worst_under_prediction() -> None:
    """WORST_UNDER_PREDICTION_PCT is at least every held-out group's figure in docs/benchmarks.md."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("<!-- memory-accuracy-heldout:start -->")[1].split(
        "<!-- memory-accuracy-heldout:end -->"
    )[0]
    # every group of the section: the held-out cases and those used since to find a mechanism
    found = re.findall(r"worst under-prediction \*\*([-+0-9.]+) %\*\*", section)
    assert len(found) >= 2
    assert max(abs(float(x)) for x in found) <= margin.WORST_UNDER_PREDICTION_PCT


def test_default_margin_is_kept_and_explained() -> None:
    usable, reason = margin.applied_margin(17_000, 0.85)
    assert usable == 17_000
    assert "85%" in reason and "under-prediction" in reason


def test_margin_too_thin_is_lowered(monkeypatch) -> None:
    monkeypatch.setattr(margin, "WORST_UNDER_PREDICTION_PCT", 3.0)
    usable, reason = margin.applied_margin(98_000, 0.98)
    assert usable == int(98_000 * 0.97)
    assert "lowered" in reason


def test_gpu_constant_covers_every_gpu_check_run() -> None:
    """WORST_GPU_RESERVED_UNDER_PREDICTION_PCT covers every committed GPU check: its held-out
    steps' reserved memory (predicted against max_memory_reserved) and its boundaries (a
    predicted largest batch above the one that ran is an under-prediction)."""
    import json

    data = Path(__file__).resolve().parents[1] / "bench" / "data"
    predictions = json.loads((data / "gpu-check-predictions.json").read_text(encoding="utf-8"))
    predicted = {r["case"]: r for r in predictions["heldout"]}
    boundaries = {r["case"]: r["predicted_batch"] for r in predictions["boundary"]}
    runs = sorted(data.glob("gpu-check-*/gpu_check.json"))
    assert runs, "no committed GPU check run"
    worst, compared = 0.0, 0
    for run in runs:
        phases = json.loads(run.read_text(encoding="utf-8"))["phases"]
        for row in phases["heldout"]:
            if "reserved_bytes" in row:
                shortfall = 1.0 - predicted[row["case"]]["reserved_bytes"] / row["reserved_bytes"]
                worst, compared = max(worst, 100.0 * shortfall), compared + 1
        for row in phases["boundary"]:
            if row.get("largest_batch"):
                over = boundaries[row["case"]] / row["largest_batch"] - 1.0
                worst, compared = max(worst, 100.0 * over), compared + 1
    assert compared >= 10
    assert worst <= margin.WORST_GPU_RESERVED_UNDER_PREDICTION_PCT
