"""What the pre-flight's measurements change before the first optimizer step.

:func:`lowered_limits` turns the pre-flight's measurements (:mod:`asrfit.train.preflight`)
into new bucket limits: a bucket whose pessimistic batch held more batch-dependent bytes
than the plan predicted for it gets the largest batch whose predicted reserved bytes *plus
the excess* stay within the plan's usable bytes. The excess scales with the batch-dependent
prediction (measured over predicted), as activations do.

:func:`apply_preflight` does it to a trainer, the way the trainer lowers a limit after
repeated out-of-memory errors: the plan's bucket gets the new limit (the plan a checkpoint
saves, ``plan.adjusted.json`` in ``out_dir``), and the bucket's micro-batches run in pieces of
at most the new limit inside their optimizer step (:class:`asrfit.train.guards.MicroBatchLimits`,
saved in every checkpoint). The sampler keeps its batches, so its state, the epoch's length,
the LR schedule and the utterances of every optimizer step are those of the plan: a resumed
run iterates exactly the same batches. It also raises this machine's calibration
(``unmodelled_peak_bytes``, :mod:`asrfit.profiles.calibration`) when one is in use, so that
the next plan keeps the excess free, and notes pre-flight passes whose time differs from the
plan's step time by more than :data:`STEP_TIME_TOLERANCE`.

Known limitations: only buckets that have a pessimistic batch are measured; the others keep
their limits (the out-of-memory recovery lowers them if they fail). An excess that does not
shrink with the batch (a fixed workspace) is under-counted at the smaller batch. A pre-flight pass is a
first pass (one-time set-up costs), on the CPU under the allocator's profile (its own
overhead), without the optimizer step that the plan's step time includes: its time is a
rough check.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asrfit.train.preflight import PreflightResult

if TYPE_CHECKING:
    import torch

    from asrfit.plan.plan import Plan

logger = logging.getLogger(__name__)

MIB = 2**20

STEP_TIME_TOLERANCE = 0.25
"""Relative difference between a pre-flight pass's seconds and the plan's above which the
run report says so."""


@dataclass
class LimitLowering:
    """One bucket limit the pre-flight lowered.

    Attributes:
        bucket: Index into ``plan.buckets``.
        old_limit: The plan's limit.
        new_limit: The lowered limit.
        excess_bytes: Measured batch-dependent bytes above the prediction, at the bucket's
            pessimistic batch.
        predicted_bytes: Predicted reserved bytes of a full batch at the old limit.
        needed_bytes: The same plus the excess carried to it (:func:`extra_bytes`).
        corrected_bytes: Predicted reserved bytes plus the excess at the new limit.
        usable_bytes: The plan's usable bytes.
        batch: Which pessimistic batch measured it.
    """

    bucket: int
    old_limit: int
    new_limit: int
    excess_bytes: int
    predicted_bytes: int
    needed_bytes: int
    corrected_bytes: int
    usable_bytes: int
    batch: str

    def describe(self, plan: Plan) -> str:
        """One sentence with the figures."""
        b = plan.buckets[self.bucket]
        return (
            f"pre-flight: bucket {self.bucket} ({b.min_seconds:.1f}-{b.max_seconds:.1f} s): the "
            f"{self.batch!r} batch held {self.excess_bytes / MIB:.1f} MiB more than the plan "
            "allowed for; "
            f"a full batch of {self.old_limit} would need {self.needed_bytes / MIB:.1f} MiB "
            f"(predicted {self.predicted_bytes / MIB:.1f} MiB) of "
            f"{self.usable_bytes / MIB:.1f} MiB usable, so its limit goes from {self.old_limit} "
            f"to {self.new_limit} ({self.corrected_bytes / MIB:.1f} MiB)"
        )


def extra_bytes(plan: Plan, result: PreflightResult, bucket: int, batch_size: int) -> int:
    """The excess ``result`` measured, carried to a batch of ``batch_size`` at ``bucket``'s shape.

    The excess is of the batch-dependent bytes, so it scales as their prediction does
    (measured over predicted, applied to the prediction at the new shape); where nothing
    batch-dependent was predicted, per utterance.
    """
    excess = result.excess_bytes or 0
    if excess <= 0:
        return 0
    b = plan.buckets[bucket]
    measured_at = result.predicted_batch_bytes or 0
    if measured_at > 0:
        shape = (batch_size, b.max_input_length, b.max_label_length)
        there = plan.cost_model.predict(*shape) - plan.cost_model.c0_bytes
        return math.ceil(excess * max(0.0, there) / measured_at)
    return math.ceil(excess * batch_size / max(1, result.batch_size))


def limit_after(plan: Plan, bucket: int, result: PreflightResult) -> int:
    """The largest batch of ``bucket``, at most its limit, whose prediction plus the excess
    (:func:`extra_bytes`) fits the plan's usable bytes; at least 1.

    The shape is the bucket's own (``max_input_length``, ``max_label_length``), at which its
    limit was computed. A single utterance that does not fit is the out-of-memory recovery's
    to report.
    """
    b = plan.buckets[bucket]

    def fits(n: int) -> bool:
        need = plan.predicted_reserved_bytes(n, b.max_input_length, b.max_label_length)
        return need + extra_bytes(plan, result, bucket, n) <= plan.usable_bytes

    lo, hi = 0, b.batch_size  # both grow with n: the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return max(1, lo)


def lowered_limits(plan: Plan, results: Sequence[PreflightResult]) -> list[LimitLowering]:
    """The bucket limits that the pre-flight's measurements lower.

    Args:
        plan: The plan the pre-flight ran.
        results: Its results; those without a bucket, a measurement or an excess are passed by.

    Returns:
        One :class:`LimitLowering` per bucket whose limit comes down (the lowest its results
        give), in bucket order.
    """
    best: dict[int, tuple[int, PreflightResult]] = {}
    for r in results:
        if r.bucket is None or (r.excess_bytes or 0) <= 0:
            continue
        new = limit_after(plan, r.bucket, r)
        if r.bucket not in best or new < best[r.bucket][0]:
            best[r.bucket] = (new, r)
    out = []
    for k in sorted(best):
        new, r = best[k]
        b = plan.buckets[k]
        if new >= b.batch_size:
            continue
        shape = (b.max_input_length, b.max_label_length)
        out.append(
            LimitLowering(
                bucket=k,
                old_limit=b.batch_size,
                new_limit=new,
                excess_bytes=int(r.excess_bytes or 0),
                predicted_bytes=plan.predicted_reserved_bytes(b.batch_size, *shape),
                needed_bytes=plan.predicted_reserved_bytes(b.batch_size, *shape)
                + extra_bytes(plan, r, k, b.batch_size),
                corrected_bytes=plan.predicted_reserved_bytes(new, *shape)
                + extra_bytes(plan, r, k, new),
                usable_bytes=plan.usable_bytes,
                batch=r.name,
            )
        )
    return out


def with_lowered_limits(plan: Plan, lowerings: Sequence[LimitLowering]) -> Plan:
    """A copy of ``plan`` whose buckets have the new limits and corrected predicted peaks."""
    from asrfit.plan.plan import Plan

    adjusted = Plan.from_dict(plan.to_dict())
    for low in lowerings:
        old = adjusted.buckets[low.bucket]
        adjusted.buckets[low.bucket] = dataclasses.replace(
            old, batch_size=low.new_limit, predicted_peak_bytes=low.corrected_bytes
        )
    adjusted.warnings = [*adjusted.warnings, *(low.describe(plan) for low in lowerings)]
    return adjusted


def step_time_notes(
    results: Sequence[PreflightResult], tolerance: float = STEP_TIME_TOLERANCE
) -> list[str]:
    """Sentences for the pre-flight passes whose seconds differ from the plan's by more than
    ``tolerance`` (relative), e.g. ``... took 0.90 s, the plan predicts 0.50 s (+80 %)``."""
    notes = []
    for r in results:
        if not r.predicted_seconds or r.seconds <= 0:
            continue
        change = r.seconds / r.predicted_seconds - 1.0
        if abs(change) > tolerance:
            notes.append(
                f"pre-flight: the {r.name!r} batch (bucket {r.bucket}, {r.batch_size} utt.) took "
                f"{r.seconds:.2f} s for forward and backward, the plan predicts "
                f"{r.predicted_seconds:.2f} s for a step of its bucket ({change:+.0%}, over "
                f"{tolerance:.0%})"
            )
    return notes


def update_calibration(lowerings: Sequence[LimitLowering], device: torch.device) -> Path | None:
    """Raise this machine's calibration to the largest measured excess, when there is one.

    ``unmodelled_peak_bytes`` becomes the larger of its value and the excess (plans made
    afterwards keep it free); the figures go to ``measurements["preflight"]``. Written
    atomically, in place.

    Args:
        lowerings: What the pre-flight lowered (nothing is written without one).
        device: The training device: the CPU's or the GPU's calibration.

    Returns:
        The file written, or None when there is no calibration for this machine.
    """
    from asrfit.profiles.calibration import find_calibration, write_calibration

    if not lowerings:
        return None
    found = find_calibration("cuda" if device.type == "cuda" else "cpu")
    if found is None:
        return None
    calibration, path = found
    largest = max(lowerings, key=lambda low: low.excess_bytes)
    before = calibration.unmodelled_peak_bytes
    calibration.unmodelled_peak_bytes = max(before or 0, largest.excess_bytes)
    calibration.measurements = {
        **calibration.measurements,
        "preflight": {
            "unmodelled_peak_bytes_before": before,
            "lowerings": [dataclasses.asdict(low) for low in lowerings],
        },
    }
    write_calibration(calibration, path)
    logger.warning(
        "pre-flight: calibration %s now keeps %.1f MiB free above the traced peak (was %s).",
        path,
        calibration.unmodelled_peak_bytes / MIB,
        "not measured" if before is None else f"{before / MIB:.1f} MiB",
    )
    return path


def apply_preflight(trainer: Any, results: Sequence[PreflightResult]) -> list[str]:
    """Lower a trainer's bucket limits where its pre-flight measured more than predicted.

    Every process takes the lowest limit any process found, so all lower alike. Call it
    before the first optimizer step.

    Args:
        trainer: A :class:`~asrfit.train.trainer.MemoryEfficientTrainer` (``plan``,
            ``micro_limits``, ``accelerator``, ``out_dir``).
        results: Its pre-flight results.

    Returns:
        Sentences for the run report: each lowering with its figures, and each pass whose
        time differs from the plan's by more than :data:`STEP_TIME_TOLERANCE`.
    """
    plan, acc = trainer.plan, trainer.accelerator
    if plan is None:
        return step_time_notes(results)
    lowerings = lowered_limits(plan, results)
    if acc.num_processes > 1:  # every process takes the lowest limit any process found
        from accelerate.utils import gather_object

        lowest: dict[int, LimitLowering] = {}
        for low in gather_object(lowerings):
            if low.bucket not in lowest or low.new_limit < lowest[low.bucket].new_limit:
                lowest[low.bucket] = low
        lowerings = [lowest[k] for k in sorted(lowest)]
    notes = [low.describe(plan) for low in lowerings]
    if lowerings:
        for low in lowerings:
            trainer.micro_limits.lower(low.bucket, low.new_limit)
        trainer.plan = with_lowered_limits(plan, lowerings)
        where = ""
        if trainer.out_dir is not None and acc.is_main_process:
            saved = trainer.plan.save(Path(trainer.out_dir) / "plan.adjusted.json")
            where = f" (adjusted plan written to {saved})"
        for note in notes:
            logger.warning("%s%s.", note, where)
        if acc.is_main_process:
            update_calibration(lowerings, acc.device)
    notes += step_time_notes(results)
    for note in notes[len(lowerings) :]:
        logger.warning("%s.", note)
    return notes


__all__ = [
    "STEP_TIME_TOLERANCE",
    "LimitLowering",
    "apply_preflight",
    "extra_bytes",
    "limit_after",
    "lowered_limits",
    "step_time_notes",
    "update_calibration",
    "with_lowered_limits",
]
