"""How long planning takes, cold and warm, and whether screening keeps the exhaustive plan.

Run: ``python -m bench plan_speed [--model xls-r-1b --gpu L4] [--compare] [--out docs/benchmarks.md]``.
Each plan runs end to end in a fresh subprocess (profile the manifest, profile the model,
search): cold (empty simulation cache), then warm (the cache the cold run filled). With
``--compare``, a third cold run plans with ``exhaustive=True`` (every setup's fit refined)
and the two plans are compared (setup, bucket edges and limits). Each run reports wall
seconds, its own CPU seconds (user + system: less sensitive than wall time to other work on
a shared machine), new simulations, peak resident memory and the load average.
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
import json, os, resource, time, logging
logging.disable(logging.WARNING)
t, c = time.perf_counter(), time.process_time()
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.plan import costs
from asrfit.plan.search import plan
made = []  # the planner's estimators: each counts its new simulations, wherever they ran
init = costs.CostEstimator.__init__
def counted(self, *a, **k):
    init(self, *a, **k)
    made.append(self)
costs.CostEstimator.__init__ = counted
ds = DatasetProfile.from_manifest({manifest!r})
kw = {{"exhaustive": True}} if {exhaustive!r} else {{}}
p = plan(HardwareProfile.from_name({gpu!r}), ds, {model!r}, target_effective_batch=32, **kw)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print("RESULT " + json.dumps({{
    "seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
    "child_cpu_seconds": children.ru_utime + children.ru_stime,
    "simulations": sum(e.simulations for e in made),
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "child_rss_mib": children.ru_maxrss / 1024,
    "setup": p.setup.describe(), "buckets": [[b.max_seconds, b.batch_size] for b in p.buckets]}}))
"""


def run_once(
    manifest: Path,
    cache: Path,
    model: str,
    gpu: str,
    exhaustive: bool = False,
    src: str = "",
    workers: int | None = None,
) -> dict:
    env = {**os.environ, "ASRFIT_CACHE_DIR": str(cache)}
    if src:  # plan with another checkout's code (e.g. before a change)
        env["PYTHONPATH"] = src
    if workers is not None:  # trace workers (asrfit.plan.parallel; default: the CPUs, up to 4)
        env["ASRFIT_TRACE_WORKERS"] = str(workers)
    code = PLAN.format(manifest=str(manifest), model=model, gpu=gpu, exhaustive=exhaustive)
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[7:])
    result["wall"] = time.perf_counter() - started
    result["load"] = os.getloadavg()[0]
    return result


def _row(name: str, r: dict) -> str:
    children = r.get("child_cpu_seconds", 0.0)
    return (
        f"| {name} | {r['wall']:.1f} | {r['cpu_seconds']:.1f} | {children:.1f} | "
        f"{r['simulations']} | {r['rss_mib']:,.0f} | {r.get('child_rss_mib', 0):,.0f} | "
        f"{r['load']:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--utterances", type=int, default=1_000_000)
    parser.add_argument("--model", default="xls-r-1b")
    parser.add_argument("--gpu", default="L4")
    parser.add_argument("--compare", action="store_true", help="also plan exhaustively")
    parser.add_argument(
        "--baseline-src",
        default="",
        help="also plan cold (and warm) with the asrfit package under this folder (e.g. from "
        "`git archive <commit> src | tar -x -C /tmp/base`, then /tmp/base/src)",
    )
    parser.add_argument("--no-warm", action="store_true", help="skip the warm run")
    parser.add_argument(
        "--one-worker",
        action="store_true",
        help="also plan cold with every trace in the planning process (ASRFIT_TRACE_WORKERS=1)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_librispeech_like(Path(tmp) / "train.jsonl", args.utterances)
        cold = run_once(manifest, Path(tmp) / "cache", args.model, args.gpu)
        warm = (
            None if args.no_warm else run_once(manifest, Path(tmp) / "cache", args.model, args.gpu)
        )
        full = (
            run_once(manifest, Path(tmp) / "cache-full", args.model, args.gpu, exhaustive=True)
            if args.compare
            else None
        )
        single = (
            run_once(manifest, Path(tmp) / "cache-one", args.model, args.gpu, workers=1)
            if args.one_worker
            else None
        )
        base = (
            run_once(
                manifest, Path(tmp) / "cache-base", args.model, args.gpu, src=args.baseline_src
            )
            if args.baseline_src
            else None
        )
        base_warm = (
            run_once(
                manifest, Path(tmp) / "cache-base", args.model, args.gpu, src=args.baseline_src
            )
            if args.baseline_src and not args.no_warm
            else None
        )
    command = f"python -m bench plan_speed --model {args.model} --gpu {args.gpu}"
    command += " --compare" * args.compare + " --no-warm" * args.no_warm
    command += " --one-worker" * args.one_worker
    if args.baseline_src:
        command += f" --baseline-src {args.baseline_src}"
    lines = [
        f"Command: `{command} --utterances {args.utterances}` ({date.today()}, {os.cpu_count()} "
        f"CPUs, {platform.processor() or platform.machine()}, no GPU).",
        "",
        f"Planning {args.model} on a {args.gpu} for a {args.utterances:,}-utterance "
        "LibriSpeech-like manifest, end to end in a fresh process. CPU seconds are the "
        "planning process's own, child CPU seconds its trace workers' "
        "(`asrfit.plan.parallel`); peak RSS is the planning process's and its largest "
        "worker's; load is the 1-minute load average after the run.",
        "",
        "| run | wall s | CPU s | child CPU s | new simulations | peak RSS MiB | worker peak RSS MiB | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        _row("cold (empty simulation cache)", cold),
    ]
    if warm is not None:
        lines.append(_row("warm (cache filled by the cold run)", warm))
    if full is not None:
        lines.append(_row("cold, exhaustive search (every fit refined)", full))
    if single is not None:
        lines.append(_row("cold, one process (no trace workers)", single))
    if base is not None:
        lines.append(_row(f"cold, code at {args.baseline_src}", base))
    if base_warm is not None:
        lines.append(_row(f"warm, code at {args.baseline_src}", base_warm))
    lines += ["", f"Plan: {cold['setup']}, limits {cold['buckets']}."]
    if full is not None:
        same = full["setup"] == cold["setup"] and full["buckets"] == cold["buckets"]
        lines.append(
            f"Exhaustive plan: {'the same' if same else full['setup'] + ', ' + str(full['buckets'])}."
        )
    if single is not None:
        same = single["setup"] == cold["setup"] and single["buckets"] == cold["buckets"]
        lines.append(
            f"One-process plan: {'the same' if same else single['setup'] + ', ' + str(single['buckets'])}."
        )
    if base is not None:
        same = base["setup"] == cold["setup"] and base["buckets"] == cold["buckets"]
        lines.append(
            f"Baseline plan: {'the same' if same else base['setup'] + ', ' + str(base['buckets'])}."
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, "plan-speed", f"## Planning time\n\n{text}")


if __name__ == "__main__":
    main()
