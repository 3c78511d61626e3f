"""One traced step with a large boolean mask: host time and memory of the boolean-index handler.

Question (2026-11-24): Does the boolean-index handler's counting of a large mask's positions
(instead of building them with a real ``nonzero`` on the host) save a trace's host time and
memory?

Answer: Yes: on a (600, 1599, 64) mask, 4.25 against 6.62 CPU s and a peak RSS of 554 against
2,018 MiB, the same traced peak (28,264,872,960 bytes) (docs/benchmarks.md, "Boolean masks").

wav2vec2-style encoders zero padded frames with ``hidden[~mask] = 0`` on a ``(B, F, D)`` mask
too large for a shadow value. Before, the handler built the positions of every element on
the host (a real ``nonzero``); now it counts them. The step is the tiny wav2vec2 of
``tests/test_plan.py`` (layer-norm feature encoder, so it takes an attention mask).

Run: ``PYTHONPATH=src python -m bench investigations.datadep_speed [--batch 600] [--baseline-src DIR]``, where
DIR holds an older ``asrfit`` package (``git archive <commit> src | tar -x -C /tmp/base``, then
``/tmp/base/src``) whose ``memory/trace/datadep.py`` handlers are swapped in for the second run.
Each run is a fresh process; the peaks must be equal.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

RUN = """
import importlib.util, json, resource, sys, time
from asrfit.memory.trace import tracker
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.step import BatchShape
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from tests.test_plan import _tiny_config
if {old!r}:
    spec = importlib.util.spec_from_file_location("base_datadep", {old!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tracker.datadep = module
c = time.process_time()
r = simulate_step(hf_adapter(_tiny_config()), BatchShape({batch}, 32000, 40), Setup(optimizer="sgd"), steps=1)
print("RESULT " + json.dumps({{"cpu_seconds": time.process_time() - c, "peak_bytes": r.peak_bytes,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def _run(batch: int, old: str) -> dict:
    import json

    root = str(Path(__file__).resolve().parent.parent)
    code = RUN.format(old=old, batch=batch)
    path = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=600)
    parser.add_argument("--baseline-src", default="")
    args = parser.parse_args()
    runs = {"this checkout": _run(args.batch, "")}
    if args.baseline_src:
        path = str(Path(args.baseline_src) / "asrfit" / "memory" / "datadep.py")
        runs[f"datadep.py from {args.baseline_src}"] = _run(args.batch, path)
    print(f"batch {args.batch} x 2 s, mask (B, 1599, 64); load {os.getloadavg()[0]:.1f}")
    print("| handlers | CPU s | peak RSS MiB | traced peak bytes |\n|---|---:|---:|---:|")
    for name, r in runs.items():
        print(f"| {name} | {r['cpu_seconds']:.2f} | {r['rss_mib']:,.0f} | {r['peak_bytes']:,} |")


if __name__ == "__main__":
    main()
