"""Duration buckets for one setup: edges at equal audio, the largest batch that fits each.

For each bucket count of :data:`BUCKET_COUNTS`, edges split the dataset's audio into equal
parts; each bucket gets the largest batch whose predicted *reserved* memory fits usable
memory (capped by the target batch); the count with the highest predicted throughput wins
(a bucket more must earn 1 %).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from asrfit.memory.setup import Precision
from asrfit.plan.cpu_rate import measured_cpu_tflops
from asrfit.plan.plan import Bucket
from asrfit.plan.setup_costs import SetupCosts
from asrfit.plan.speed import predict_step_seconds
from asrfit.profiles.host import device_rates

# Fraction of the catalog's dense peak that training kernels reach (model FLOPs utilisation).
# Stated assumptions: typical of transformer training at these sizes; not measured here.
MFU = {Precision.BF16: 0.40, Precision.FP16: 0.40, Precision.PURE_BF16: 0.45, Precision.FP32: 0.50}
BUCKET_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 30)


def bucket_edges(durations: np.ndarray, count: int, max_seconds: float) -> list[float]:
    """Upper edges that split the audio into ``count`` parts of equal total duration."""
    d = np.sort(durations[durations <= max_seconds])
    if count == 1 or d.size < count:
        return [max_seconds]
    cum = np.cumsum(d) / d.sum()
    edges = [float(d[np.searchsorted(cum, k / count)]) for k in range(1, count)]
    edges = sorted({round(e, 2) for e in edges if 0 < e < max_seconds})
    return [*edges, max_seconds]


def bucket_step_seconds(costs: SetupCosts, hardware: Any, b: int, t: int, u: int) -> float:
    """Predicted seconds of one step of ``b`` utterances padded to ``t`` frames and ``u`` labels."""
    rates = device_rates(hardware)
    if rates is not None:  # per-op roofline of the traced kernels (asrfit.plan.speed)
        return predict_step_seconds(costs, rates, b, t, u)
    # a detected GPU missing from the catalog: no peaks known; the CPU's matmul rate stands
    # in for them, as before the step-time model, at a stated MFU
    peak = measured_cpu_tflops()
    return costs.flops.predict(b, t, u) / (peak * 1e12 * MFU[costs.setup.precision])


def _duration_bins(
    durations: np.ndarray, count: int, max_seconds: float
) -> list[tuple[float, float, np.ndarray, float]]:
    """``(lower, upper edge, durations inside, their mean)`` of each non-empty bucket.

    A plan sizes the same bins for every setup it weighs (tens of times): they are kept for
    the last ``durations`` array seen (held, so that no other array can take its identity)
    and its sum (an array changed in place is binned again).
    """
    key = (max_seconds, float(durations.sum()))
    if _bins_of[0] is not durations or _bins_of[1] != key:
        _bins_of[:] = [durations, key, {}]
    known = _bins_of[2]
    if count not in known:
        kept = durations[durations <= max_seconds]
        bins, lo = [], 0.0
        for edge in bucket_edges(durations, count, max_seconds):
            inside = kept[(kept > lo) & (kept <= edge)] if lo > 0 else kept[kept <= edge]
            if inside.size:
                bins.append((lo, edge, inside, float(inside.mean())))
                lo = edge
        known[count] = bins
    return known[count]


_bins_of: list = [None, None, {}]  # (durations, (max_seconds, sum), count -> bins)

BucketResult = tuple[list[Bucket], float, float]
"""A bucketing: (buckets, predicted throughput in audio s/s, predicted epoch seconds)."""


def bin_bucket(
    costs: SetupCosts,
    hardware: Any,
    seconds: tuple[float, float],
    labels: tuple[int, int],
    members: np.ndarray,
    usable: int,
    rate: float,
    batch_cap: int | None,
    utterances: float,
    fraction: float,
    mean_seconds: float | None = None,
) -> tuple[Bucket, float, float] | None:
    """One bucket: its largest batch, and the audio and wall seconds of its utterances.

    Args:
        costs: The setup's costs.
        hardware: The hardware profile (for the step-time model's rates).
        seconds: The duration range ``(min, max]``.
        labels: The label range ``(min, max]`` (min 0 for duration buckets).
        members: Durations of the sampled utterances in the bucket.
        usable: Usable bytes per device.
        rate: Model-input steps per audio second.
        batch_cap: Largest batch wanted, or None.
        utterances: Utterances of the dataset in the bucket.
        fraction: Their share of the dataset.
        mean_seconds: ``members.mean()``, where the caller has it.

    Returns:
        ``(bucket, audio seconds, wall seconds)``, or None when not one utterance fits.
    """
    t = max(1, round(seconds[1] * rate))
    u = labels[1]
    b = costs.max_batch(usable, t, u)
    if b == 0:
        return None
    if batch_cap is not None:
        b = min(b, batch_cap)
    step = bucket_step_seconds(costs, hardware, b, t, u)
    mean = float(members.mean()) if mean_seconds is None else mean_seconds
    bucket = Bucket(
        min_seconds=seconds[0],
        max_seconds=seconds[1],
        batch_size=b,
        max_input_length=t,
        max_label_length=u,
        min_label_length=labels[0],
        predicted_peak_bytes=costs.reserved_bytes(b, t, u),
        utterance_fraction=fraction,
        throughput_seconds_per_second=mean * b / step if step > 0 else 0.0,
        predicted_step_seconds=step,
    )
    return bucket, mean * utterances, (utterances / b) * step


def plan_buckets(
    costs: SetupCosts,
    hardware: Any,
    durations: np.ndarray,
    usable: int,
    rate: float,
    labels_per_second: float,
    max_seconds: float,
    batch_cap: int | None,
    num_utterances: int,
) -> BucketResult | None:
    """Best duration bucketing for a setup: (buckets, throughput, epoch seconds), or None if nothing fits."""
    best: BucketResult | None = None
    kept = durations[durations <= max_seconds]
    if kept.size == 0:
        return None
    for count in BUCKET_COUNTS:
        buckets, total_audio, total_time = [], 0.0, 0.0
        ok = True
        for lo, edge, inside, mean in _duration_bins(durations, count, max_seconds):
            u = max(1, math.ceil(edge * labels_per_second))
            made = bin_bucket(
                costs,
                hardware,
                (lo, edge),
                (0, u),
                inside,
                usable,
                rate,
                batch_cap,
                inside.size / kept.size * num_utterances,
                inside.size / kept.size,
                mean,
            )
            if made is None:
                ok = False
                break
            bucket, audio, seconds = made
            buckets.append(bucket)
            total_audio, total_time = total_audio + audio, total_time + seconds
        if not ok or not buckets or total_time <= 0:
            continue
        throughput = total_audio / total_time
        if best is None or throughput > best[1] * 1.01:  # a bucket more must earn 1 %
            best = (buckets, throughput, total_time)
    return best
