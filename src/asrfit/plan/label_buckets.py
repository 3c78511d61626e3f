"""Two-dimensional buckets (duration x labels), chosen when they train faster than duration buckets.

Where memory grows with the transcript as well as the audio (a transducer's joint network
of ``B x T x U x V``, an attention decoder and its cross-attention, the CTC lattice), a
duration bucket must be sized for the long transcripts it may hold, and its utterances with
short ones waste that room. Splitting each duration range by label length gives those a
larger batch (NeMo's 2-D bucketing for Canary; its OOMptimizer sizes each bin).

1. The label terms: the setup's memory, FLOPs and step-time fits were made on shapes whose
   labels grow with their length (``U = r T``), where label and length columns cannot be
   told apart. Two more traces, at a quarter of the labels of the fit's two largest traced
   batches (near the budget, where the planner decides), measure the slopes (:func:`label_pairs`,
   :func:`asrfit.memory.fit.costmodel.label_slopes`); the fits keep their values on the line and
   move off it by those slopes (:func:`asrfit.memory.fit.costmodel.with_label_terms`). A peak
   that is the larger of two phases is convex in ``U``, so the chord between the two traces
   over-predicts between them: bins are never planned below :data:`LABEL_PROBE_LOW` of the
   line.
2. The bins: each duration bucket of the one-dimensional search is split at quantiles of its
   utterances' label lengths (the dataset profile's paired sample), 1 to 4 ranges, the last
   one's edge the one-dimensional assumption (``labels_per_second`` x the duration edge);
   each bin gets the largest batch that fits, and the split that trains the bucket's audio
   fastest wins (a range more must earn 1 %).
3. The decision: two-dimensional buckets are kept when their predicted throughput beats the
   duration buckets' (on the same fits) by :data:`MIN_GAIN`; the plan says both figures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from asrfit.memory.fit.costmodel import label_slopes, with_label_terms
from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape, StepMemory
from asrfit.memory.steptime.roofline import step_seconds_parts
from asrfit.plan.bucketing import (
    BUCKET_COUNTS,
    BucketResult,
    bin_bucket,
    bucket_edges,
    plan_buckets,
)
from asrfit.plan.costs import CostEstimator
from asrfit.plan.plan import Bucket
from asrfit.plan.setup_costs import SetupCosts
from asrfit.plan.speed import StepTimeFit, set_step_time_fit, step_time_fit
from asrfit.profiles.host import device_rates

LABEL_PROBE_LOW = 0.25  # the label traces' share of the line's labels; no bin plans below it
LABEL_TRACES = 2  # new traces the label terms take (the high-label shapes are the fit's own)
LABEL_BIN_COUNTS = (1, 2, 3, 4)
MIN_GAIN = 0.03  # two-dimensional buckets must train 3 % faster (they complicate exports)
MIN_PAIRED_UTTERANCES = 20  # paired (duration, transcript) samples needed to split by labels
MIN_BIN_UTTERANCES = 10  # sampled utterances a label range needs (fewer: its edge is noise)
MAX_BUCKETS = 48  # buckets of a two-dimensional plan at most (lhotse keeps a queue for each)
_NS = 1e9


def label_pairs(
    estimator: CostEstimator, setup: Setup, shapes: list[tuple[int, int, int]], low: float
) -> list[tuple[BatchShape, StepMemory, BatchShape, StepMemory]]:
    """Traces that differ in labels alone, for the label terms of two-dimensional buckets.

    For each traced ``(B, T, U)`` of ``shapes`` (shapes of the activation fit, so only the
    low-label trace is new), the same shape with ``low`` times the labels: activation traces
    of ``setup`` (:meth:`~asrfit.plan.costs.CostEstimator.activation_step`).
    """
    lows = [(b, t, u, max(1, round(u * low))) for b, t, u in shapes]
    lows = [(b, t, u, lo) for b, t, u, lo in lows if lo < u]
    estimator.prefetch_activations(
        [BatchShape(b, t, x) for b, t, u, lo in lows for x in (u, lo)], setup
    )
    pairs = []
    for b, t, u_hi, u_lo in lows:
        hi, lo = BatchShape(b, t, u_hi), BatchShape(b, t, u_lo)
        high_step = estimator.activation_step(hi, setup, "activations")
        pairs.append((hi, high_step, lo, estimator.activation_step(lo, setup, "labels")))
    return pairs


def costs_with_labels(
    costs: SetupCosts,
    estimator: CostEstimator,
    max_input_length: int,
    labels_per_step: float,
    hardware: Any,
) -> SetupCosts:
    """``costs`` whose memory, FLOPs and step-time fits move with labels at fixed length."""
    pairs = label_pairs(
        estimator,
        costs.setup,
        label_shapes(costs, max_input_length, labels_per_step),
        LABEL_PROBE_LOW,
    )
    if not pairs:
        return costs

    def fwd_bwd(step: Any) -> float:
        return float(step.forward_backward_peak_bytes)

    def slopes(measure: Any, per_utterance: bool = True) -> tuple[float, float]:
        return label_slopes(
            [
                (
                    hi.batch_size if per_utterance else 1,
                    hi.input_length,
                    hi.label_length,
                    measure(s_hi),
                    lo.label_length,
                    measure(s_lo),
                )
                for hi, s_hi, lo, s_lo in pairs
            ]
        )

    r = labels_per_step
    out = dataclasses.replace(
        costs,
        memory=with_label_terms(costs.memory, r, *slopes(fwd_bwd)),
        flops=with_label_terms(costs.flops, r, *slopes(lambda s: float(s.flops))),
    )
    rates = device_rates(hardware)
    if rates is not None:
        fit = step_time_fit(costs, rates)

        def part(k: int) -> Any:
            return lambda s: (
                step_seconds_parts(s.cost.select(("forward", "backward")), rates)[k] * _NS
            )

        # per-kernel costs move with the labels per batch (a loss's loop over labels), the
        # arithmetic per utterance
        set_step_time_fit(
            out,
            rates,
            StepTimeFit(
                fixed=with_label_terms(fit.fixed, r, *slopes(part(0), per_utterance=False)),
                host=with_label_terms(fit.host, r, *slopes(part(1), per_utterance=False))
                if fit.host is not None
                else None,
                arithmetic=with_label_terms(fit.arithmetic, r, *slopes(part(2))),
                optimizer_seconds=fit.optimizer_seconds,
                max_relative_residual=fit.max_relative_residual,
            ),
        )
    return out


def label_shapes(
    costs: SetupCosts, max_input_length: int, labels_per_step: float
) -> list[tuple[int, int, int]]:
    """The two traced shapes whose labels are varied: the largest peaks at two lengths.

    The label slope must be read where the planner decides, near the budget: at batch 1 a
    transducer's joint network (``B x T x U x V``) can be smaller than the encoder's
    peak and leave the peak flat in ``U``, while at the planned batch it dominates. So the
    shapes are the activation fit's largest-peak traces at two lengths (both already
    traced); without them, batch 1 of the longest input and batch 2 of half of it.
    """
    points = sorted(getattr(costs.memory, "points", []), key=lambda p: -p[3])
    chosen: list[tuple[int, int, int]] = []
    for b, t, u, _ in points:
        if all(t != c[1] for c in chosen):
            chosen.append((int(b), int(t), int(u)))
        if len(chosen) == 2:
            return chosen
    t = max_input_length
    return [
        (1, t, max(1, round(t * labels_per_step))),
        (2, t // 2, max(1, round(t // 2 * labels_per_step))),
    ]


def plan_buckets_2d(
    costs: SetupCosts,
    hardware: Any,
    durations: np.ndarray,
    labels: np.ndarray,
    usable: int,
    rate: float,
    labels_per_second: float,
    max_seconds: float,
    batch_cap: int | None,
    num_utterances: int,
) -> BucketResult | None:
    """Best duration x label bins for a setup: (buckets, throughput, epoch seconds), or None.

    Args:
        costs: The setup's costs with label terms (:func:`costs_with_labels`).
        hardware: The hardware profile (for the step-time model's rates).
        durations: The profile's sampled durations, paired with ``labels``.
        labels: Label lengths of the same utterances (model labels, not characters).
        usable: Usable bytes per device.
        rate: Model-input steps per audio second.
        labels_per_second: The one-dimensional assumption (the top label edge is this x the
            duration edge).
        max_seconds: The largest duration edge.
        batch_cap: Largest batch wanted (the target), or None.
        num_utterances: Utterances in the whole dataset.
    """
    keep = durations <= max_seconds
    d_all, l_all = durations[keep], labels[keep]
    if d_all.size == 0:
        return None
    best: BucketResult | None = None
    for count in BUCKET_COUNTS:
        if count > MAX_BUCKETS // 2:
            break
        lo, buckets, total_audio, total_time, ok = 0.0, [], 0.0, 0.0, True
        for edge in bucket_edges(durations, count, max_seconds):
            inside = (d_all > lo) & (d_all <= edge) if lo > 0 else d_all <= edge
            if not inside.any():
                continue
            split = _split_by_labels(
                costs,
                hardware,
                d_all[inside],
                l_all[inside],
                (lo, edge),
                usable,
                rate,
                labels_per_second,
                batch_cap,
                (num_utterances, d_all.size),
            )
            if split is None:
                ok = False
                break
            bins, audio, seconds = split
            buckets += bins
            total_audio, total_time = total_audio + audio, total_time + seconds
            lo = edge
        if not ok or not buckets or total_time <= 0 or len(buckets) > MAX_BUCKETS:
            continue
        throughput = total_audio / total_time
        if best is None or throughput > best[1] * 1.01:  # a bucket more must earn 1 %
            best = (buckets, throughput, total_time)
    return best


def _split_by_labels(
    costs: SetupCosts,
    hardware: Any,
    d: np.ndarray,
    u: np.ndarray,
    seconds: tuple[float, float],
    usable: int,
    rate: float,
    labels_per_second: float,
    batch_cap: int | None,
    counts: tuple[int, int],
) -> tuple[list[Bucket], float, float] | None:
    """The fastest split of one duration range into label ranges: (bins, audio, seconds).

    ``counts`` is (utterances in the dataset, utterances in the sample).
    """
    total, sampled = counts
    top = max(1, math.ceil(seconds[1] * labels_per_second))
    floor = max(1, math.ceil(LABEL_PROBE_LOW * top))
    best: tuple[list[Bucket], float, float] | None = None
    for k in LABEL_BIN_COUNTS:
        if k > 1 and u.size < k * MIN_BIN_UTTERANCES:
            break
        cuts = (
            {int(math.ceil(q)) for q in np.quantile(u, [j / k for j in range(1, k)])}
            if k > 1
            else set()
        )
        edges = sorted({max(floor, c) for c in cuts if c < top} | {top})
        ids = np.minimum(np.searchsorted(edges, u, side="left"), len(edges) - 1)
        used = [j for j in range(len(edges)) if (ids == j).any()]
        bins, audio, time_total, lo_u = [], 0.0, 0.0, 0
        for n, j in enumerate(used):
            members = d[ids == j]
            hi_u = edges[j] if n < len(used) - 1 else top  # the last range is sized for the top
            share = members.size / sampled
            made = bin_bucket(
                costs,
                hardware,
                seconds,
                (lo_u, hi_u),
                members,
                usable,
                rate,
                batch_cap,
                share * total,
                share,
            )
            if made is None:
                return None
            bucket, a, s = made
            bins.append(bucket)
            audio, time_total, lo_u = audio + a, time_total + s, hi_u
        if bins and (best is None or time_total < best[2] / 1.01):
            best = (bins, audio, time_total)
    return best


def choose_bucketing(
    costs: SetupCosts,
    one_d: BucketResult,
    estimator: CostEstimator,
    hardware: Any,
    durations: np.ndarray,
    labels: np.ndarray | None,
    usable: int,
    rate: float,
    labels_per_second: float,
    max_seconds: float,
    batch_cap: int | None,
    num_utterances: int,
    mode: str = "auto",
) -> tuple[SetupCosts, BucketResult, str, str]:
    """``(costs, buckets result, "1d" or "2d", reason)`` for the chosen setup.

    Args:
        costs: The chosen setup's costs.
        one_d: Its duration buckets (from :func:`asrfit.plan.bucketing.plan_buckets`).
        estimator: The cost estimator (traces the label pairs).
        labels: Label lengths paired with ``durations``, or None when the profile has none.
        mode: ``"auto"`` (the faster), ``"1d"`` (duration buckets only) or ``"2d"`` (label
            ranges whenever the profile has paired transcripts).
        Other arguments as :func:`plan_buckets_2d`.
    """
    if mode == "1d":
        return costs, one_d, "1d", "duration buckets (asked for)"
    if labels is None or labels.size < MIN_PAIRED_UTTERANCES or labels.size != durations.size:
        return (
            costs,
            one_d,
            "1d",
            (
                "duration buckets: the dataset profile has no paired transcript lengths to split by "
                f"(needs {MIN_PAIRED_UTTERANCES})"
            ),
        )
    max_input = max(1, round(max_seconds * rate))
    with_labels = costs_with_labels(costs, estimator, max_input, labels_per_second / rate, hardware)
    args = (durations, usable, rate, labels_per_second, max_seconds, batch_cap, num_utterances)
    one = plan_buckets(with_labels, hardware, *args)
    two = plan_buckets_2d(
        with_labels,
        hardware,
        durations,
        labels,
        usable,
        rate,
        labels_per_second,
        max_seconds,
        batch_cap,
        num_utterances,
    )
    if one is None or two is None:
        return costs, one_d, "1d", "duration buckets: label ranges do not fit"
    gain = two[1] / one[1] if one[1] > 0 else 1.0
    figures = f"{two[1]:,.1f} vs {one[1]:,.1f} audio s/s predicted ({gain:.2f}x)"
    if mode == "2d" or gain >= 1 + MIN_GAIN:
        return with_labels, two, "2d", f"duration x label buckets: {figures}"
    return (
        costs,
        one_d,
        "1d",
        (
            f"duration buckets: label ranges would give {figures}, below the {MIN_GAIN:.0%} a second "
            "dimension must earn"
        ),
    )


# ways of keeping activations (precision, checkpointing) on whose fastest setup label ranges
# are tried when they help the fastest overall: a setup that saves less memory (fewer
# checkpointed layers) may win once its batches are sized per label range
SHORTLIST = 3


def _activations(candidate: Any) -> tuple:
    setup = candidate.costs.setup
    return (setup.precision, setup.gradient_checkpointing, setup.checkpoint_layers)


def choose_across(candidates: list[Any], world: int, *args: Any) -> tuple[int, tuple]:
    """The setup to plan once label ranges have had their say, and its bucketing.

    Args:
        candidates: Setups that fit, sorted by duration-bucket throughput (``.throughput``
            of all devices, ``.epoch_seconds``, ``.buckets``, ``.costs``).
        world: Devices (:func:`choose_bucketing` works per device).
        args: :func:`choose_bucketing`'s arguments after ``one_d``.

    Returns:
        ``(index into candidates, its choose_bucketing result)``: of the first, and (when
        label ranges help it) the best of each of the next :data:`SHORTLIST` - 1 ways of
        keeping activations (precision, checkpointing), the fastest; a later one only with
        label ranges, the earlier on a tie.
    """

    def bucket(c: Any) -> tuple:
        one_d = (c.buckets, c.throughput / world, c.epoch_seconds * world)
        return choose_bucketing(c.costs, one_d, *args)

    results = {0: bucket(candidates[0])}
    if results[0][2] == "2d":  # memory moves with transcripts: another setup may now win
        # the best of each other way of keeping activations (the optimizer changes only the
        # model states, which label ranges do not)
        seen = {_activations(candidates[0])}
        for j, c in enumerate(candidates):
            if len(seen) >= SHORTLIST:
                break
            if _activations(c) not in seen:
                seen.add(_activations(c))
                results[j] = bucket(c)
    rates = {j: r[1][1] * world for j, r in results.items()}
    eligible = [j for j, r in results.items() if j == 0 or r[2] == "2d"]
    i = max(eligible, key=lambda j: (rates[j], -j))
    if i == 0:
        return 0, results[0]
    costs, result, dims, reason = results[i]
    first = candidates[0].costs.setup.describe()
    reason += f"; with them faster than {first} ({rates[0]:,.1f} audio s/s)"
    return i, (costs, result, dims, reason)
