"""A step adapter for any transformers CTC or speech-to-text model, without a per-family adapter.

The model class comes from transformers' own auto tables (``AutoModelForCTC``,
``AutoModelForSpeechSeq2Seq``) for the config's ``model_type``. The batch comes from the
class and its config:

- the input is the class's ``main_input_name``: ``input_values`` is raw audio ``(B, N)``
  (``BatchShape.input_length`` samples); ``input_features`` is ``(B, T, F)`` feature frames,
  with ``F`` from the config (``feature_projection_input_dim`` for wav2vec2-bert,
  ``input_feat_per_channel x input_channels`` for speech_to_text, else ``num_mel_bins``,
  looked up in a nested ``encoder_config`` when the top level has none, as for LASR),
  or ``(B, F, T)`` for encoders with ``max_source_positions`` and ``num_mel_bins`` and
  neither of the other two (the Whisper layout);
- a padded attention mask is passed when the forward takes one (for raw audio only with a
  layer-normed feature extractor, as wav2vec2-style feature extractors return it);
- labels are ``BatchShape.label_length`` token ids in ``[1, vocab_size - 1)``; sequence-to-
  sequence models build their decoder inputs from the labels themselves (teacher forcing);
- CTC models with a convolutional feature encoder (``conv_kernel``/``conv_stride``) get the
  CTC length check.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from asrfit.errors import UnsupportedModelError
from asrfit.memory.models.adapters import _check_ctc, _labels, _loss_attr, _mask
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.trace.tracker import StorageTracker


def auto_class(config: Any) -> tuple[type, str]:
    """The transformers class for ``config`` and its kind ("ctc" or "seq2seq").

    Raises:
        UnsupportedModelError: When neither auto table knows the model type.
    """
    import transformers
    from transformers.models.auto import modeling_auto

    from asrfit.memory.models.adapters import _CLASS_FAMILY

    model_type = getattr(config, "model_type", "")
    for kind, table in (
        ("ctc", modeling_auto.MODEL_FOR_CTC_MAPPING_NAMES),
        ("seq2seq", modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES),
    ):
        name = table.get(model_type)
        if name and hasattr(transformers, name):
            return getattr(transformers, name), kind
    raise UnsupportedModelError(
        f"model type {model_type!r} has no CTC or speech-to-text class in transformers "
        f"{transformers.__version__} (AutoModelForCTC, AutoModelForSpeechSeq2Seq), so asrfit "
        "cannot build a training step for it. Supported: any class of those two tables, and "
        f"asrfit's own adapters for {', '.join(_CLASS_FAMILY)}. For any other nn.Module, "
        "describe the step yourself with asrfit.memory.simulate_model(build, make_batch, loss_fn)."
    )


def _feature_dim(config: Any) -> int:
    for names in (("feature_projection_input_dim",), ("input_feat_per_channel", "input_channels")):
        values = [getattr(config, n, None) for n in names]
        if all(isinstance(v, int) for v in values):
            out = 1
            for v in values:
                out *= v
            return out
    mel = getattr(config, "num_mel_bins", None)
    if isinstance(mel, int):
        return mel
    encoder = getattr(config, "encoder_config", None)  # a nested encoder config (LASR)
    if encoder is not None and encoder is not config:
        return _feature_dim(encoder)
    raise UnsupportedModelError(
        f"{type(config).__name__}: cannot tell the feature size of 'input_features' (no "
        "feature_projection_input_dim, input_feat_per_channel or num_mel_bins); use "
        "asrfit.memory.simulate_model with your own batch."
    )


def generic_adapter(
    config: Any, *, freeze_feature_encoder: bool = True, name: str | None = None
) -> StepAdapter:
    """Build the step adapter of any ``AutoModelForCTC`` / ``AutoModelForSpeechSeq2Seq`` config.

    Raises:
        UnsupportedModelError: When transformers has no such class for the config.
    """
    cls, kind = auto_class(config)
    label = name or getattr(config, "name_or_path", None) or cls.__name__
    if getattr(cls, "_supports_sdpa", False) and getattr(config, "_attn_implementation", None) in (
        None,
        "eager",
    ):
        config._attn_implementation = "sdpa"
    main_input = getattr(cls, "main_input_name", "input_values")
    takes_mask = "attention_mask" in inspect.signature(cls.forward).parameters
    channels_first = (
        hasattr(config, "max_source_positions")
        and hasattr(config, "num_mel_bins")
        and not hasattr(config, "input_feat_per_channel")
        and not hasattr(config, "feature_projection_input_dim")
    )
    raw_mask = getattr(config, "feat_extract_norm", "layer") == "layer"
    kernels = getattr(config, "conv_kernel", None)
    strides = getattr(config, "conv_stride", None)

    def frames(n: int) -> int:
        for k, s in zip(kernels, strides, strict=True):
            n = (n - k) // s + 1
        return max(n, 0)

    output_frames = frames if kind == "ctc" and kernels and strides else None

    def build() -> nn.Module:
        model = cls(config)
        if freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
            model.freeze_feature_encoder()
        return model

    def make_inputs(shape: BatchShape, tr: StorageTracker) -> dict[str, Any]:
        if output_frames is not None:
            _check_ctc(shape, output_frames(shape.input_length), label)
        b, n = shape.batch_size, shape.input_length
        if main_input == "input_values":
            kw: dict[str, Any] = {"input_values": torch.randn(b, n)}
            with_mask = takes_mask and raw_mask
        else:
            f = _feature_dim(config)
            kw = {
                "input_features": torch.randn(b, f, n) if channels_first else torch.randn(b, n, f)
            }
            with_mask = takes_mask and not channels_first
        if with_mask:
            kw["attention_mask"] = _mask(tr, b, n)
        kw["labels"] = _labels(tr, shape, config.vocab_size)
        return kw

    return StepAdapter(
        label, build, make_inputs, _loss_attr, output_frames=output_frames, config=config
    )


def speech_adapter(
    config: Any, *, freeze_feature_encoder: bool = True, name: str | None = None
) -> StepAdapter:
    """The step adapter of any speech config: asrfit's own adapter where one exists, else generic.

    Raises:
        UnsupportedModelError: When transformers has no CTC or speech-to-text class for it;
            the message says why and what to do.
    """
    from asrfit.memory.models.adapters import hf_adapter

    try:
        return hf_adapter(config, freeze_feature_encoder=freeze_feature_encoder, name=name)
    except UnsupportedModelError:
        return generic_adapter(config, freeze_feature_encoder=freeze_feature_encoder, name=name)
