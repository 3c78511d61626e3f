"""Build a model on the meta device and describe its shape (the facts a profile records).

See :mod:`asrfit.profiles.model` for the family facts these functions rely on.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

# torch and transformers are imported where a model is built (1.3 s and 0.7 s; a warm plan
# builds none)
if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

from asrfit.errors import ConfigError
from asrfit.profiles.registry import (
    family_of_config,
    load_config,
    model_class_for,
)

INPUT_KINDS = ("waveform", "log_mel")
SAMPLING_RATE_HZ = 16_000  # every supported family takes 16 kHz audio
MEL_FRAMES_PER_SECOND = 100.0  # Whisper and Parakeet features: 10 ms hop
FEATURE_ENCODER_FAMILIES = ("wav2vec2", "hubert", "wavlm")


def _product(values: Any) -> int:
    return math.prod(int(v) for v in values)


def describe(
    config: PretrainedConfig, family: str, model_class: type | None = None
) -> dict[str, Any]:
    """Shape and rate facts of a config, as :class:`ModelProfile` fields.

    Args:
        config: The model config.
        family: Its family (:func:`family_of`).
        model_class: The built class; for ``"custom"`` its ``main_input_name`` tells the input
            kind (``input_values``: waveform, ``input_features``: log-mel).

    Returns:
        A dict with hidden_size, num_layers, decoder_layers, num_heads,
        encoder_frames_per_second, input_kind, sampling_rate, input_frames_per_second,
        max_input_seconds, vocab_size and num_mel_bins (None where unknown).
    """
    out: dict[str, Any] = {"vocab_size": getattr(config, "vocab_size", None)}
    if family in FEATURE_ENCODER_FAMILIES:
        samples_per_frame = _product(config.conv_stride)
        if getattr(config, "add_adapter", False):
            samples_per_frame *= config.adapter_stride**config.num_adapter_layers
        out.update(
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            encoder_frames_per_second=SAMPLING_RATE_HZ / samples_per_frame,
            input_kind="waveform",
            sampling_rate=SAMPLING_RATE_HZ,
            input_frames_per_second=float(SAMPLING_RATE_HZ),
        )
    elif family == "whisper":
        # conv1 (stride 1) then conv2 (stride 2): 100 mel frames/s -> 50 encoder frames/s; the
        # encoder's positions cover max_source_positions frames, i.e. a fixed 30 s window.
        encoder_fps = MEL_FRAMES_PER_SECOND / 2
        out.update(
            hidden_size=config.d_model,
            num_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            num_heads=config.encoder_attention_heads,
            encoder_frames_per_second=encoder_fps,
            input_kind="log_mel",
            sampling_rate=SAMPLING_RATE_HZ,
            input_frames_per_second=MEL_FRAMES_PER_SECOND,
            max_input_seconds=config.max_source_positions / encoder_fps,
            num_mel_bins=config.num_mel_bins,
        )
    elif family == "asrfit_conformer":
        out.update(
            hidden_size=config.d_model,
            num_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers or None,
            num_heads=config.encoder_attention_heads,
            encoder_frames_per_second=MEL_FRAMES_PER_SECOND / config.subsampling_factor,
            input_kind="log_mel",
            sampling_rate=SAMPLING_RATE_HZ,
            input_frames_per_second=MEL_FRAMES_PER_SECOND,
            num_mel_bins=config.num_mel_bins,
        )
    elif family in ("parakeet_ctc", "parakeet_tdt"):
        encoder = config.encoder_config
        out.update(
            hidden_size=encoder.hidden_size,
            num_layers=encoder.num_hidden_layers,
            decoder_layers=getattr(config, "num_decoder_layers", None),
            num_heads=encoder.num_attention_heads,
            encoder_frames_per_second=MEL_FRAMES_PER_SECOND / encoder.subsampling_factor,
            input_kind="log_mel",
            sampling_rate=SAMPLING_RATE_HZ,
            input_frames_per_second=MEL_FRAMES_PER_SECOND,
            num_mel_bins=encoder.num_mel_bins,
        )
    else:
        out.update(
            hidden_size=getattr(config, "hidden_size", None) or getattr(config, "d_model", None),
            num_layers=getattr(config, "num_hidden_layers", None),
            num_heads=getattr(config, "num_attention_heads", None),
        )
        main_input = getattr(model_class, "main_input_name", None)
        out["input_kind"] = {"input_values": "waveform", "input_features": "log_mel"}.get(
            main_input
        )
        if out["input_kind"] is not None:
            rate, sampling_rate = input_steps_per_second(config, out["input_kind"])
            out.update(input_frames_per_second=rate, sampling_rate=sampling_rate)
    return out


# transformers' auto table names the waveform extractor for wav2vec2-bert, whose published
# checkpoints (facebook/w2v-bert-2.0) ship SeamlessM4T's stacked filterbank extractor.
_FEATURE_EXTRACTOR_OF = {"wav2vec2-bert": "SeamlessM4TFeatureExtractor"}
# Filterbank extractors without a hop_length attribute (Speech2Text, SeamlessM4T) hard-code
# Kaldi's 10 ms frame shift (hop_length=160 at 16 kHz in their code).
FBANK_HOP_SECONDS = 0.010


def _feature_extractor_facts(config: PretrainedConfig) -> dict[str, Any]:
    """sampling_rate, hop_length and stride of the model's feature extractor, where known.

    A local model folder's ``preprocessor_config.json`` wins; otherwise the defaults of the
    extractor class that transformers' auto table (or :data:`_FEATURE_EXTRACTOR_OF`) names
    for the config's ``model_type``.
    """
    import json
    from pathlib import Path

    facts: dict[str, Any] = {}
    model_type = getattr(config, "model_type", None)
    name = _FEATURE_EXTRACTOR_OF.get(model_type)
    if name is None:
        try:
            from transformers.models.auto.feature_extraction_auto import (
                FEATURE_EXTRACTOR_MAPPING_NAMES,
            )

            name = FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)
        except ImportError:  # an older transformers without the table
            name = None
    if name is not None:
        import transformers

        extractor_class = getattr(transformers, name, None)
        if extractor_class is not None:
            defaults = inspect_defaults(extractor_class.__init__)
            facts.update(
                {k: defaults[k] for k in ("sampling_rate", "hop_length", "stride") if k in defaults}
            )
    folder = Path(str(getattr(config, "_name_or_path", "") or ""))
    local = folder / "preprocessor_config.json"
    if str(folder) and local.is_file():
        try:
            saved = json.loads(local.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        facts.update({k: saved[k] for k in ("sampling_rate", "hop_length", "stride") if k in saved})
    return facts


def inspect_defaults(function: Any) -> dict[str, Any]:
    """The default values of a function's keyword parameters."""
    import inspect

    return {
        name: p.default
        for name, p in inspect.signature(function).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def input_steps_per_second(config: PretrainedConfig, input_kind: str) -> tuple[float, int]:
    """Model-input steps per audio second (samples, or feature frames) and the sampling rate.

    Raw audio: the extractor's sampling rate. Feature frames: sampling rate / hop length /
    stride (frames the extractor stacks into one, as SeamlessM4T's does for wav2vec2-bert),
    with a 10 ms hop for filterbank extractors that have no ``hop_length``.

    Args:
        config: The model config.
        input_kind: ``"waveform"`` or ``"log_mel"``.

    Returns:
        ``(steps per second, sampling rate in Hz)``.
    """
    facts = _feature_extractor_facts(config)
    sampling_rate = int(facts.get("sampling_rate") or SAMPLING_RATE_HZ)
    if input_kind == "waveform":
        return float(sampling_rate), sampling_rate
    hop = facts.get("hop_length") or round(sampling_rate * FBANK_HOP_SECONDS)
    stride = int(facts.get("stride") or 1)
    return sampling_rate / hop / stride, sampling_rate


def build_model(
    spec_or_config: Any,
    *,
    device: str | torch.device | None = "meta",
    freeze_feature_encoder: bool = True,
    dtype: torch.dtype | str | None = "float32",
    attn_implementation: str | None = None,
) -> nn.Module:
    """Construct a model from its config with random init and no pretrained weights.

    Args:
        spec_or_config: Anything :func:`load_config` accepts: a bundled name or Hub id, a local
            folder with ``config.json``, a ``PretrainedConfig``, a config dict or a
            :class:`ModelProfile`.
        device: Device to construct on (Default: ``"meta"``, no memory is allocated). ``None``
            constructs under whatever device or mode context the caller has active, for example
            ``FakeTensorMode``.
        freeze_feature_encoder: Freeze the conv feature encoder of wav2vec2 / HuBERT / WavLM
            (Default: True). Ignored for other families.
        dtype: Parameter dtype, a ``torch.dtype`` or its name (Default: ``"float32"``).
            ``None`` keeps the config's dtype, or torch's default when the config has none.
        attn_implementation: ``"eager"``, ``"sdpa"``, ... (Default: None, transformers' choice).

    Returns:
        The model, an ``nn.Module`` of the class :func:`model_class_for` picks.

    Raises:
        UnknownModelError: When a name cannot be resolved to a config.
        UnsupportedModelError: When the config's architecture cannot be built.
        ConfigError: When ``dtype`` is a string that names no torch dtype.
    """
    import torch

    config = load_config(spec_or_config)
    cls = model_class_for(config)
    kwargs: dict[str, Any] = {}
    if isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype):
            raise ConfigError(
                f"dtype={dtype!r}: not a torch dtype name; use e.g. 'float32' or 'bfloat16'."
            )
        dtype = named
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    context = torch.device(device) if device is not None else contextlib.nullcontext()
    with context:
        model = cls._from_config(config, **kwargs)
    if device is not None:
        # A few modules use the legacy ``torch.Tensor(n)`` constructor (wav2vec2's
        # ``masked_spec_embed``), which ignores the device context and lands on the CPU.
        model.to(device)
    if freeze_feature_encoder and family_of_config(config) in FEATURE_ENCODER_FAMILIES:
        model.freeze_feature_encoder()
    return model


def feature_encoder_is_frozen(model: nn.Module, family: str) -> bool:
    if family not in FEATURE_ENCODER_FAMILIES:
        return False
    from torch import nn

    base = getattr(model, "base_model", model)
    encoder = getattr(base, "feature_extractor", None)
    params = list(encoder.parameters()) if isinstance(encoder, nn.Module) else []
    return bool(params) and not any(p.requires_grad for p in params)


def format_count(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def format_bytes(n: int) -> str:
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
