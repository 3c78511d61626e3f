"""Where a cold plan's wall time goes: each phase of side-by-side traces, each trace of the planner.

Run: ``ASRFIT_CACHE_DIR=<empty folder> PYTHONPATH=src .venv/bin/python -m bench plan_timeline
--model wav2vec2-base --gpu T4``. Plans the 20,000-utterance LibriSpeech-like manifest of
``bench/plan_speed.py`` (target batch 32) and prints, in seconds from the start, when the
manifest is profiled, each trace the planning process runs itself (with its own duration),
and the start and end of each phase the trace workers share (:mod:`asrfit.plan.parallel`:
the traces inside a phase run in the planning process and its workers alike; only the
planning process's are listed). With an empty cache every simulation is traced.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._corpora import write_librispeech_like

START = time.perf_counter()


def log(text: str) -> None:
    print(f"{time.perf_counter() - START:7.2f}  {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--utterances", type=int, default=20_000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from asrfit.plan import costs
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    planner = os.getpid()
    trace, map_forked = costs.CostEstimator.trace, costs.map_forked

    def timed_trace(self: Any, batch: Any, setup: Any, *flags: bool) -> Any:
        started = time.perf_counter()
        result = trace(self, batch, setup, *flags)
        if os.getpid() == planner:  # a worker's traces are seen as its phase's length
            shape = f"{batch.batch_size} x {batch.input_length}"
            what = "optimizer state" if not flags[1] else "activations"
            log(f"trace {setup.describe()} {shape} ({what}): {time.perf_counter() - started:.2f} s")
        return result

    def timed_phase(jobs: list, workers: int, *rest: Any) -> Any:
        started = time.perf_counter()
        log(f"phase: {len(jobs)} traces, {workers} processes")
        results = map_forked(jobs, workers, *rest)
        log(f"phase done: {time.perf_counter() - started:.2f} s")
        return results

    costs.CostEstimator.trace = timed_trace  # type: ignore[method-assign]
    costs.map_forked = timed_phase
    manifest = write_librispeech_like(Path(tempfile.mkdtemp()) / "m.jsonl", args.utterances)
    dataset = DatasetProfile.from_manifest(str(manifest))
    log("manifest profiled")
    p = plan(HardwareProfile.from_name(args.gpu), dataset, args.model, target_effective_batch=32)
    log(f"plan: {p.setup.describe()}")


if __name__ == "__main__":
    main()
