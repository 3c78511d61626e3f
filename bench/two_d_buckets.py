"""Predicted throughput of duration buckets (1-D) vs duration x label buckets (2-D).

Run: ``python -m bench two_d_buckets [--out docs/benchmarks.md]``. For each (model, GPU) the
planner runs twice in one fresh subprocess on a LibriSpeech-like manifest (durations of
train-clean-100's shape, transcripts whose speaking rate varies per utterance,
``bench/_corpora.py``): ``bucketing="1d"`` and ``bucketing="2d"``, sharing the simulation
cache, so the 2-D plan costs its two label traces. With ``--memory-factors F ...`` both are
also planned for the same GPU with F times its memory (the catalog entry's bytes scaled,
nothing else changed): the gain that batches less limited by memory would give under the
same step-time model, the yardstick for 2-D bins, which free memory only where transcripts
are short (and pad labels less there). The target is one audio hour per
optimizer step, which leaves micro-batches uncapped (a target in utterances caps them at
the target and hides what memory allows). Both figures are the planner's predictions on
the named GPU (none is here); the 1-D baseline already assumes the 95th-percentile
speaking rate per bucket, not the longest transcript a fixed-batch 1-D config must hold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from bench._corpora import write_librispeech_like
from bench._report import write_section

PLAN = """
import dataclasses, json, logging, time
logging.disable(logging.WARNING)
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.plan.search import plan
ds = DatasetProfile.from_manifest({manifest!r})
out = {{}}
for factor in (1.0, *{factors!r}):
  hw = HardwareProfile.from_name({gpu!r})
  hw.gpus = [dataclasses.replace(g, total_bytes=int(g.total_bytes * factor),
                                 free_bytes=int(g.free_bytes * factor)) for g in hw.gpus]
  for mode in ("1d", "2d"):
    t = time.perf_counter()
    p = plan(hw, ds, {model!r}, target_hours=1.0, bucketing=mode)
    out[mode if factor == 1.0 else f"{{mode}}x{{factor:g}}"] = {{"seconds": time.perf_counter() - t, "setup": p.setup.describe(),
                 "throughput": p.predicted_throughput_seconds_per_second,
                 "buckets": len(p.buckets), "reason": p.bucketing_reason,
                 "batches": [[b.max_seconds, b.min_label_length, b.max_label_length, b.batch_size] for b in p.buckets]}}
print("RESULT " + json.dumps(out))
"""

CASES = (("parakeet-tdt-0.6b-v2", "A100-80GB"), ("whisper-small", "A10G"))


def run(manifest: Path, cache: Path, model: str, gpu: str, factors: tuple[float, ...] = ()) -> dict:
    env = {**os.environ, "ASRFIT_CACHE_DIR": str(cache)}
    code = PLAN.format(manifest=str(manifest), model=model, gpu=gpu, factors=tuple(factors))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--utterances", type=int, default=28_539)
    parser.add_argument("--cps-sd", type=float, nargs="+", default=[2.5])
    parser.add_argument("--case", nargs=2, action="append", metavar=("MODEL", "GPU"))
    parser.add_argument(
        "--memory-factors",
        type=float,
        nargs="*",
        default=[],
        help="also plan with the GPU's memory times each factor (the ceiling table)",
    )
    args = parser.parse_args()
    cases = [tuple(c) for c in args.case] if args.case else list(CASES)
    rows, ceiling = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for model, gpu in cases:
            cache = Path(tmp) / f"cache-{model}"
            for sd in args.cps_sd:
                manifest = write_librispeech_like(
                    Path(tmp) / f"ls-{sd}.jsonl", args.utterances, cps_sd=sd
                )
                started = time.perf_counter()
                r = run(manifest, cache, model, gpu, tuple(args.memory_factors))
                one, two = r["1d"], r["2d"]
                for f in args.memory_factors:
                    big1, big2 = r[f"1dx{f:g}"], r[f"2dx{f:g}"]
                    ceiling.append(
                        f"| {model} | {gpu} | {f:g}x | {big1['setup']} | {big1['throughput']:,.1f} | "
                        f"**{big1['throughput'] / one['throughput']:.2f}x** | {big2['setup']} | "
                        f"{big2['throughput']:,.1f} | **{big2['throughput'] / one['throughput']:.2f}x** |"
                    )
                    print(ceiling[-1], flush=True)
                gain = two["throughput"] / one["throughput"]
                rows.append(
                    f"| {model} | {gpu} | {sd:g} | {one['setup']} | {one['buckets']} | "
                    f"{one['throughput']:,.1f} | {two['setup']} | {two['buckets']} | "
                    f"{two['throughput']:,.1f} | "
                    f"**{gain:.2f}x** | {time.perf_counter() - started:.0f} |"
                )
                print(rows[-1], flush=True)
                print("  2d:", two["batches"], flush=True)
                print("  1d:", one["batches"], flush=True)
    command = (
        "PYTHONPATH=src .venv/bin/python -m bench two_d_buckets "
        + " ".join(f"--case {m} {g}" for m, g in cases)
        + " --cps-sd "
        + " ".join(f"{sd:g}" for sd in args.cps_sd)
        + (
            " --memory-factors " + " ".join(f"{f:g}" for f in args.memory_factors)
            if ceiling
            else ""
        )
        + " --out docs/benchmarks.md"
    )
    body = "\n".join(
        [
            "## Two-dimensional buckets, predicted throughput: "
            + ", ".join(f"{m} on {g}" for m, g in cases),
            "",
            f"Command: `{command}`  ",
            f"Run: {date.today()}, {platform.machine()} {platform.system()}, "
            f"nproc={os.cpu_count()}; {args.utterances:,} utterances.",
            "",
            "| model | GPU | rate sd (chars/s) | setup (1-D) | 1-D buckets | 1-D audio s/s | "
            "setup (2-D) | 2-D buckets | 2-D audio s/s | 2-D / 1-D | bench s |",
            "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|",
            *rows,
        ]
    )
    if ceiling:
        body += "\n".join(
            [
                "",
                "",
                "The same plans on the same GPU with more memory (a ceiling; gains over the 1-D plan "
                "at the GPU's own memory):",
                "",
                "| model | GPU | memory | setup (1-D) | 1-D audio s/s | 1-D gain | setup (2-D) | "
                "2-D audio s/s | 2-D gain |",
                "|---|---|---:|---|---:|---:|---|---:|---:|",
                *ceiling,
            ]
        )
    if args.out:
        name = "two-d-buckets-" + "-".join(m for m, _ in cases)
        write_section(args.out, name, body)
    print(body)


if __name__ == "__main__":
    main()
