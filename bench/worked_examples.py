"""The seed documents' worked examples, planned by asrfit.

Run: ``python -m bench worked_examples --out docs/worked_examples.md``

Each example plans a model for a LibriSpeech-like dataset (28,539 utterances shaped like
train-clean-100, see ``bench/_corpora.py``) on a catalog GPU with a target of 32 utterances
per optimizer step, and prints the chosen setup, the bucket limits, the predicted peak of
the longest bucket and the predicted throughput. Beside it: the seed formula's estimate
for the same batch (activations per sample = 10% of the model's fp32 weight bytes, plus
weights, gradients and AdamW state), to show the gap the seed rule leaves.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from datetime import date
from pathlib import Path

from bench._corpora import write_librispeech_like

EXAMPLES = [
    ("xls-r-1b", "L4"),
    ("xls-r-1b", "A100-40GB"),
    ("xls-r-300m", "T4"),
    ("parakeet-tdt-0.6b", "A100-80GB"),
]


def seed_rule_bytes(params: int, batch: int) -> float:
    """The seed documents' estimate: 16 B/param model states + 0.1 x 4 B/param per sample."""
    return 16 * params + 0.1 * 4 * params * batch


def _cached_simulations() -> int:
    """How many simulations the on-disk cache holds (new ones are the cold work of a plan)."""
    from asrfit.memory.cache import cache_dir

    folder = cache_dir()
    return len(list(folder.glob("*.json"))) if folder and folder.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--only", default=None, help="Run the examples whose model contains this text."
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile
    from asrfit.profiles.model import ModelProfile

    gib = 2**30
    sections = [
        "# Worked examples",
        "",
        f"Command: `PYTHONPATH=src .venv/bin/python -m bench worked_examples --out docs/worked_examples.md` ({date.today()}, CPU only).",
        "Dataset: 28,539 LibriSpeech-like utterances (train-clean-100 shaped, 1.3-24.5 s). Target: 32 utterances/step.",
        "The seed documents' own claimed numbers for these examples were not provided to this repository, so the",
        "seed column applies the seed's formula (activations per sample = 10% of fp32 weight bytes) to asrfit's",
        "longest-bucket batch instead. Throughput is the step-time model's prediction (per-op roofline on the catalog's rates; see each plan's rests-on line), not a measurement.",
        "Planning times are wall seconds on a shared 2-core machine, with the simulation cache as it was "
        "(each line says how many simulations were new); `bench/plan_speed.py` times planning on its own.",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        dataset = DatasetProfile.from_manifest(
            write_librispeech_like(Path(tmp) / "train.jsonl", 28_539)
        )
        for model, gpu in EXAMPLES:
            if args.only and args.only not in model:
                continue
            started = time.perf_counter()
            before = _cached_simulations()
            hardware = HardwareProfile.from_name(gpu)
            p = plan(hardware, dataset, model, target_effective_batch=32)
            params = ModelProfile.from_spec(model).total_params
            last = p.buckets[-1]
            seed = seed_rule_bytes(params, last.batch_size)
            sections += [
                f"## {model} on {gpu}",
                "",
                f"- setup: **{p.setup.describe()}**, {len(p.buckets)} buckets, accumulation {p.gradient_accumulation_steps}",
                "- bucket limits (s: batch): "
                + ", ".join(f"{b.max_seconds:g}: {b.batch_size}" for b in p.buckets),
                f"- longest bucket {last.max_seconds:g} s x {last.batch_size}: predicted reserved "
                f"{last.predicted_peak_bytes / gib:.2f} GiB of {p.usable_bytes / gib:.2f} GiB usable; "
                f"seed formula for the same batch: {seed / gib:.2f} GiB",
                f"- predicted throughput {p.predicted_throughput_seconds_per_second:,.0f} audio s/s; "
                f"planned in {time.perf_counter() - started:.0f} s wall "
                f"({_cached_simulations() - before} new simulations, the rest from the cache)",
                f"- rests on: {'; '.join(p.rests_on[:3])}",
                "",
            ]
            print("\n".join(sections[-7:]), flush=True)
    text = "\n".join(sections)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
