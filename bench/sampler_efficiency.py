"""Batch-sampler efficiency under one memory budget: padding, predicted fill, over-budget batches.

Run: ``PYTHONPATH=src .venv/bin/python -m bench sampler_efficiency --out docs/benchmarks.md``

Two corpora: (a) the demo corpus's train split (``asrfit.recipes.demo.write_demo_corpus`` with
its defaults: 600 utterances, log-normal around 3 s, 1-20 s), (b) the LibriSpeech
train-clean-100-like durations of ``bench/_corpora.py`` (28,539 utterances).

One cost model for all: the peak-memory fit ``asrfit plan --model xls-r-300m --gpu A10G``
made (bf16, AdamW, no activation checkpointing, frozen feature encoder; A10G 24 GB x 0.85
safety = 19.1 GiB usable), with asrfit's allocator model on top. A batch's predicted bytes
are ``plan.predicted_reserved_bytes(n, longest input, longest label)``. ``--plan PATH`` uses
a saved plan's cost model and budget instead.

Buckets (ours): the planner's rule, without its effective-batch cap so that only memory
limits every sampler: edges at equal audio per bucket (``asrfit.plan.bucketing.bucket_edges``),
each bucket's limit the largest batch that fits at its upper edge; the bucket count is the
one of the planner's candidates that gives our sampler the fewest batches (then the least
padding).

Baselines, same budget:
(i) fixed batch: the largest batch that fits the longest utterance, random order;
(ii) Hugging Face ``group_by_length``: ``LengthGroupedSampler`` with that batch size, then
fixed-size chunks; (iii) lhotse ``DynamicBucketingSampler`` with ``max_duration`` tuned by bisection to the
largest value whose batches exceed the budget in at most X% of batches (X = 0 and 1), with
its default 10 buckets or as many as ours, whichever gives fewer batches.

Padding = (padded input steps - real input steps) / padded input steps, padded = batch size x
longest input. Fill = predicted bytes / usable bytes, averaged over batches.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.plan.bucketing import BUCKET_COUNTS, bucket_edges
from asrfit.plan.plan import Bucket, DataDecisions, Plan
from asrfit.recipes.demo import write_demo_corpus
from bench._corpora import CHARS_PER_SECOND, librispeech_like_durations
from bench._report import write_section

COMMAND = "PYTHONPATH=src .venv/bin/python -m bench sampler_efficiency --out docs/benchmarks.md"
GIB = 2**30
# Fitted by `asrfit plan --model xls-r-300m --gpu A10G` (bf16, AdamW, no checkpointing) on
# seven fake-tensor simulations (residual < 0.001 %).
XLSR_A10G = {
    "usable_bytes": 20_535_312_384,
    "cost_model": PeakModel(
        c0_bytes=4_382_359_215.5,
        a_bytes_per_step=2857.0338,
        b_bytes_per_step2=0.00047642438,
        c_bytes_per_label=0.0,
        d_bytes_per_utterance=344_095.41,
    ),
    "optimizer_peak_bytes": 6_242_069_504,
    "architecture": "Ampere",
}
LHOTSE_BISECTION_STEPS = 12
LHOTSE_DEFAULT_BUCKETS = 10
SEED = 0
PADDING_TARGET = 0.03
BOUND_MAX_UTTERANCES = 5_000  # the exact lower bound's dynamic programme is O(batches x n)


@dataclass
class Row:
    name: str
    batches: int
    utterances: int
    padding: float
    mean_fill: float
    max_fill: float
    over_budget: int


def base_plan(saved: Path | None) -> Plan:
    """The budget and cost model every sampler is measured against (buckets set per corpus)."""
    if saved is not None:
        return Plan.load(saved)
    return Plan(
        model="xls-r-300m",
        gpu="A10G",
        usable_bytes=XLSR_A10G["usable_bytes"],
        setup=Setup(precision="bf16", optimizer="adamw"),
        buckets=[Bucket(0.0, 1.0, 1, 16000, 16, 0, 1.0, 0.0)],
        gradient_accumulation_steps=1,
        target_effective_batch="memory only",
        effective_batch_utterances=0.0,
        effective_batch_hours=0.0,
        predicted_throughput_seconds_per_second=0.0,
        predicted_epoch_seconds=0.0,
        cost_model=XLSR_A10G["cost_model"],
        data=DataDecisions(False, False, "chunk", 1.0, 0.0, 0),
        labels_per_second=CHARS_PER_SECOND,
        optimizer_peak_bytes=XLSR_A10G["optimizer_peak_bytes"],
        architecture=XLSR_A10G["architecture"],
    )


def labels(plan: Plan, seconds: float) -> int:
    return math.ceil(seconds * plan.labels_per_second)


def max_batch(plan: Plan, seconds: float) -> int:
    """Largest batch of ``seconds``-long utterances whose predicted bytes fit (0 if none)."""
    t, u = plan.input_length(seconds), labels(plan, seconds)
    lo, hi = 0, 1
    while plan.predicted_reserved_bytes(hi, t, u) <= plan.usable_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (
            (mid, hi)
            if plan.predicted_reserved_bytes(mid, t, u) <= plan.usable_bytes
            else (lo, mid)
        )
    return lo


def bucketed_plan(base: Plan, durations: np.ndarray, count: int) -> Plan:
    """``base`` with the planner's equal-audio buckets and memory-only batch limits."""
    longest = float(durations.max())
    buckets, lo = [], 0.0
    for edge in bucket_edges(durations, count, longest):
        inside = durations[(durations > lo) & (durations <= edge)]
        if inside.size == 0:
            continue
        buckets.append(
            Bucket(
                min_seconds=lo,
                max_seconds=edge,
                batch_size=max_batch(base, edge),
                max_input_length=base.input_length(edge),
                max_label_length=labels(base, edge),
                predicted_peak_bytes=0,
                utterance_fraction=inside.size / durations.size,
                throughput_seconds_per_second=0.0,
            )
        )
        lo = edge
    plan = Plan.from_dict(base.to_dict())
    plan.buckets = buckets
    return plan


def measure(name: str, plan: Plan, durations: np.ndarray, batches: Sequence[Sequence[int]]) -> Row:
    inputs = np.array([plan.input_length(d) for d in durations])
    label_counts = np.array([labels(plan, d) for d in durations])
    real = padded = 0
    fills = []
    for batch in batches:
        index = np.asarray(batch)
        longest = int(inputs[index].max())
        real += int(inputs[index].sum())
        padded += len(index) * longest
        predicted = plan.predicted_reserved_bytes(
            len(index), longest, int(label_counts[index].max())
        )
        fills.append(predicted / plan.usable_bytes)
    fill = np.array(fills)
    return Row(
        name=name,
        batches=len(batches),
        utterances=sum(len(b) for b in batches),
        padding=1 - real / padded,
        mean_fill=float(fill.mean()),
        max_fill=float(fill.max()),
        over_budget=int((fill > 1).sum()),
    )


def sorted_partitions(
    plan: Plan, durations: np.ndarray, max_batches: int
) -> dict[int, list[list[int]]]:
    """For each batch count K, the within-budget partition with the fewest padded input steps.

    An exact dynamic programme over the utterances sorted by length: any partition can be
    rearranged into contiguous runs of the sorted order without more padding (exchange
    argument), so the K-batch optimum is ``dp[K][i] = min_j dp[K-1][j] + (i - j) * T[i-1]``,
    with the run ``j..i`` allowed when ``i - j`` utterances of length ``T[i-1]`` fit the
    budget. It bounds every sampler from below: no batch order does better at K batches.
    O(K * n) vector steps, so it is run on small corpora only.
    """
    order = np.argsort(durations, kind="stable")
    seconds = durations[order]
    steps = np.array([plan.input_length(d) for d in seconds], dtype=np.int64)
    n = seconds.size
    widest = np.array([max_batch(plan, float(d)) for d in seconds])  # longest run ending at i
    out: dict[int, list[list[int]]] = {}
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    choices = []
    for k in range(1, max_batches + 1):
        now = np.full(n + 1, np.inf)
        arg = np.zeros(n + 1, dtype=np.int64)
        for i in range(1, n + 1):
            lo = max(0, i - int(widest[i - 1]))
            js = np.arange(lo, i)
            cost = best[lo:i] + (i - js) * steps[i - 1]
            j = int(np.argmin(cost))
            now[i], arg[i] = cost[j], lo + j
        choices.append(arg)
        best = now
        if np.isfinite(best[n]):
            batches, i = [], n
            for kk in range(k - 1, -1, -1):
                j = int(choices[kk][i])
                batches.append(order[j:i].tolist())
                i = j
            out[k] = batches[::-1]
    return out


def bound_rows(plan: Plan, durations: np.ndarray, ours_row: Row) -> list[Row]:
    """Lower-bound rows: the least padding at our batch count, and the fewest batches at <= 3 %."""
    parts = sorted_partitions(plan, durations, max_batches=4 * ours_row.batches + 40)
    rows = {k: measure("", plan, durations, b) for k, b in parts.items()}
    fewest = min(rows)
    same = rows.get(ours_row.batches, rows[fewest])
    same.name = f"bound: least padding any sampler can reach with {same.batches} batches"
    rows_out = [same]
    low = [k for k, r in rows.items() if r.padding <= PADDING_TARGET]
    if low:
        r = rows[min(low)]
        r.name = f"bound: fewest batches any sampler needs for padding <= {PADDING_TARGET:.0%}"
        rows_out.append(r)
    return rows_out


def ours(plan: Plan, durations: np.ndarray) -> list[list[int]]:
    return list(MemoryBudgetSampler(durations.tolist(), plan, seed=SEED))


def fixed_batches(size: int, durations: np.ndarray) -> list[list[int]]:
    order = np.random.default_rng(SEED).permutation(durations.size).tolist()
    return [order[i : i + size] for i in range(0, len(order), size)]


def group_by_length(plan: Plan, size: int, durations: np.ndarray) -> list[list[int]]:
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    lengths = [plan.input_length(d) for d in durations]
    sampler = LengthGroupedSampler(
        size, lengths=lengths, generator=torch.Generator().manual_seed(SEED)
    )
    order = list(sampler)
    return [order[i : i + size] for i in range(0, len(order), size)]


def lhotse_runner(durations: np.ndarray, num_buckets: int) -> Callable[[float], list[list[int]]]:
    from lhotse import CutSet, MonoCut
    from lhotse.dataset.sampling import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_recording

    cuts = CutSet.from_cuts(
        MonoCut(
            id=f"cut-{i}",
            start=0.0,
            duration=float(d),
            channel=0,
            recording=dummy_recording(i, duration=float(d)),
        )
        for i, d in enumerate(durations)
    )

    def run(max_duration: float) -> list[list[int]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "eagerly read CutSet": fine at this size
            sampler = DynamicBucketingSampler(
                cuts, max_duration=max_duration, num_buckets=num_buckets, shuffle=True, seed=SEED
            )
            return [[int(c.id.split("-")[1]) for c in batch] for batch in sampler]

    return run


def tune_lhotse(
    plan: Plan, durations: np.ndarray, run: Callable[[float], list[list[int]]], over_share: float
) -> tuple[float, list[list[int]]]:
    """Largest ``max_duration`` (bisection) whose share of over-budget batches is <= ``over_share``."""

    def ok(max_duration: float) -> tuple[bool, list[list[int]]]:
        batches = run(max_duration)
        row = measure("", plan, durations, batches)
        return row.over_budget <= over_share * row.batches, batches

    lo = float(durations.max())  # every cut must fit on its own
    hi = max(b.batch_size * b.max_seconds for b in plan.buckets) * 2
    good, best = ok(lo)
    if not good:
        return lo, best
    for _ in range(LHOTSE_BISECTION_STEPS):
        mid = (lo + hi) / 2
        good, batches = ok(mid)
        if good:
            lo, best = mid, batches
        else:
            hi = mid
    return lo, best


def corpus_rows(name: str, base: Plan, durations: np.ndarray) -> tuple[str, list[Row]]:
    started = time.perf_counter()
    by_count = {}
    for count in BUCKET_COUNTS:
        plan = bucketed_plan(base, durations, count)
        name_ours = f"**asrfit MemoryBudgetSampler** ({len(plan.buckets)} buckets)"
        by_count[len(plan.buckets)] = (
            plan,
            measure(name_ours, plan, durations, ours(plan, durations)),
        )
    count = min(by_count, key=lambda k: (by_count[k][1].batches, by_count[k][1].padding, k))
    plan, row = by_count[count]
    rows = [row]
    if durations.size <= BOUND_MAX_UTTERANCES:
        rows += bound_rows(plan, durations, row)
    size = max_batch(plan, float(durations.max()))
    rows.append(
        measure(
            f"fixed batch {size}, random order", plan, durations, fixed_batches(size, durations)
        )
    )
    rows.append(
        measure(
            f"HF group_by_length, batch {size}",
            plan,
            durations,
            group_by_length(plan, size, durations),
        )
    )
    runs = {k: lhotse_runner(durations, k) for k in sorted({LHOTSE_DEFAULT_BUCKETS, count})}
    for share in (0.0, 0.01):
        tuned = {k: tune_lhotse(plan, durations, run, share) for k, run in runs.items()}
        rows_k = {
            k: measure(
                f"lhotse DynamicBucketingSampler, {k} buckets, max_duration={md:.0f} s "
                f"(tuned: <= {share:.0%} over)",
                plan,
                durations,
                batches,
            )
            for k, (md, batches) in tuned.items()
        }
        rows.append(min(rows_k.values(), key=lambda r: (r.batches, r.padding)))
    logging.info("%s: %.1f s", name, time.perf_counter() - started)
    head = (
        f"**{name}**: {durations.size:,} utterances, {durations.sum() / 3600:.1f} h, "
        f"{durations.min():.1f}-{durations.max():.1f} s (median {np.median(durations):.1f} s)."
    )
    return head, rows


def table(rows: list[Row]) -> str:
    lines = [
        "| sampler | batches | utterances | utt./batch | padding | mean fill | max fill | over budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.batches:,} | {r.utterances:,} | {r.utterances / r.batches:.1f} | "
            f"{r.padding:.1%} | {r.mean_fill:.1%} | {r.max_fill:.1%} | {r.over_budget} |"
        )
    return "\n".join(lines)


def demo_durations(folder: Path) -> np.ndarray:
    with write_demo_corpus(folder).train_manifest.open(encoding="utf-8") as handle:
        return np.array([json.loads(line)["duration"] for line in handle])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="Markdown file to update.")
    parser.add_argument(
        "--plan", type=Path, default=None, help="Use this plan's cost model and budget."
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("asrfit").setLevel(logging.ERROR)
    base = base_plan(args.plan)
    with tempfile.TemporaryDirectory(prefix="asrfit-bench-") as tmp:
        corpora = {
            "(a) demo corpus, train split": demo_durations(Path(tmp)),
            "(b) LibriSpeech train-clean-100-like": librispeech_like_durations(28_539, seed=0),
        }
        sections = [corpus_rows(name, base, d) for name, d in corpora.items()]
    source = args.plan or "xls-r-300m on A10G (bf16, AdamW), fitted by `asrfit plan`"
    body = [
        f"Command: `{COMMAND}` ({date.today()}).",
        "",
        f"Budget: {base.usable_bytes / GIB:.2f} GiB usable; cost model: {source}. Padding = "
        "(padded - real) / padded input steps; fill = predicted reserved bytes / budget, mean "
        "over batches; over budget = batches whose predicted bytes exceed it. Targets for "
        "asrfit: padding <= 3 %, mean fill >= 90 %, 0 over budget. Method in the script's docstring.",
        "",
        "The fixed-batch and `group_by_length` rows use the largest batch that fits the longest "
        "utterance: never over budget, but short batches leave memory unused. lhotse limits "
        "n x longest duration in seconds, not bytes, so a `max_duration` that lets its batches "
        "grow makes some exceed the budget. The `bound` rows (small corpora only) are exact optima "
        "over all within-budget partitions of the length-sorted corpus (`sorted_partitions`), so "
        "no sampler beats them: a corpus as small as the demo one fills only a few batches, each "
        "spanning a wide range of lengths, and there the padding and fill targets cannot both "
        "be met at this budget; padding <= 3 % needs the batch count of the second bound row, "
        "whose fill is far below 90 %.",
    ]
    for head, rows in sections:
        body += ["", head, "", table(rows)]
        print(head)
        print(table(rows))
    if args.out is not None:
        write_section(
            args.out, "sampler-efficiency", "\n".join(["## Batch sampler efficiency", "", *body])
        )


if __name__ == "__main__":
    main()
