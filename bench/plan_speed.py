"""How long planning takes, cold and warm, and whether the plan is the exhaustive search's.

Run: ``python -m bench plan_speed [--sets plan-speed-tuned plan-speed-1] [--runs 3]
[--out docs/benchmarks.md]``; ``--model M --gpu G`` plans one other case (printed only).

The cases are data (``bench/cases.py``, the ``plan-speed`` sets, each with the date it was
written and what it was held out from). Each case plans a 20,000-utterance LibriSpeech-like
manifest (target batch 32) end to end in a fresh subprocess: profile the manifest, profile
the model, search. ``--runs`` cold plans, each with an empty simulation cache (the figure is
their median), then a warm plan on the last cold run's cache, then, where the case says so,
a cold plan with ``exhaustive=True`` (every setup's fit refined), whose plan (setup, bucket
edges and limits) the fast plan must equal. Each run reports wall seconds, its own CPU
seconds and its trace workers' (user + system), new simulations (traces) and steps replayed
from their tapes instead (``asrfit.memory.tape``), peak resident memory, and
the 1-minute load average before it started (other work on a shared machine shows there).
Each planning process exits as ``asrfit plan`` does (:mod:`asrfit.utils.quick_exit`).
``--baseline-src`` also plans each case cold with another checkout's package, alternating
with this one's runs, for a side-by-side ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._corpora import write_librispeech_like
from bench._report import write_section
from bench.cases import PlanCase, case_set, sets_of

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
try:  # exit as `asrfit plan` does (asrfit.cli.main.QUICK_EXIT)
    from asrfit.utils.quick_exit import freeze_at_exit
    freeze_at_exit()
except ImportError:  # a --baseline-src checkout from before it
    pass
ds = DatasetProfile.from_manifest({manifest!r})
kw = {{"exhaustive": True}} if {exhaustive!r} else {{}}
p = plan(HardwareProfile.from_name({gpu!r}), ds, {model!r}, target_effective_batch=32, **kw)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print("RESULT " + json.dumps({{
    "seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
    "child_cpu_seconds": children.ru_utime + children.ru_stime,
    "simulations": sum(e.simulations for e in made),
    "replays": sum(getattr(e, "replays", 0) for e in made),
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "child_rss_mib": children.ru_maxrss / 1024,
    "setup": p.setup.describe(), "buckets": [[b.max_seconds, b.batch_size] for b in p.buckets]}}))
"""

UTTERANCES = 20_000


def run_once(
    manifest: Path,
    cache: Path,
    model: str,
    gpu: str,
    exhaustive: bool = False,
    src: str = "",
) -> dict:
    """Plan once in a fresh interpreter with the simulation cache at ``cache``; the child's
    RESULT line, with the wall time seen from here and the load average before it started."""
    env = {**os.environ, "ASRFIT_CACHE_DIR": str(cache)}
    if src:  # plan with another checkout's code (e.g. before a change)
        env["PYTHONPATH"] = src
    code = PLAN.format(manifest=str(manifest), model=model, gpu=gpu, exhaustive=exhaustive)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"planning {model} on {gpu} failed:\n{done.stderr[-4000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
    result = json.loads(line[len("RESULT ") :])
    result["wall"] = time.perf_counter() - started
    result["load"] = load
    return result


def same_plan(a: dict, b: dict) -> bool:
    """Whether two runs chose the same setup and the same bucket edges and limits."""
    return a["setup"] == b["setup"] and a["buckets"] == b["buckets"]


@dataclass
class CaseRuns:
    """Every run of one case."""

    case: PlanCase
    role: str  # the case set's role: "fitted" or "held out"
    cold: list[dict] = field(default_factory=list)
    warm: dict | None = None
    exhaustive: dict | None = None
    baseline: list[dict] = field(default_factory=list)

    def median_cold(self) -> dict:
        """The cold run with the median wall time (the lower median for an even count)."""
        ordered = sorted(self.cold, key=lambda r: r["wall"])
        return ordered[(len(ordered) - 1) // 2]


def median_wall(runs: list[dict]) -> float:
    """The runs' median wall seconds (the lower median for an even count)."""
    return statistics.median_low([r["wall"] for r in runs])


def measure(
    case: PlanCase, role: str, manifest: Path, folder: Path, runs: int, compare: bool, src: str
) -> CaseRuns:
    """Plan ``case`` cold ``runs`` times (alternating with the baseline's, if any), warm once
    and, if asked, exhaustively once."""
    done = CaseRuns(case, role)
    slug = f"{case.model}-{case.gpu}"
    for i in range(runs):
        done.cold.append(run_once(manifest, folder / f"{slug}-{i}", case.model, case.gpu))
        if src:
            cache = folder / f"{slug}-base-{i}"
            done.baseline.append(run_once(manifest, cache, case.model, case.gpu, src=src))
    done.warm = run_once(manifest, folder / f"{slug}-{runs - 1}", case.model, case.gpu)
    if compare and case.compare:
        cache = folder / f"{slug}-exhaustive"
        done.exhaustive = run_once(manifest, cache, case.model, case.gpu, exhaustive=True)
    for other in [*done.cold[1:], done.warm]:
        if not same_plan(done.cold[0], other):
            raise SystemExit(f"{case.name}: two runs of the same code chose different plans")
    return done


def _seconds(runs: list[dict]) -> str:
    walls = sorted(r["wall"] for r in runs)
    return f"**{median_wall(runs):.1f}** ({', '.join(f'{w:.1f}' for w in walls)})"


def _verdict(done: CaseRuns) -> str:
    if done.exhaustive is None:
        return "not compared"
    return "the same" if same_plan(done.cold[0], done.exhaustive) else "**differs**"


def _target(done: CaseRuns) -> str:
    target = done.case.target_seconds
    if target is None:
        return "-"
    met = median_wall(done.cold) <= target
    return f"{target:.0f} ({'met' if met else 'not met'})"


def table(results: list[CaseRuns], runs: int) -> list[str]:
    """The section's table: one row per case."""
    lines = [
        f"| case | cases' role | cold wall s, median of {runs} (each run) | CPU s, planner + "
        "workers | simulations (replayed) | warm wall s | cold target s | plan vs the exhaustive search "
        "| peak RSS MiB (worker) | load before |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for done in results:
        median = done.median_cold()
        loads = [r["load"] for r in [*done.cold, done.warm]]
        lines.append(
            f"| {done.case.name} | {done.role} | {_seconds(done.cold)} | "
            f"{median['cpu_seconds']:.1f} + {median['child_cpu_seconds']:.1f} | "
            f"{median['simulations']} ({median.get('replays', 0)}) | {done.warm['wall']:.1f} | "
            f"{_target(done)} | "
            f"{_verdict(done)} | {median['rss_mib']:,.0f} ({median['child_rss_mib']:,.0f}) | "
            f"{min(loads):.1f}-{max(loads):.1f} |"
        )
    return lines


def details(results: list[CaseRuns], src: str) -> list[str]:
    """Each case's plan, the exhaustive search's cost, and the baseline's runs."""
    lines = []
    for done in results:
        plan = done.cold[0]
        lines.append(f"- {done.case.name}: {plan['setup']}, limits {plan['buckets']}.")
        if done.exhaustive is not None:
            e = done.exhaustive
            lines.append(
                f"  The exhaustive search: {e['wall']:.1f} s wall, {e['simulations']} simulations "
                f"({e.get('replays', 0)} replayed)."
            )
            if not same_plan(plan, e):
                lines.append(f"  Its plan: {e['setup']}, limits {e['buckets']}.")
        if done.baseline:
            ratio = median_wall(done.baseline) / median_wall(done.cold)
            same = all(same_plan(plan, r) for r in done.baseline)
            lines.append(
                f"  Code at {src}, cold: {_seconds(done.baseline)} s wall, "
                f"{done.baseline[0]['simulations']} simulations, {ratio:.2f}x this code's time, "
                f"{'the same plan' if same else 'another plan'}."
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sets = [s.name for s in sets_of("plan-speed")]
    parser.add_argument("--sets", nargs="+", default=sets, choices=sets)
    parser.add_argument("--model", help="plan this bundled model instead of the sets' cases")
    parser.add_argument("--gpu", help="with --model: the GPU's name")
    parser.add_argument("--runs", type=int, default=3, help="cold plans per case (median)")
    parser.add_argument("--no-compare", action="store_true", help="skip the exhaustive plans")
    parser.add_argument("--baseline-src", default="", help="another checkout's src folder")
    parser.add_argument("--utterances", type=int, default=UTTERANCES)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.model:
        if not args.gpu or args.out:
            parser.error("--model needs --gpu, and its figures are printed, not written")
        chosen = [(PlanCase(args.model, args.gpu), "not a set's case")]
    else:
        chosen = [(c, case_set(name).role) for name in args.sets for c in case_set(name).cases]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_librispeech_like(Path(tmp) / "train.jsonl", args.utterances)
        for case, role in chosen:
            print(f"planning {case.name} ...", file=sys.stderr, flush=True)
            results.append(
                measure(
                    case,
                    role,
                    manifest,
                    Path(tmp),
                    args.runs,
                    not args.no_compare,
                    args.baseline_src,
                )
            )
    command = "python -m bench plan_speed"
    if args.model:
        command += f" --model {args.model} --gpu {args.gpu}"
    elif args.sets != sets:
        command += " --sets " + " ".join(args.sets)
    command += f" --runs {args.runs}" * (args.runs != 3) + " --no-compare" * args.no_compare
    command += f" --baseline-src {args.baseline_src}" * bool(args.baseline_src)
    command += f" --utterances {args.utterances}" * (args.utterances != UTTERANCES)
    lines = [
        f"Command: `PYTHONPATH=src .venv/bin/python -m bench {command.removeprefix('python -m bench ')}"
        + (" --out docs/benchmarks.md`" if args.out else "`"),
        "",
        f"Host: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, no GPU. "
        f"Each case plans a {args.utterances:,}-utterance LibriSpeech-like manifest at target "
        "batch 32, end to end in a fresh process: importing the planner, profiling the "
        "manifest and the model, tracing, searching. Cold: an empty simulation cache; warm: "
        "the cache the last cold run filled. CPU seconds are the median run's, the planning "
        "process's own and its trace workers' (`asrfit.plan.parallel`). Simulations are "
        "traces; in brackets, the steps replayed from traces' tapes instead (two at their "
        "length, `asrfit.memory.tape`, or one there and two at another, "
        "`asrfit.memory.tape_lengths`). The cases' role is "
        "their set's in `bench/cases.py`: *fitted* where the planner's speed-ups were "
        "measured and tuned on them, *held out* where they were never planned before the set "
        "was written. The cold targets are for this 2-core host, imports included.",
        "",
        *table(results, args.runs),
        "",
        "Plans (setup, then each bucket's longest utterance in seconds and batch limit):",
        "",
        *details(results, args.baseline_src),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, "plan-speed", f"## Planning time\n\n{text}")


if __name__ == "__main__":
    main()
