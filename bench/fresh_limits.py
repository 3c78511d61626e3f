"""Bucket limits against fresh full simulations (issue 12): the limit fits, one above does not.

Run: ``PYTHONPATH=src .venv/bin/python -m bench fresh_limits --model wav2vec2-base --gpu T4
[--target 32]``. Plans the LibriSpeech-like manifest of ``bench/plan_speed.py`` (20,000
utterances, in the simulation cache the environment names), then, for the first, middle and
last bucket whose batch is below ``--target`` (memory, not the target, sets those limits),
runs the full two-step simulator (``simulate_step``, the plan's setup) at the limit and one
above. Each prints one JSON line: the reserved figure of each fresh simulation
(:func:`asrfit.plan.proposals.reserved_by_simulation`, with the plan's allocator setting),
the plan's usable bytes and prediction, and whether the limit holds. The planner's fitted model is not used for the check. To check
older code, put its ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from bench._corpora import write_librispeech_like


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--target", type=int, default=32, help="target batch (utterances)")
    parser.add_argument("--utterances", type=int, default=20_000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from asrfit.memory.report import resolve_adapter
    from asrfit.memory.step import BatchShape
    from asrfit.plan.proposals import reserved_by_simulation
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    manifest = write_librispeech_like(Path(tempfile.mkdtemp()) / "m.jsonl", args.utterances)
    started = time.perf_counter()
    p = plan(
        HardwareProfile.from_name(args.gpu),
        DatasetProfile.from_manifest(str(manifest)),
        args.model,
        target_effective_batch=args.target,
    )
    print(
        f"{args.model} {args.gpu} {p.setup.describe()} usable {p.usable_bytes} "
        f"plan s {time.perf_counter() - started:.1f}",
        flush=True,
    )
    adapter, _ = resolve_adapter(args.model)
    limited = [i for i, b in enumerate(p.buckets) if b.batch_size < args.target]
    pick = sorted({limited[0], limited[len(limited) // 2], limited[-1]}) if limited else []
    print("memory-limited buckets", limited, "checked", pick, flush=True)
    for i in pick:
        b = p.buckets[i]
        fresh = [
            reserved_by_simulation(
                adapter,
                BatchShape(batch, b.max_input_length, b.max_label_length),
                p.setup,
                p.architecture,
                p.expandable_segments,
            )
            for batch in (b.batch_size, b.batch_size + 1)
        ]
        print(
            json.dumps(
                {
                    "case": f"{args.model}/{args.gpu}",
                    "bucket": i,
                    "seconds": round(b.max_seconds, 2),
                    "labels": b.max_label_length,
                    "batch": b.batch_size,
                    "fresh_at_limit": fresh[0],
                    "fresh_above": fresh[1],
                    "usable": p.usable_bytes,
                    "predicted_at_limit": b.predicted_peak_bytes,
                    "holds": fresh[0] <= p.usable_bytes < fresh[1],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
