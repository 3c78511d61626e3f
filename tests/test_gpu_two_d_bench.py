"""The arithmetic of ``bench/gpu_two_d.py``: dataset throughput and the unmeasured buckets.

The GPU run itself cannot run here; what turns its step times into the figures in
``docs/benchmarks.md`` can, checked against hand computations.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

_saved = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
from bench import gpu_two_d  # noqa: E402  (sets PYTORCH_CUDA_ALLOC_CONF for a GPU run: undone below)

if _saved is None:
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
else:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = _saved


def _bucket(upper: float, batch: int, fraction: float, mean: float, step: float) -> dict:
    return {
        "seconds": [upper - 1.0, upper],
        "labels": [0, 10],
        "batch": batch,
        "frames": int(upper * 100),
        "fraction": fraction,
        "mean_seconds": mean,
        "predicted_step_seconds": step,
        "predicted_reserved_bytes": 2**30,
    }


def test_throughput_is_audio_over_wall_seconds_of_the_whole_dataset() -> None:
    # 1000 utterances: 600 of 4 s mean in batches of 10 taking 2 s, 400 of 9 s in batches
    # of 4 taking 3 s: 6000 audio s over (60 x 2 + 100 x 3) wall s.
    buckets = [_bucket(5, 10, 0.6, 4.0, 2.0), _bucket(10, 4, 0.4, 9.0, 3.0)]
    expected = (600 * 4 + 400 * 9) / (60 * 2 + 100 * 3)
    assert gpu_two_d.throughput(buckets, "predicted_step_seconds") == pytest.approx(expected)


def test_missing_steps_take_the_interpolated_ratio_of_their_neighbours() -> None:
    buckets = [_bucket(u, 8, 0.25, u - 0.5, 1.0) for u in (2.0, 3.0, 4.0, 6.0)]
    measured = [1.2, None, 1.6, None]  # ratios 1.2 at 2 s and 1.6 at 4 s
    assert gpu_two_d.filled_steps(buckets, measured, "interpolate") == pytest.approx(
        [1.2, 1.4, 1.6, 1.6]  # halfway; beyond the last measured, its ratio
    )
    assert gpu_two_d.filled_steps(buckets, measured, "low") == pytest.approx([1.2, 1.2, 1.6, 1.2])
    assert gpu_two_d.filled_steps(buckets, measured, "high") == pytest.approx([1.2, 1.6, 1.6, 1.6])


def test_the_committed_measurement_renders_every_shape_it_holds() -> None:
    data = BENCH / "data"
    plans = json.loads((data / "gpu-two-d-plans-H200.json").read_text(encoding="utf-8"))
    measured = json.loads((data / "gpu-two-d-measured-H200.json").read_text(encoding="utf-8"))
    text = gpu_two_d.render(plans, measured)
    rows = [line for line in text.splitlines() if line.startswith(("| 1-D |", "| 2-D |"))]
    shape_rows = [r for r in rows if r.count("|") > 8]
    # every measured shape of each plan is listed (shapes the two plans share, twice)
    listed = sum(
        gpu_two_d._shape_key(plans[m]["setup"], b) in measured["shapes"]
        for m in ("1d", "2d")
        for b in plans[m]["buckets"]
    )
    assert len(shape_rows) == listed
    assert "incomplete" not in text
