"""The effective batch of a plan: accumulation steps for a target, and the label rate the
buckets are sized with."""

from __future__ import annotations

import numpy as np

from asrfit.memory.report import CHAR_LABELS_PER_SECOND
from asrfit.plan.explain import shortfall_warning
from asrfit.plan.plan import Bucket

CHARS_PER_SUBWORD = 4.0  # characters per BPE token for subword vocabularies


def chars_per_second(
    chars: np.ndarray, durations: np.ndarray, encoder_fps: float | None, subword: bool
) -> float:
    """The 95th percentile of the sample's transcript characters per second, of the
    utterances a model can learn from: one whose labels outnumber the encoder's frames (a
    mislabelled or truncated clip) is skipped by training, and is left out here too."""
    if not chars.size:
        return CHAR_LABELS_PER_SECOND
    rates = chars / np.maximum(durations[: chars.size], 1e-3)
    if encoder_fps:
        feasible = rates[rates <= encoder_fps * (CHARS_PER_SUBWORD if subword else 1.0)]
        rates = feasible if feasible.size else rates
    return float(np.percentile(rates, 95))


def accumulation(
    buckets: list[Bucket], world: int, target_utts: int | None, target_hours: float | None
) -> tuple[int, float, float, list[str]]:
    """Accumulation steps and the effective batch they give (utterances, hours), with warnings."""
    batches = [b.utterance_fraction / b.batch_size for b in buckets]  # micro-batches per utterance
    per_batch_utts = 1.0 / sum(batches)
    mean_seconds = sum(b.utterance_fraction * (b.min_seconds + b.max_seconds) / 2 for b in buckets)
    per_batch_seconds = per_batch_utts * mean_seconds
    warnings: list[str] = []
    if target_hours is not None:
        accum = max(1, round(target_hours * 3600 / (per_batch_seconds * world)))
        reachable = per_batch_seconds * world / 3600
        if target_hours < reachable * 0.75:
            warnings.append(
                f"target {target_hours:g} h per step is below one micro-batch on each GPU; best reachable: {reachable:.3f} h"
            )
    else:
        target = target_utts or 1
        accum = max(1, round(target / (per_batch_utts * world)))
        if target < world:
            warnings.append(
                f"target {target} utterances is below one per GPU; best reachable: {world}"
            )
    eff_utts = per_batch_utts * world * accum
    if target_hours is None and target_utts and abs(eff_utts - target_utts) > 0.1 * target_utts:
        warnings.append(shortfall_warning(target_utts, accum, per_batch_utts, world, buckets))
    return accum, eff_utts, eff_utts * mean_seconds / 3600, warnings
