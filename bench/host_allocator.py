"""What glibc's defaults cost a CPU training step, and what keeping freed memory gives back.

Run: ``PYTHONPATH=src .venv/bin/python -m bench host_allocator --out docs/benchmarks.md``

Each measurement runs in a fresh interpreter, once with ``ASRFIT_HOST_MALLOC=default``
(glibc's own settings) and once with :func:`asrfit.train.host_allocator.keep_freed_host_memory`
applied, the two alternating over ``--rounds`` so that a change of load falls on both:

- writing 64 MiB (``fill_``) into a freshly allocated tensor, and into one reused tensor;
- a training step of the built-in Conformer-CTC (``--size``, fp32 AdamW, padded batch, as
  ``bench/conformer_step_profile.py`` builds it:
  ``--batch`` x ``--frames`` log-mel frames, ``--threads`` torch threads): median of
  ``--steps`` after 3 warm-up steps, with the process's peak RSS; beside it the step-time
  model's prediction for the same step on this machine's rates
  (:func:`asrfit.memory.steptime.runtime.step_seconds`), which prices memory already mapped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench._report import write_section

SECTION = "host-allocator"
COMMAND = "PYTHONPATH=src .venv/bin/python -m bench host_allocator --out docs/benchmarks.md"

CHILD = r"""
import json, resource, statistics, sys, time
import torch
from asrfit.train.host_allocator import keep_freed_host_memory
from bench.conformer_step_profile import conformer_train_step
size, batch, frames, threads, steps = sys.argv[1], *map(int, sys.argv[2:6])
applied = keep_freed_host_memory()
torch.set_num_threads(threads)
n = 64 * 2**20 // 4
def best_rate(fn):
    times = []
    for _ in range(7):
        started = time.perf_counter(); fn(); times.append(time.perf_counter() - started)
    return 64 * 2**20 / min(times[2:]) / 1e9
fresh = best_rate(lambda: torch.empty(n).fill_(1.0))
buffer = torch.empty(n)
reused = best_rate(lambda: buffer.fill_(1.0))
del buffer
step = conformer_train_step(size, batch, frames, frames // 12, padded=frames // 5)
for _ in range(3):
    step()
times = []
for _ in range(steps):
    started = time.perf_counter(); step(); times.append(time.perf_counter() - started)
print(json.dumps({"applied": applied, "fresh": fresh, "reused": reused,
                  "step": statistics.median(times), "steps": times,
                  "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _child(mode: str, args: argparse.Namespace) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "src"), str(root)]))
    env.pop("ASRFIT_HOST_MALLOC", None)
    if mode == "default":
        env["ASRFIT_HOST_MALLOC"] = "default"
    argv = [str(v) for v in (args.size, args.batch, args.frames, args.threads, args.steps)]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _predicted_seconds(args: argparse.Namespace) -> float:
    from asrfit.memory.report import resolve_adapter
    from asrfit.memory.setup import Setup
    from asrfit.memory.simulate import simulate_step
    from asrfit.memory.step import BatchShape
    from asrfit.memory.steptime.runtime import step_seconds
    from asrfit.profiles.host import host_rates

    adapter, _ = resolve_adapter(f"conformer-ctc-{args.size}")
    shape = BatchShape(args.batch, args.frames, args.frames // 12)
    sim = simulate_step(adapter, shape, Setup(optimizer="adamw"), target="cpu")
    return step_seconds(sim.cost, host_rates(args.threads))


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=350)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"default": [], "kept": []}
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for mode in runs:
            runs[mode].append(_child(mode, args))
    load_after = os.getloadavg()[0]
    predicted = _predicted_seconds(args)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## CPU training steps: glibc's malloc defaults vs keeping freed memory",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Run {when}, conformer-ctc-{args.size}, fp32 AdamW, batch {args.batch} x "
        f"{args.frames} frames, {args.threads} thread(s); {args.rounds} fresh processes per "
        f"setting, alternating; medians over the processes; 1-minute load {load_before:.1f} "
        f"before, {load_after:.1f} after.",
        "",
        "| malloc | write 64 MiB, fresh tensor | write 64 MiB, reused tensor | step (median) "
        "| step-time model | peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode, label in (("default", "glibc defaults"), ("kept", "keeps freed memory")):
        lines.append(
            f"| {label} | {med(mode, 'fresh'):.1f} GB/s | {med(mode, 'reused'):.1f} GB/s "
            f"| {med(mode, 'step') * 1e3:.0f} ms | {predicted * 1e3:.0f} ms "
            f"| {med(mode, 'max_rss') / 2**20:.0f} MiB |"
        )
    ratio = med("default", "step") / med("kept", "step")
    lines += ["", f"Step with glibc defaults / step with freed memory kept: {ratio:.2f}x."]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        write_section(args.out, SECTION, text)


if __name__ == "__main__":
    main()
