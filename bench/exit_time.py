"""A planning process's floor: importing the planner and building a model, then exiting.

Run: ``PYTHONPATH=src .venv/bin/python -m bench exit_time [--models wav2vec2-base ...]
[--runs 3] [--out docs/benchmarks.md]``

Each run is a fresh interpreter with an empty cache that imports the planner, builds the
model on the meta device (``resolve_adapter``) and imports the tracer: what every cold plan
does before its first trace. It then exits either plainly or as ``asrfit plan`` does
(:func:`asrfit.utils.quick_exit.freeze_at_exit`), the two alternating. Reported: seconds
from the interpreter's start to the model built, and from there to the process's end
(seen from this process), median of ``--runs`` each.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._report import write_section

SECTION = "exit-time"
CHILD = """
import sys, time
from asrfit.memory.report import resolve_adapter
adapter = resolve_adapter(sys.argv[1])
import asrfit.memory.simulate, asrfit.memory.trace.tracker
if sys.argv[2] == "quick":
    from asrfit.utils.quick_exit import freeze_at_exit
    freeze_at_exit()
print(time.time(), flush=True)
"""
MODELS = ("wav2vec2-base", "whisper-small", "xls-r-1b", "parakeet-tdt-0.6b-v2")


def once(model: str, how: str) -> tuple[float, float]:
    """(start to model built, model built to process end) in seconds, one fresh process."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "ASRFIT_CACHE_DIR": cache}
        start = time.time()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, model, how],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        end = time.time()
    built = float(done.stdout.split()[-1])
    return built - start, end - built


def main() -> None:
    """Time each model's floor and exit both ways, alternating; print (and write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the section here")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        got: dict[str, list[tuple[float, float]]] = {"plain": [], "quick": []}
        for _ in range(args.runs):
            for how in got:
                got[how].append(once(model, how))
        load = os.getloadavg()[0]
        built = statistics.median(r[0] for runs in got.values() for r in runs)
        plain = statistics.median(r[1] for r in got["plain"])
        quick = statistics.median(r[1] for r in got["quick"])
        rows.append(
            f"| {model} | {built:.1f} | {plain:.2f} ({', '.join(f'{r[1]:.2f}' for r in got['plain'])}) "
            f"| {quick:.2f} ({', '.join(f'{r[1]:.2f}' for r in got['quick'])}) | {load:.1f} |"
        )
        print(rows[-1], flush=True)
    body = "\n".join(
        [
            "## A planning process's floor, and its exit",
            "",
            "Command: `PYTHONPATH=src .venv/bin/python -m bench exit_time --out docs/benchmarks.md`",
            "",
            f"Host: {os.cpu_count()} CPUs, {platform.machine()}, no GPU. Each run is a fresh "
            "interpreter with an empty cache that imports the planner, builds the model on the "
            "meta device and imports the tracer (what a cold plan does before its first trace), "
            f"then exits plainly or as `asrfit plan` does (the garbage collector's objects "
            f"frozen at exit: `asrfit.utils.quick_exit`), the two alternating, {args.runs} runs "
            "each. Seconds seen from the parent process.",
            "",
            "| model | start to model built, median s | exit, plain: median s (each) "
            "| exit, as `asrfit plan`: median s (each) | load after |",
            "|---|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(body)
    if args.out is not None:
        write_section(args.out, SECTION, body)


if __name__ == "__main__":
    main()
