"""``ModelProfile``: what a model is, measured on the meta device without allocating weights.

The model is built from its config under ``torch.device("meta")`` (or under whatever mode the
caller has active, such as ``FakeTensorMode``) so that a 2B-parameter XLS-R profiles in about a
second on a laptop. Parameter counts come from ``model.parameters()``, which yields each shared
or tied parameter once.

Family facts used below (all models take 16 kHz audio):

- wav2vec2 / HuBERT / WavLM read the waveform; their conv feature encoder strides by
  ``product(conv_stride)`` = 320 samples, so the encoder runs at 16000 / 320 = 50 frames/s. The
  feature encoder is frozen for fine-tuning by default (``model.freeze_feature_encoder()``).
- Whisper reads 100 log-mel frames/s (10 ms hop); its second conv has stride 2, so the encoder
  runs at 50 frames/s. Whisper always pads its input to 30 s (``2 * max_source_positions`` mel
  frames), so every utterance costs 1500 encoder frames.
- Parakeet (FastConformer) reads 100 log-mel frames/s and subsamples by ``subsampling_factor``
  (8), so the encoder runs at 12.5 frames/s.
- asrfit's Conformer-CTC (``asrfit_conformer``) reads 100 log-mel frames/s and subsamples by
  ``subsampling_factor`` (4 or 8): 25 or 12.5 encoder frames/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and transformers are imported where needed (a warm plan needs neither)
    import torch
    from torch import nn
    from transformers import PretrainedConfig

from asrfit.errors import ConfigError, UnsupportedModelError
from asrfit.profiles import registry
from asrfit.profiles.model_build import (
    FEATURE_ENCODER_FAMILIES,
    INPUT_KINDS,
    build_model,
    describe,
    feature_encoder_is_frozen,
    format_bytes,
    format_count,
)
from asrfit.profiles.registry import (
    FAMILIES,
    family_of_config,
    list_bundled_models,
    load_config,
    model_class_for,
)
from asrfit.utils.serialization import JsonDataclass


def _is_config(value: Any) -> bool:
    """Whether ``value`` is a transformers ``PretrainedConfig`` (without importing transformers)."""
    import sys

    module = sys.modules.get("transformers")
    return module is not None and isinstance(value, module.PretrainedConfig)


def _is_module(value: Any) -> bool:
    """Whether ``value`` is an ``nn.Module`` (without importing torch: none exists before)."""
    import sys

    module = sys.modules.get("torch")
    return module is not None and isinstance(value, module.nn.Module)


def family_of(model_or_config: Any) -> str:
    """Return the asrfit family of a model, config, config dict or profile.

    Args:
        model_or_config: An ``nn.Module`` (a transformers model is recognised by its config),
            a ``PretrainedConfig``, a config dict with ``model_type``, or a ``ModelProfile``.

    Returns:
        One of :data:`FAMILIES`; ``"custom"`` for anything asrfit does not know.
    """
    if isinstance(model_or_config, ModelProfile):
        return model_or_config.family
    if _is_module(model_or_config):
        config = getattr(model_or_config, "config", None)
        return family_of_config(config) if _is_config(config) else "custom"
    if _is_config(model_or_config) or isinstance(model_or_config, dict):
        return family_of_config(model_or_config)
    return "custom"


@dataclass
class ModelProfile(JsonDataclass):
    """What a model is: parameter counts, shape and input rates, and the config to rebuild it.

    Attributes:
        name: Short name (bundled name, folder name or class name).
        family: ``"wav2vec2"``, ``"hubert"``, ``"wavlm"``, ``"whisper"``, ``"parakeet_ctc"``,
            ``"parakeet_tdt"``, ``"asrfit_conformer"`` or ``"custom"``.
        model_class: The class that is built and trained (``"Wav2Vec2ForCTC"``).
        total_params: Parameters, each shared or tied one counted once.
        trainable_params: Parameters with ``requires_grad`` (after freezing).
        frozen_params: ``total_params - trainable_params``.
        param_bytes_fp32: ``4 * total_params``.
        feature_encoder_frozen: Whether the conv feature encoder (wav2vec2 family) is frozen.
        hidden_size: Encoder model dimension.
        num_layers: Encoder layers.
        decoder_layers: Whisper decoder layers, Parakeet-TDT prediction-network LSTM layers or
            the Conformer-CTC attention decoder's layers (None when there is none).
        num_heads: Encoder attention heads.
        encoder_frames_per_second: Encoder output frames per second of audio.
        input_kind: ``"waveform"`` or ``"log_mel"``.
        sampling_rate: Audio samples per second the model expects.
        input_frames_per_second: Samples/s for waveform models, feature frames/s for log-mel.
        max_input_seconds: Whisper's fixed 30 s window; None when input length is free.
        vocab_size: Output vocabulary (CTC: including blank).
        num_mel_bins: Log-mel features per frame (log-mel models only).
        hub_id: Hugging Face Hub id when known.
        source: Where the config came from: ``"bundled"``, ``"local"``, ``"hub"``, ``"config"``
            or ``"module"``.
        config: The config dict (``PretrainedConfig.to_diff_dict()``) the model is rebuilt from;
            empty for a plain ``nn.Module``.
    """

    name: str
    family: str
    model_class: str
    total_params: int
    trainable_params: int
    frozen_params: int
    param_bytes_fp32: int
    feature_encoder_frozen: bool = False
    hidden_size: int | None = None
    num_layers: int | None = None
    decoder_layers: int | None = None
    num_heads: int | None = None
    encoder_frames_per_second: float | None = None
    input_kind: str | None = None
    sampling_rate: int | None = None
    input_frames_per_second: float | None = None
    max_input_seconds: float | None = None
    vocab_size: int | None = None
    num_mel_bins: int | None = None
    hub_id: str | None = None
    source: str = "config"
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"ModelProfile.family: {self.family!r} is not one of {FAMILIES}.")
        if self.input_kind is not None and self.input_kind not in INPUT_KINDS:
            raise ConfigError(
                f"ModelProfile.input_kind: {self.input_kind!r} is not one of {INPUT_KINDS} or null."
            )
        for key in ("total_params", "trainable_params", "frozen_params", "param_bytes_fp32"):
            if getattr(self, key) < 0:
                raise ConfigError(f"ModelProfile.{key}: {getattr(self, key)} must not be negative.")
        if self.trainable_params + self.frozen_params != self.total_params:
            raise ConfigError(
                f"ModelProfile: trainable_params ({self.trainable_params}) + frozen_params "
                f"({self.frozen_params}) must equal total_params ({self.total_params})."
            )

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        freeze_feature_encoder: bool = True,
        *,
        local_files_only: bool | None = None,
    ) -> ModelProfile:
        """Profile a bundled model, a local model folder, or a Hub model whose config is reachable.

        Bundled names and Hub ids (see :func:`list_bundled_models`) need no network. A folder
        with ``config.json`` is read with ``AutoConfig``. Any other id goes to
        ``AutoConfig.from_pretrained``, which reads the Hub cache, or the Hub itself when online
        (only ``config.json``; weights are never downloaded).

        Args:
            name_or_path: ``"xls-r-1b"``, ``"openai/whisper-small"``, ``"./my-model"``, ...
            freeze_feature_encoder: Freeze the wav2vec2-family conv feature encoder (Default: True).
            local_files_only: Never touch the network (Default: None, meaning True when
                ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set).

        Returns:
            The profile.

        Raises:
            UnknownModelError: When the name is neither bundled, a local folder, nor reachable;
                the message lists the bundled names.
        """
        resolved = registry.resolve(name_or_path, local_files_only=local_files_only)
        return cls._from_resolved(resolved, freeze_feature_encoder)

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig | dict[str, Any],
        name: str | None = None,
        freeze_feature_encoder: bool = True,
    ) -> ModelProfile:
        """Profile a model given its transformers config (or config dict), built on meta.

        Args:
            config: A ``PretrainedConfig`` or a dict with ``model_type``.
            name: Name to record (Default: the config's ``_name_or_path`` or its model type).
            freeze_feature_encoder: Freeze the wav2vec2-family conv feature encoder (Default: True).

        Returns:
            The profile.
        """
        resolved = registry.resolve(config)
        resolved = resolved._replace(name=name) if name is not None else resolved
        return cls._from_resolved(resolved, freeze_feature_encoder)

    @classmethod
    def from_module(cls, module: nn.Module, name: str | None = None) -> ModelProfile:
        """Profile an already-built module as it is (its current ``requires_grad`` flags).

        Args:
            module: Any ``nn.Module``; a transformers model also yields its family and shape.
            name: Name to record (Default: the config's name or the class name).

        Returns:
            The profile; ``family`` is ``"custom"`` for modules asrfit does not know.
        """
        config = getattr(module, "config", None)
        config = config if _is_config(config) else None
        name = name or getattr(config, "_name_or_path", "") or type(module).__name__
        return cls._measure(module, config, name, family_of(module), None, "module")

    @classmethod
    def from_spec(
        cls,
        spec: str | nn.Module | PretrainedConfig | dict[str, Any] | ModelProfile,
        freeze_feature_encoder: bool = True,
    ) -> ModelProfile:
        """Profile whatever the caller has: a name or path, a module, a config, or a profile.

        Args:
            spec: A name or path (:meth:`from_pretrained`), an ``nn.Module``
                (:meth:`from_module`), a ``PretrainedConfig`` or config dict
                (:meth:`from_config`), or a ``ModelProfile`` (returned unchanged).
            freeze_feature_encoder: Passed on, except for modules, which are taken as they are.

        Returns:
            The profile.

        Raises:
            UnsupportedModelError: When ``spec`` is none of these types.
        """
        if isinstance(spec, ModelProfile):
            return spec
        if isinstance(spec, str):
            return cls.from_pretrained(spec, freeze_feature_encoder)
        if _is_module(spec):
            return cls.from_module(spec)
        if _is_config(spec) or isinstance(spec, dict):
            return cls.from_config(spec, freeze_feature_encoder=freeze_feature_encoder)
        raise UnsupportedModelError(
            f"cannot profile a {type(spec).__name__}; pass a model name or path, an nn.Module, "
            "a transformers PretrainedConfig or a config dict."
        )

    @classmethod
    def _from_resolved(
        cls, resolved: registry.Resolved, freeze_feature_encoder: bool
    ) -> ModelProfile:
        model = build_model(resolved.config, freeze_feature_encoder=freeze_feature_encoder)
        family = family_of_config(resolved.config)
        return cls._measure(
            model, resolved.config, resolved.name, family, resolved.hub_id, resolved.source
        )

    @classmethod
    def _measure(
        cls,
        module: nn.Module,
        config: PretrainedConfig | None,
        name: str,
        family: str,
        hub_id: str | None,
        source: str,
    ) -> ModelProfile:
        total = trainable = 0
        for param in module.parameters():  # yields each shared or tied parameter once
            total += param.numel()
            if param.requires_grad:
                trainable += param.numel()
        shape = describe(config, family, type(module)) if config is not None else {}
        if hub_id is None and config is not None:
            bundled = registry.find_bundled(name)
            hub_id = bundled.hub_id if bundled is not None else None
        return cls(
            name=name,
            family=family,
            model_class=type(module).__name__,
            total_params=total,
            trainable_params=trainable,
            frozen_params=total - trainable,
            param_bytes_fp32=4 * total,
            feature_encoder_frozen=feature_encoder_is_frozen(module, family),
            hub_id=hub_id,
            source=source,
            config=registry.config_to_dict(config) if config is not None else {},
            **shape,
        )

    # ------------------------------------------------------------------ use

    def build_model(
        self,
        device: str | torch.device | None = "meta",
        dtype: torch.dtype | str | None = "float32",
    ) -> nn.Module:
        """Rebuild the profiled model (random init, no weights), freezing as it was profiled.

        Args:
            device: As in :func:`build_model` (Default: ``"meta"``).
            dtype: As in :func:`build_model` (Default: ``"float32"``).

        Returns:
            The model.

        Raises:
            UnsupportedModelError: When the profile was made from a plain module (no config).
        """
        if not self.config:
            raise UnsupportedModelError(
                f"profile {self.name!r} has no config (it was made from a plain nn.Module); "
                "keep and pass the module itself instead."
            )
        return build_model(
            self.config,
            device=device,
            freeze_feature_encoder=self.feature_encoder_frozen,
            dtype=dtype,
        )

    def summary_rows(self) -> list[tuple[str, str]]:
        """Return (label, value) rows for the CLI's table.

        Returns:
            Human-readable rows: name, family, counts, bytes, shape and rates.
        """
        frozen = format_count(self.frozen_params)
        if self.feature_encoder_frozen:
            frozen += " (incl. feature encoder)"
        rows = [
            ("Model", self.name),
            ("Hub id", self.hub_id or "-"),
            ("Family", self.family),
            ("Class", self.model_class),
            ("Parameters", f"{format_count(self.total_params)} ({self.total_params:,})"),
            ("Trainable parameters", format_count(self.trainable_params)),
            ("Frozen parameters", frozen),
            ("Weights (fp32)", format_bytes(self.param_bytes_fp32)),
        ]
        optional = [
            ("Hidden size", self.hidden_size),
            ("Encoder layers", self.num_layers),
            ("Decoder layers", self.decoder_layers),
            ("Attention heads", self.num_heads),
            ("Vocabulary", self.vocab_size),
        ]
        rows += [(label, str(value)) for label, value in optional if value is not None]
        if self.input_kind == "waveform" and self.sampling_rate is not None:
            rows.append(("Input", f"waveform, {self.sampling_rate} samples/s"))
        elif self.input_kind == "log_mel" and self.input_frames_per_second is not None:
            bins = f"{self.num_mel_bins} mel bins, " if self.num_mel_bins else ""
            rows.append(("Input", f"log-mel, {bins}{self.input_frames_per_second:g} frames/s"))
        if self.encoder_frames_per_second is not None:
            rows.append(("Encoder frame rate", f"{self.encoder_frames_per_second:g} frames/s"))
        if self.max_input_seconds is not None:
            rows.append(
                ("Max input", f"{self.max_input_seconds:g} s (shorter input is padded to it)")
            )
        if self.family in FEATURE_ENCODER_FAMILIES:
            rows.append(
                ("Feature encoder", "frozen" if self.feature_encoder_frozen else "trainable")
            )
        rows.append(("Config source", self.source))
        return rows

    def encoder_frames(self, duration_seconds: float) -> int | None:
        """Encoder frames for an utterance of ``duration_seconds`` (Whisper: always its window).

        Args:
            duration_seconds: Audio duration.

        Returns:
            The frame count (rounded up), or None when the frame rate is unknown.
        """
        if self.encoder_frames_per_second is None:
            return None
        if self.max_input_seconds is not None:
            duration_seconds = self.max_input_seconds
        return math.ceil(duration_seconds * self.encoder_frames_per_second)


__all__ = [
    "FAMILIES",
    "INPUT_KINDS",
    "ModelProfile",
    "build_model",
    "describe",
    "family_of",
    "list_bundled_models",
    "load_config",
    "model_class_for",
]
