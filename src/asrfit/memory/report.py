"""``simulate``: from a model name, a batch in seconds and a setup to a memory report.

This is the call the CLI and the planner make. It resolves the model (bundled config, Hub
id or local path; config only), turns seconds into the model's input length, traces the
step (:func:`asrfit.memory.simulate.simulate_step`), shards model states for ZeRO/DDP
(:mod:`asrfit.memory.cuda.zero`) and predicts CUDA allocated/reserved bytes
(:mod:`asrfit.memory.cuda.allocator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from asrfit.errors import UnsupportedModelError
from asrfit.memory.cuda.allocator import CudaPrediction, predict_cuda
from asrfit.memory.cuda.zero import shard_breakdown, unmodelled_step_time
from asrfit.memory.setup import Setup
from asrfit.memory.step import (
    SUPPORTED_FAMILIES,
    BatchShape,
    DeferredAdapter,
    StepAdapter,
    StepMemory,
)
from asrfit.memory.steptime.roofline import seconds_by_kind, step_seconds
from asrfit.profiles.calibration import find_calibration
from asrfit.profiles.host import device_rates, host_rates
from asrfit.utils.serialization import JsonDataclass

CHAR_LABELS_PER_SECOND = 15.0  # characters per second of read speech (LibriSpeech ~14-16)
SUBWORD_LABELS_PER_SECOND = 4.0  # BPE tokens per second (Whisper, Parakeet vocabularies)


@dataclass
class MemoryReport(JsonDataclass):
    """Predicted memory of one training step of a model on a GPU.

    Attributes:
        model: Model name.
        setup: The setup.
        batch: Padded batch shape in model-input units.
        audio_seconds: Padded audio seconds per utterance.
        step: The traced step (one process, whole model states).
        breakdown_bytes: Per-device bytes by category after ZeRO/DDP sharding.
        cuda: Allocated / reserved / device-total predictions.
        gpu: GPU name the verdict is for, or None.
        usable_bytes: Usable bytes of that GPU (memory x safety margin), or None.
        fits: Whether predicted reserved bytes stay within usable bytes (None without a GPU).
        notes: What the prediction rests on.
        step_seconds: Predicted seconds of one optimizer step of this shape on the GPU
            (``gpu="cpu"``: this machine's CPU), from the per-op roofline of
            :mod:`asrfit.memory.steptime.roofline`; None without a device.
        audio_seconds_per_second: Padded audio seconds trained per wall second
            (``batch_size x audio_seconds / step_seconds``), or None.
        step_seconds_by_kind: The predicted step split by op kind (matmul, conv, ...).
    """

    model: str
    setup: Setup
    batch: BatchShape
    audio_seconds: float
    step: StepMemory
    breakdown_bytes: dict[str, int]
    cuda: CudaPrediction
    gpu: str | None = None
    usable_bytes: int | None = None
    fits: bool | None = None
    notes: list[str] = field(default_factory=list)
    step_seconds: float | None = None
    audio_seconds_per_second: float | None = None
    step_seconds_by_kind: dict[str, float] = field(default_factory=dict)


def resolve_adapter(model: Any, *, freeze_feature_encoder: bool = True) -> tuple[StepAdapter, Any]:
    """An adapter and a ModelProfile (or None) for a model spec, config or adapter.

    Raises:
        UnsupportedModelError: For a module or config of an unsupported class.
    """
    from asrfit.profiles.model import ModelProfile, load_config

    if isinstance(model, StepAdapter):
        # A transformers config behind the adapter tells the input's rate and window.
        config = getattr(model, "config", None)
        if config is None or not (hasattr(config, "to_dict") and hasattr(config, "model_type")):
            return model, None
        try:
            return model, ModelProfile.from_spec(config)
        except UnsupportedModelError:
            return model, None

    if hasattr(model, "parameters") and callable(model.parameters):
        raise UnsupportedModelError(
            f"{type(model).__name__}: pass a model name, Hub id, config or StepAdapter, not a built module "
            f"(the simulator builds the model itself on fake tensors). Supported families: {', '.join(SUPPORTED_FAMILIES)}."
        )
    from asrfit.memory.cache import cached_model_fact
    from asrfit.profiles.bundled import find_bundled
    from asrfit.profiles.registry import config_to_dict

    bundled = find_bundled(model) if isinstance(model, str) else None
    if bundled is not None:
        # A bundled name: its config dict is a cached fact of the bundled JSON, like the
        # profile and the simulations, so a warm plan loads no config (and imports no
        # transformers); the adapter is made at the first simulation.
        spec = model

        def config() -> Any:
            return load_config(spec)

        config_data = cached_model_fact(
            "config", {"bundled": bundled.config_dict()}, lambda: config_to_dict(config())
        )
    else:
        loaded = (
            model
            if hasattr(model, "to_dict") and hasattr(model, "model_type")
            else load_config(model)
        )

        def config() -> Any:
            return loaded

        config_data = config_to_dict(loaded)

    def measure() -> dict[str, Any]:  # builds the model on the meta device
        built = ModelProfile.from_spec(config(), freeze_feature_encoder=freeze_feature_encoder)
        return built.to_dict()

    inputs = {"config": config_data, "freeze_feature_encoder": freeze_feature_encoder}
    profile = ModelProfile.from_dict(cached_model_fact("profile", inputs, measure))
    name = model if isinstance(model, str) else profile.name

    def make() -> StepAdapter:
        from asrfit.memory.models.generic import speech_adapter  # imports torch: at the first trace

        return speech_adapter(config(), freeze_feature_encoder=freeze_feature_encoder, name=name)

    return (DeferredAdapter(name, make) if bundled is not None else make()), profile


def batch_for_seconds(
    profile: Any, batch_size: int, seconds: float, label_length: int | None = None
) -> BatchShape:
    """The padded batch shape of ``batch_size`` utterances of ``seconds`` for a model profile.

    The input length is in the model's input units: samples for raw audio, feature frames
    at the feature extractor's hop (and stacking) for features
    (:func:`asrfit.profiles.model_build.input_steps_per_second`), and the whole window for
    a model that pads every input to a fixed window (Whisper's 30 s). Label length defaults
    to 15 characters per second for character vocabularies (<= 64 symbols) and 4 tokens
    per second for subword vocabularies.
    """
    rate = profile.input_frames_per_second or 16000
    if profile.max_input_seconds:  # Whisper pads every input to its window
        seconds = min(seconds, profile.max_input_seconds)
        input_length = max(1, round(profile.max_input_seconds * rate))
    else:
        input_length = max(1, round(seconds * rate))
    if label_length is None:
        per_second = (
            CHAR_LABELS_PER_SECOND if (profile.vocab_size or 0) <= 64 else SUBWORD_LABELS_PER_SECOND
        )
        label_length = max(1, math.ceil(seconds * per_second))
    return BatchShape(batch_size=batch_size, input_length=input_length, label_length=label_length)


def simulate(
    model: Any,
    *,
    batch_size: int,
    seconds: float,
    label_length: int | None = None,
    setup: Setup | None = None,
    gpu: Any = None,
    target: str = "cuda",
    expandable_segments: bool = True,
) -> MemoryReport:
    """Predict the memory of one training step.

    Args:
        model: Bundled name ("xls-r-1b"), Hub id, local path, transformers config, or a StepAdapter.
        batch_size: Utterances per micro-batch.
        seconds: Padded audio seconds per utterance.
        label_length: Padded label length (Default: from ``seconds``, see :func:`batch_for_seconds`).
        setup: Precision, checkpointing, optimizer, ZeRO (Default: fp32 AdamW).
        gpu: A ``HardwareProfile`` or GPU name to judge the fit against and time the step
            on, "cpu" for this machine's CPU (CPU kernels, measured host rates), or None.
        target: Kernels to follow, "cuda" (Default) or "cpu" (implied by ``gpu="cpu"``).
        expandable_segments: Whether the run sets ``expandable_segments:True`` (asrfit's default).

    Returns:
        The report: breakdown, allocated/reserved predictions and, with a GPU, the verdict.
    """
    setup = setup or Setup()
    on_cpu = isinstance(gpu, str) and gpu.strip().lower() == "cpu"
    if on_cpu:
        target, gpu = "cpu", None
    adapter, profile = resolve_adapter(model, freeze_feature_encoder=setup.freeze_feature_encoder)
    window_note = None
    if profile is not None:
        batch = batch_for_seconds(profile, batch_size, seconds, label_length)
        window = profile.max_input_seconds
        if window and seconds > window:  # an utterance is at most one window of audio
            window_note = (
                f"{seconds:g} s is longer than {adapter.name}'s {window:g} s input window: one "
                f"input holds {window:g} s (training chunks longer audio, or filters it), so "
                f"the step is timed and counted for {window:g} s per utterance"
            )
            seconds = float(window)
    else:
        batch = BatchShape(
            batch_size,
            max(1, round(seconds * 16000)),
            label_length or max(1, math.ceil(seconds * 15)),
        )
    from asrfit.memory.simulate import simulate_step  # imports torch

    # with the optimizer state offloaded the update runs on the host's copy (DeepSpeed's CPU
    # optimizer): its temporaries and kernels are not the GPU's, so the step is traced without
    # it, as the planner counts it (asrfit.plan.costs)
    step = simulate_step(
        adapter, batch, setup, target=target, optimizer_step=not setup.offload_optimizer
    )
    trainable = profile.trainable_params if profile is not None else 0
    breakdown, notes = shard_breakdown(step.breakdown_bytes, setup, trainable)
    hardware = _hardware(gpu)
    arch = (
        hardware.spec.architecture if hardware is not None and hardware.spec is not None else None
    )
    sharded_peak = step.peak_bytes + sum(breakdown.values()) - sum(step.breakdown_bytes.values())
    segments = step.segment_bytes(expandable_segments) + sharded_peak - step.peak_bytes
    cuda = predict_cuda(
        sharded_peak, segments, architecture=arch, expandable_segments=expandable_segments
    )
    notes = [*explain_peak(breakdown, step.peak_phase), *notes, *step.assumptions]
    if window_note is not None:
        notes.insert(0, window_note)
    usable = fits = None
    name = None
    if hardware is not None:
        usable = int(hardware.usable_bytes)
        fits = cuda.reserved_bytes <= usable
        name = hardware.spec.name if hardware.spec is not None else hardware.source
    step_s = per_second = None
    by_kind: dict[str, float] = {}
    if on_cpu:  # this CPU: its calibration when asrfit calibrate has run here
        found = find_calibration("cpu")
        rates = found[0].apply() if found is not None else host_rates()
    else:
        rates = device_rates(hardware) if hardware is not None else None
    if rates is not None and step.cost.rows:
        step_s = step_seconds(step.cost, rates)
        per_second = batch.batch_size * seconds / step_s
        by_kind = seconds_by_kind(step.cost, rates)
        notes.append(
            f"step time: per-op roofline on {rates.name} ({'; '.join(rates.sources)})"
            + unmodelled_step_time(setup)
        )
    return MemoryReport(
        model=adapter.name,
        setup=setup,
        batch=batch,
        audio_seconds=seconds,
        step=step,
        breakdown_bytes=breakdown,
        cuda=cuda,
        gpu=name,
        usable_bytes=usable,
        fits=fits,
        notes=notes,
        step_seconds=step_s,
        audio_seconds_per_second=per_second,
        step_seconds_by_kind=by_kind,
    )


def explain_peak(breakdown_bytes: dict[str, int], phase: str) -> list[str]:
    """Say why gradients are (nearly) absent at the peak, which otherwise looks like a bug.

    Args:
        breakdown_bytes: Bytes by category at the peak.
        phase: The phase the peak falls in ("forward", "backward", ...).

    Returns:
        Zero or one sentence.
    """
    gradients = breakdown_bytes.get("gradients", 0)
    parameters = breakdown_bytes.get("parameters", 0)
    if gradients > 0.05 * parameters:
        return []
    amount = "0" if gradients == 0 else "almost 0"
    if phase == "forward":
        return [
            f"gradients {amount} at the peak: it falls in the forward pass, and the gradients "
            "are freed after every optimizer step (zero_grad(set_to_none=True)) until backward "
            "makes them again; the activations kept for backward are what peaks"
        ]
    if phase == "backward":
        return [
            f"gradients {amount} at the peak: it falls at the start of backward, when every "
            "activation kept for backward is still alive and only the last layers' gradients "
            "exist yet; each later gradient replaces activations that are freed"
        ]
    return []


def _hardware(gpu: Any) -> Any:
    if gpu is None:
        return None
    if isinstance(gpu, str):
        from asrfit.profiles.hardware import HardwareProfile

        return HardwareProfile.resolve(gpu)
    return gpu
