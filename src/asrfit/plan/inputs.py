"""The planner's first phase: what the search works from, derived once from the request.

:func:`plan_inputs` checks the request, resolves the model to its step adapter, applies the
long-audio rule to the largest bucket edge, measures the label rate, pairs label lengths
with the sampled durations (for duration x label buckets), chunks the sample as training
will, and takes the safety margin and this machine's calibration off the usable memory.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from asrfit.errors import ConfigError
from asrfit.memory.cuda.allocator import CUDA_CONTEXT_BYTES
from asrfit.memory.report import resolve_adapter
from asrfit.memory.step import SUPPORTED_FAMILIES
from asrfit.plan.effective_batch import CHARS_PER_SUBWORD, chars_per_second
from asrfit.plan.long_audio import chunked_sample, long_audio_cap_from_profile
from asrfit.plan.margin import applied_margin
from asrfit.plan.precision import check_precision
from asrfit.profiles.calibration import calibration_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanInputs:
    """The request as the search uses it.

    Attributes:
        adapter: The model's step adapter (:mod:`asrfit.memory.models.adapters`).
        profile: Its ``ModelProfile``.
        world: Processes over all nodes.
        frames_per_second: Model input frames (or samples) per audio second.
        durations: The sampled utterance durations (seconds), chunked as training chunks them.
        paired_labels: Label lengths paired with ``durations``, or None when the profile
            does not pair them (no duration x label buckets then).
        edge_max_seconds: The largest bucket edge.
        labels_per_second: Labels per audio second (95th percentile of the transcripts).
        usable_bytes: Memory the plan may fill, after the margin and the calibration.
        margin_reason: How the safety margin was chosen (for ``rests_on``).
        calibration: This machine's ``(Calibration, path)``, or None.
        architecture: The GPU's architecture, or None.
        batch_cap: The largest batch per process the target allows (None: no cap).
        max_input: Input frames of the largest bucket edge.
    """

    adapter: Any
    profile: Any
    world: int
    frames_per_second: float
    durations: np.ndarray
    paired_labels: np.ndarray | None
    edge_max_seconds: float
    labels_per_second: float
    usable_bytes: int
    margin_reason: str
    calibration: Any
    architecture: str | None
    batch_cap: int | None
    max_input: int


def check_request(
    long_utterances: str,
    target_hours: float | None,
    target_effective_batch: int | None,
    bucketing: str,
) -> None:
    """Raise :class:`ConfigError` for a value the planner cannot take."""
    if long_utterances not in ("chunk", "filter"):
        raise ConfigError(f"long_utterances={long_utterances!r}: use 'chunk' or 'filter'.")
    if target_hours is not None and target_hours <= 0:
        raise ConfigError(f"target_hours={target_hours}: must be positive.")
    if target_effective_batch is not None and target_effective_batch < 1:
        raise ConfigError(f"target_effective_batch={target_effective_batch}: must be at least 1.")
    if bucketing not in ("auto", "1d", "2d"):
        raise ConfigError(f"bucketing={bucketing!r}: use 'auto', '1d' or '2d'.")


def plan_inputs(
    hardware: Any,
    dataset: Any,
    model: Any,
    *,
    target_effective_batch: int | None,
    target_hours: float | None,
    precision: str | None,
    world_size: int | None,
    long_utterances: str,
    max_seconds: float | None,
    freeze_feature_encoder: bool,
) -> PlanInputs:
    """Derive the search's inputs (the arguments are :func:`asrfit.plan.search.plan`'s).

    Raises:
        ConfigError: A precision the hardware lacks, or a model that is not a name or config.
    """
    check_precision(precision, hardware)
    world = world_size or max(1, hardware.num_gpus)
    adapter, profile = resolve_adapter(model, freeze_feature_encoder=freeze_feature_encoder)
    if profile is None:
        raise ConfigError(
            f"plan needs a model name or config, not {type(model).__name__}; "
            f"families: {SUPPORTED_FAMILIES}."
        )
    rate = float(profile.input_frames_per_second or 16000)
    durations = np.asarray(
        dataset.duration_sample_seconds or [dataset.duration_max_seconds], dtype=float
    )
    longest = float(max(dataset.duration_max_seconds, durations.max()))
    edge_max = float(max_seconds) if max_seconds is not None else longest
    if max_seconds is None:  # the long-audio rule (asrfit.plan.long_audio)
        cap, reason = long_audio_cap_from_profile(dataset.duration_p90_seconds, longest)
        if cap is not None:
            edge_max = cap
            logger.warning("long audio: %s", reason)
    if profile.max_input_seconds:
        edge_max = min(edge_max, float(profile.max_input_seconds))
    chars = np.asarray(dataset.text_chars_sample or [dataset.text_chars_mean], dtype=float)
    subword = (profile.vocab_size or 0) > 64
    cps = chars_per_second(chars, durations, profile.encoder_frames_per_second, subword)
    labels_per_second = cps / CHARS_PER_SUBWORD if subword else cps
    paired = None
    if dataset.text_chars_sample and len(dataset.text_chars_sample) == durations.size:
        paired = np.ceil(chars / CHARS_PER_SUBWORD) if subword else chars
    if long_utterances == "chunk" and durations.max() > edge_max:
        # training cuts them into pieces, which the buckets must hold (else the sampler drops them)
        durations, paired = chunked_sample(durations, paired, edge_max)
    usable, margin_reason = applied_margin(int(hardware.usable_bytes), hardware.safety_margin)
    calibration = calibration_for(hardware)
    if calibration is not None:  # what real steps here held beyond the trace, kept free
        usable -= calibration[0].unmodelled_bytes(usable)
    if hardware.num_gpus == 0:  # planning for CPU RAM: no CUDA context
        usable = max(0, usable - CUDA_CONTEXT_BYTES)
    batch_cap = None
    if target_hours is None and target_effective_batch is not None:
        batch_cap = max(1, math.ceil(target_effective_batch / world))
    return PlanInputs(
        adapter=adapter,
        profile=profile,
        world=world,
        frames_per_second=rate,
        durations=durations,
        paired_labels=paired,
        edge_max_seconds=edge_max,
        labels_per_second=labels_per_second,
        usable_bytes=usable,
        margin_reason=margin_reason,
        calibration=calibration,
        architecture=hardware.spec.architecture if hardware.spec is not None else None,
        batch_cap=batch_cap,
        max_input=max(1, round(edge_max * rate)),
    )
