"""``bench/gpu_check.py --dry-run``: every code path of the GPU check runs on this CPU
(tiny cases, a synthetic boundary, the demo trained for three steps) and renders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_dry_on_a_cpu(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ASRFIT_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    predictions, out = tmp_path / "predictions.json", tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "bench",
        "gpu_check",
        "--dry-run",
        "--predict",
        str(predictions),
        "--predictions",
        str(predictions),
        "--measure",
        str(out),
        "--work",
        str(tmp_path / "work"),
        "--render",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    pred = json.loads(predictions.read_text())
    assert pred["boundary"][0]["predicted_batch"] > 0 and pred["heldout"][0]["cost_rows"]
    result = json.loads((out / "gpu_check.json").read_text())
    phases = result["phases"]
    assert "failure" not in phases["heldout"][0] and phases["heldout"][0]["step_seconds"] > 0
    assert phases["boundary"][0]["largest_batch"] == 7  # the synthetic limit: b <= 7 runs
    assert "failure" not in phases["demo"], phases["demo"]
    assert phases["demo"]["report"]["epochs"]
    assert "Trained end to end on cpu" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json"]
