"""Factories for hand-made plans: a :class:`~asrfit.plan.plan.Plan` without a search.

A test that needs a plan names only what it depends on (the batch limits, the bucket edges,
the setup) and takes the rest from :func:`make_plan`'s defaults, which are keyword arguments
named with their units. The defaults describe one small plan, the *reference plan*:

- a T4 with 13.6 GiB usable (16 GiB x 0.85), one fp32 AdamW process;
- three duration buckets ``(0, 4]``, ``(4, 10]``, ``(10, 20]`` s with batch limits 32, 12
  and 5 and 50 %, 40 % and 10 % of the utterances;
- 16 kHz raw-audio input (``max_input_length = round(max_seconds x 16000)``) and 15 labels
  per second (``max_label_length = ceil(max_seconds x 15)``), as a plan for a wav2vec2-style
  model with character labels sizes its buckets;
- gradient accumulation 2 toward a target of 32 utterances;
- the test cost model :func:`reference_cost_model`; data read in memory with decoded audio
  cached, longer utterances chunked, no loader workers.

What a real plan derives, the factory derives the same way where the formula is closed-form:
each bucket's predicted peak is the plan's own :meth:`Plan.predicted_reserved_bytes` of a full
batch of it; the effective batch is the plan search's accumulation arithmetic
(:func:`asrfit.plan.effective_batch.accumulation`, for the given accumulation). The mean
duration of a bucket's utterances, which a real plan measures, is the bucket's midpoint here.

Test values (not derived, and stated as such):

- the batch limits are given, not searched: a bucket's limit need not be the largest batch
  that fits ``usable_bytes``;
- per-bucket throughput is a given figure (Default: 100 audio seconds per second);
- ``fingerprints`` is empty: a hand-made plan was made for no particular model, GPU or
  dataset, and a run checks no fingerprint the plan lacks
  (:func:`asrfit.plan.fingerprint.fingerprint_mismatches`);
- ``rests_on``, ``alternatives``, ``rejected`` and ``warnings`` are empty.

Every figure can be given explicitly; a test that depends on a number passes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Bucket, DataDecisions, Plan

GIB = 2**30

REFERENCE_BATCH_SIZES: tuple[int, ...] = (32, 12, 5)
"""The reference plan's batch limits, one per bucket."""

REFERENCE_EDGES_SECONDS: tuple[float, ...] = (0.0, 4.0, 10.0, 20.0)
"""The reference plan's bucket edges: bucket k is ``(edges[k], edges[k + 1]]`` seconds."""

REFERENCE_UTTERANCE_FRACTIONS: tuple[float, ...] = (0.5, 0.4, 0.1)
"""The reference plan's share of utterances per bucket."""

REFERENCE_USABLE_BYTES = int(13.6 * GIB)
"""A T4's 16 GiB at the 0.85 safety margin: 13.6 GiB."""


def reference_cost_model() -> PeakModel:
    """A new ``peak = 1e9 + B x (100 T + 0.001 T^2 + 1000 U)`` bytes: a test cost model."""
    return PeakModel(1e9, 100.0, 0.001, 1000.0)


def make_bucket(
    min_seconds: float,
    max_seconds: float,
    batch_size: int,
    *,
    input_frames_per_second: float = 16000.0,
    labels_per_second: float = 15.0,
    max_input_length: int | None = None,
    max_label_length: int | None = None,
    min_label_length: int = 0,
    predicted_peak_bytes: int = 0,
    utterance_fraction: float = 0.0,
    throughput_seconds_per_second: float = 100.0,
    predicted_step_seconds: float = 0.0,
) -> Bucket:
    """A bucket ``(min_seconds, max_seconds]`` with a batch limit, sized as a plan sizes it.

    Args:
        min_seconds: Lower edge (exclusive, except for a plan's first bucket).
        max_seconds: Upper edge (inclusive).
        batch_size: The batch limit.
        input_frames_per_second: Model-input steps per audio second, for the default
            ``max_input_length``. (Default: 16000, raw 16 kHz audio)
        labels_per_second: Labels per audio second, for the default ``max_label_length``.
            (Default: 15)
        max_input_length: Model-input length of ``max_seconds``. (Default:
            ``max(1, round(max_seconds x input_frames_per_second))``, as
            :meth:`Plan.input_length`)
        max_label_length: Longest label the limit is for. (Default:
            ``ceil(max_seconds x labels_per_second)``)
        min_label_length: Lower label edge (exclusive) in a two-dimensional plan; 0 otherwise.
        predicted_peak_bytes: Predicted reserved bytes of a full batch. (Default: 0, not known;
            :func:`make_plan` fills it from its cost model)
        utterance_fraction: Share of the dataset's utterances in the bucket.
        throughput_seconds_per_second: Predicted audio seconds trained per wall second.
            (Default: 100, a test value)
        predicted_step_seconds: Predicted seconds of a full batch's step (0: not known).

    Returns:
        The bucket (validated by :class:`Bucket` itself).
    """
    if max_input_length is None:
        max_input_length = max(1, round(max_seconds * input_frames_per_second))
    if max_label_length is None:
        max_label_length = max(min_label_length + 1, math.ceil(max_seconds * labels_per_second))
    return Bucket(
        min_seconds=float(min_seconds),
        max_seconds=float(max_seconds),
        batch_size=int(batch_size),
        max_input_length=int(max_input_length),
        max_label_length=int(max_label_length),
        predicted_peak_bytes=int(predicted_peak_bytes),
        utterance_fraction=float(utterance_fraction),
        throughput_seconds_per_second=float(throughput_seconds_per_second),
        min_label_length=int(min_label_length),
        predicted_step_seconds=float(predicted_step_seconds),
    )


def make_plan(
    batch_sizes: Sequence[int] = REFERENCE_BATCH_SIZES,
    *,
    bucket_edges_seconds: Sequence[float] = REFERENCE_EDGES_SECONDS,
    utterance_fractions: Sequence[float] | None = None,
    predicted_peak_bytes: Sequence[int] | None = None,
    throughputs_seconds_per_second: Sequence[float] | None = None,
    buckets: Sequence[Bucket] | None = None,
    model: str = "tiny",
    gpu: str = "T4",
    usable_bytes: int = REFERENCE_USABLE_BYTES,
    setup: Setup | None = None,
    gradient_accumulation_steps: int = 2,
    target_effective_batch: str = "32 utterances",
    effective_batch_utterances: float | None = None,
    effective_batch_hours: float | None = None,
    predicted_throughput_seconds_per_second: float | None = None,
    predicted_epoch_seconds: float | None = None,
    num_utterances: int = 1000,
    cost_model: PeakModel | None = None,
    data: DataDecisions | None = None,
    num_workers: int = 0,
    long_utterances: str = "chunk",
    long_utterance_fraction: float = 0.0,
    data_reasons: Sequence[str] = (),
    input_frames_per_second: float = 16000.0,
    labels_per_second: float = 15.0,
    **plan_fields: Any,
) -> Plan:
    """A valid :class:`Plan` from the numbers a test depends on (module doc: the defaults).

    Args:
        batch_sizes: Batch limit per bucket. (Default: 32, 12, 5)
        bucket_edges_seconds: ``len(batch_sizes) + 1`` increasing edges in seconds; bucket k
            is ``(edges[k], edges[k + 1]]``. (Default: 0, 4, 10, 20)
        utterance_fractions: Share of utterances per bucket. (Default: 0.5, 0.4, 0.1 on the
            reference edges, equal shares on other edges)
        predicted_peak_bytes: Predicted reserved bytes of a full batch per bucket. (Default:
            the plan's :meth:`Plan.predicted_reserved_bytes` of that batch, as a real plan)
        throughputs_seconds_per_second: Audio seconds per wall second per bucket.
            (Default: 100 each, a test value)
        buckets: The buckets themselves (e.g. two-dimensional ones made with
            :func:`make_bucket`), instead of the five arguments above; their peaks are kept.
        model: Model name. (Default: "tiny")
        gpu: GPU name. (Default: "T4")
        usable_bytes: Usable memory per GPU. (Default: 13.6 GiB)
        setup: The setup. (Default: ``Setup()``: fp32, AdamW, one process)
        gradient_accumulation_steps: Micro-batches per optimizer step. (Default: 2)
        target_effective_batch: What was asked for. (Default: "32 utterances")
        effective_batch_utterances: Mean utterances per optimizer step over all processes.
            (Default: the plan search's arithmetic for ``gradient_accumulation_steps``)
        effective_batch_hours: Mean audio hours per optimizer step. (Default: as above, with
            bucket midpoints for mean durations)
        predicted_throughput_seconds_per_second: Audio seconds per wall second over all
            GPUs. (Default: total audio over total wall time of the buckets, x world size)
        predicted_epoch_seconds: Wall seconds of an epoch. (Default: ``num_utterances``
            utterances of the buckets' mean duration at the predicted throughput)
        num_utterances: Dataset size the default epoch time is for. (Default: 1000)
        cost_model: The peak-memory model. (Default: :func:`reference_cost_model`)
        data: Data-side decisions. (Default: in-memory, cached, ``max_seconds`` the last
            edge, with the three arguments below)
        num_workers: Loader workers of the default ``data``. (Default: 0)
        long_utterances: "chunk" or "filter", for the default ``data``. (Default: "chunk")
        long_utterance_fraction: Share above the last edge, for the default ``data``.
        data_reasons: The default ``data``'s reasons, one sentence each. (Default: none)
        input_frames_per_second: Model-input steps per audio second. (Default: 16000)
        labels_per_second: Labels per audio second. (Default: 15)
        **plan_fields: Any other :class:`Plan` field (``expandable_segments``,
            ``architecture``, ``bucketing``, ``num_nodes``, ``fingerprints``, ...).

    Returns:
        The plan, validated by :class:`Plan` itself.

    Raises:
        ValueError: When the per-bucket sequences do not match ``batch_sizes`` in length, or
            ``buckets`` is given with any of them.
    """
    setup = setup if setup is not None else Setup()
    cost_model = cost_model if cost_model is not None else reference_cost_model()
    if buckets is None:
        made = _buckets(
            batch_sizes,
            bucket_edges_seconds,
            utterance_fractions,
            throughputs_seconds_per_second,
            input_frames_per_second,
            labels_per_second,
        )
    else:
        given = (utterance_fractions, predicted_peak_bytes, throughputs_seconds_per_second)
        if any(v is not None for v in given):
            raise ValueError("give buckets or the per-bucket sequences, not both")
        made = [Bucket.from_dict(b.to_dict()) for b in buckets]  # copies: the caller's stay
    if data is None:
        data = DataDecisions(
            streaming=False,
            cache_decoded_audio=True,
            long_utterances=long_utterances,
            max_seconds=made[-1].max_seconds,
            long_utterance_fraction=long_utterance_fraction,
            num_workers=num_workers,
            reasons=list(data_reasons),
        )
    world = setup.world_size
    per_batch_utts, mean_seconds, throughput = _bucket_means(made)
    eff_utts = per_batch_utts * world * gradient_accumulation_steps
    if effective_batch_utterances is None:
        effective_batch_utterances = eff_utts
    if effective_batch_hours is None:
        effective_batch_hours = effective_batch_utterances * mean_seconds / 3600
    if predicted_throughput_seconds_per_second is None:
        predicted_throughput_seconds_per_second = throughput * world
    if predicted_epoch_seconds is None:
        total = predicted_throughput_seconds_per_second
        predicted_epoch_seconds = num_utterances * mean_seconds / total if total > 0 else 0.0
    plan = Plan(
        model=model,
        gpu=gpu,
        usable_bytes=int(usable_bytes),
        setup=setup,
        buckets=made,
        gradient_accumulation_steps=gradient_accumulation_steps,
        target_effective_batch=target_effective_batch,
        effective_batch_utterances=float(effective_batch_utterances),
        effective_batch_hours=float(effective_batch_hours),
        predicted_throughput_seconds_per_second=float(predicted_throughput_seconds_per_second),
        predicted_epoch_seconds=float(predicted_epoch_seconds),
        cost_model=cost_model,
        data=data,
        input_frames_per_second=input_frames_per_second,
        labels_per_second=labels_per_second,
        **plan_fields,
    )
    if buckets is None:
        if predicted_peak_bytes is None:
            predicted_peak_bytes = [
                plan.predicted_reserved_bytes(b.batch_size, b.max_input_length, b.max_label_length)
                for b in plan.buckets
            ]
        _check_length("predicted_peak_bytes", predicted_peak_bytes, len(made))
        for b, peak in zip(plan.buckets, predicted_peak_bytes, strict=True):
            b.predicted_peak_bytes = int(peak)
    return plan


def _buckets(
    batch_sizes: Sequence[int],
    edges: Sequence[float],
    fractions: Sequence[float] | None,
    throughputs: Sequence[float] | None,
    input_frames_per_second: float,
    labels_per_second: float,
) -> list[Bucket]:
    n = len(batch_sizes)
    _check_length("bucket_edges_seconds", edges, n + 1)
    if fractions is None:
        reference = tuple(edges) == REFERENCE_EDGES_SECONDS
        fractions = REFERENCE_UTTERANCE_FRACTIONS if reference else [1.0 / n] * n
    throughputs = [100.0] * n if throughputs is None else throughputs
    _check_length("utterance_fractions", fractions, n)
    _check_length("throughputs_seconds_per_second", throughputs, n)
    return [
        make_bucket(
            edges[k],
            edges[k + 1],
            batch_sizes[k],
            input_frames_per_second=input_frames_per_second,
            labels_per_second=labels_per_second,
            utterance_fraction=fractions[k],
            throughput_seconds_per_second=throughputs[k],
        )
        for k in range(n)
    ]


def _bucket_means(buckets: Sequence[Bucket]) -> tuple[float, float, float]:
    """``(utterances per micro-batch, mean seconds per utterance, audio s per wall s)``.

    The first two are :func:`asrfit.plan.effective_batch.accumulation`'s (bucket midpoints
    for mean durations); the third is total audio over total wall time, 0 when a bucket with
    utterances has no throughput. A plan whose fractions are all 0 counts buckets alike.
    """
    fractions = [b.utterance_fraction for b in buckets]
    if not any(fractions):
        fractions = [1.0 / len(buckets)] * len(buckets)
    pairs = list(zip(fractions, buckets, strict=True))
    per_batch = 1.0 / sum(f / b.batch_size for f, b in pairs)
    audio = [
        (f * (b.min_seconds + b.max_seconds) / 2, b.throughput_seconds_per_second) for f, b in pairs
    ]
    mean_seconds = sum(a for a, _ in audio)
    if any(a > 0 and rate <= 0 for a, rate in audio):
        return per_batch, mean_seconds, 0.0
    wall = sum(a / rate for a, rate in audio if a > 0)
    return per_batch, mean_seconds, mean_seconds / wall if wall > 0 else 0.0


def _check_length(name: str, values: Sequence[Any], want: int) -> None:
    if len(values) != want:
        raise ValueError(f"{name}: {len(values)} values, want {want}")


__all__ = [
    "REFERENCE_BATCH_SIZES",
    "REFERENCE_EDGES_SECONDS",
    "REFERENCE_USABLE_BYTES",
    "REFERENCE_UTTERANCE_FRACTIONS",
    "make_bucket",
    "make_plan",
]
