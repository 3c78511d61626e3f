"""One training-step interface for every supported model: build, make a batch, compute the loss.

The simulator drives a :class:`StepAdapter`; each family differs only in its inputs and in
how labels reach the loss. Adapters build inputs as *fake* tensors (shapes) and declare
the real values of the integer ones (masks, labels) to the tracker, so that length-dependent
code (CTC, ``attention_mask.sum()``) sees true values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from asrfit.errors import ShapeError, UnsupportedModelError
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.trace.tracker import StorageTracker
from asrfit.memory.trace.values import fake_with_value

_CLASS_FAMILY = {
    "Wav2Vec2ForCTC": "wav2vec2",
    "HubertForCTC": "hubert",
    "WavLMForCTC": "wavlm",
    "WhisperForConditionalGeneration": "whisper",
    "ParakeetForCTC": "parakeet_ctc",
    "ParakeetForTDT": "parakeet_tdt",
    "ConformerForCTC": "asrfit_conformer",
}


def _labels(
    tracker: StorageTracker, shape: BatchShape, vocab_size: int, low: int = 1
) -> torch.Tensor:
    with unset_fake_temporarily():
        gen = torch.Generator().manual_seed(0)
        real = torch.randint(
            low, max(low + 1, vocab_size - 1), (shape.batch_size, shape.label_length), generator=gen
        )
    return fake_with_value(tracker, real)


def padded_attention_mask(batch: int, length: int) -> torch.Tensor:
    """The attention mask of a padded batch: the last utterance is 2% shorter than ``length``.

    Batches from a length-bucketed sampler mix lengths, so their padding masks are not all
    ones and models build their attention masks (a ``[B, 1, T, T]`` SDPA mask in
    transformers). A batch of one has no padding in a real step; it is simulated padded too,
    pessimistically, so that peak memory grows smoothly with the batch size (the cost model
    fits one formula to all batch sizes).
    """
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - max(1, length // 50) :] = 0
    return mask


def _mask(tracker: StorageTracker, batch: int, length: int) -> torch.Tensor:
    with unset_fake_temporarily():
        real = padded_attention_mask(batch, length)
    return fake_with_value(tracker, real)


def _loss_attr(module: nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
    return module(**kwargs).loss


def _check_ctc(shape: BatchShape, frames: int, name: str) -> None:
    if shape.label_length > frames:
        raise ShapeError(
            f"{name}: {shape.label_length} labels cannot align to {frames} encoder frames "
            f"(input_length={shape.input_length}); CTC needs at least one frame per label. "
            "Use longer audio per label, a shorter label length, or filter such utterances."
        )


def hf_adapter(
    config: Any, *, freeze_feature_encoder: bool = True, name: str | None = None
) -> StepAdapter:
    """Build the adapter for an ASR config (wav2vec2, HuBERT, WavLM, Whisper, Parakeet, Conformer).

    asrfit's Conformer-CTC (``asrfit_conformer``) takes ``input_features`` (B, T, mel), a padded
    attention mask and labels; with an attention decoder, the labels feed it too (the model
    builds the teacher-forced decoder inputs itself).

    Raises:
        UnsupportedModelError: When the config's model class is not supported.
    """
    import transformers

    archs = list(getattr(config, "architectures", None) or [])
    model_type = getattr(config, "model_type", "")
    guess = {
        "wav2vec2": "Wav2Vec2ForCTC",
        "hubert": "HubertForCTC",
        "wavlm": "WavLMForCTC",
        "whisper": "WhisperForConditionalGeneration",
        "parakeet_ctc": "ParakeetForCTC",
        "parakeet_tdt": "ParakeetForTDT",
        "asrfit_conformer": "ConformerForCTC",
    }.get(model_type)
    cls_name = next((a for a in archs if a in _CLASS_FAMILY), guess)
    if cls_name is None or cls_name not in _CLASS_FAMILY:
        raise UnsupportedModelError(
            f"model type {model_type!r} (architectures {archs}) has no asrfit adapter; "
            f"adapters exist for {', '.join(_CLASS_FAMILY)}. Any other AutoModelForCTC / "
            "AutoModelForSpeechSeq2Seq class goes through asrfit.memory.models.generic.speech_adapter."
        )
    family = _CLASS_FAMILY[cls_name]
    label = name or getattr(config, "name_or_path", None) or cls_name

    def build() -> nn.Module:
        # The class is looked up here, at the first build: importing a transformers
        # modelling module costs 1-2 s, which a plan whose traces are cached never needs.
        if family == "asrfit_conformer":
            from asrfit.models import conformer

            cls = conformer.ConformerForCTC
        else:
            cls = getattr(transformers, cls_name)
        if getattr(cls, "_supports_sdpa", False) and getattr(
            config, "_attn_implementation", None
        ) in (None, "eager"):
            # Training loads models with SDPA attention by default; so does the simulation.
            config._attn_implementation = "sdpa"
        model = cls(config)
        if freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
            model.freeze_feature_encoder()
        return model

    if family in ("wav2vec2", "hubert", "wavlm"):
        strides = list(config.conv_stride)
        kernels = list(config.conv_kernel)

        def frames(n: int) -> int:
            for k, s in zip(kernels, strides, strict=True):
                n = (n - k) // s + 1
            return max(n, 0)

        use_mask = getattr(config, "feat_extract_norm", "layer") == "layer"

        def make_inputs(shape: BatchShape, tr: StorageTracker) -> dict[str, Any]:
            _check_ctc(shape, frames(shape.input_length), label)
            kw: dict[str, Any] = {"input_values": torch.randn(shape.batch_size, shape.input_length)}
            if use_mask:
                kw["attention_mask"] = _mask(tr, shape.batch_size, shape.input_length)
            kw["labels"] = _labels(tr, shape, config.vocab_size)
            return kw

        return StepAdapter(
            label, build, make_inputs, _loss_attr, output_frames=frames, config=config
        )

    if family == "whisper":
        mel_frames = 2 * config.max_source_positions  # Whisper always pads input to 30 s

        def make_inputs(shape: BatchShape, tr: StorageTracker) -> dict[str, Any]:
            if shape.label_length > config.max_target_positions:
                raise ShapeError(
                    f"{label}: label_length {shape.label_length} exceeds the decoder's "
                    f"max_target_positions {config.max_target_positions}; truncate or split transcripts."
                )
            feats = torch.randn(shape.batch_size, config.num_mel_bins, mel_frames)
            return {"input_features": feats, "labels": _labels(tr, shape, config.vocab_size)}

        return StepAdapter(label, build, make_inputs, _loss_attr, output_frames=None, config=config)

    if family == "asrfit_conformer":
        return _conformer_adapter(config, label, build)

    enc = config.encoder_config
    factor = int(getattr(enc, "subsampling_factor", 8))

    def parakeet_frames(n: int) -> int:
        return -(-n // factor)

    def make_inputs(shape: BatchShape, tr: StorageTracker) -> dict[str, Any]:
        if family != "parakeet_tdt":  # TDT/RNN-T may emit several labels per frame
            _check_ctc(shape, parakeet_frames(shape.input_length), label)
        kw: dict[str, Any] = {
            "input_features": torch.randn(shape.batch_size, shape.input_length, enc.num_mel_bins),
            "attention_mask": _mask(tr, shape.batch_size, shape.input_length),
            "labels": _labels(tr, shape, config.vocab_size),
        }
        if family == "parakeet_tdt":
            # Training feeds the prediction network the labels behind a start (blank) symbol.
            with unset_fake_temporarily():
                real_labels = tr.value_of(kw["labels"])
                start = torch.full((shape.batch_size, 1), config.blank_token_id, dtype=torch.long)
                real = torch.cat([start, real_labels], dim=1)
            kw["decoder_input_ids"] = fake_with_value(tr, real)
        return kw

    return StepAdapter(
        label, build, make_inputs, _loss_attr, output_frames=parakeet_frames, config=config
    )


def _conformer_adapter(config: Any, label: str, build: Callable[[], nn.Module]) -> StepAdapter:
    frames = config.output_frames
    decoder_positions = config.max_target_positions if config.decoder_layers else None

    def make_inputs(shape: BatchShape, tr: StorageTracker) -> dict[str, Any]:
        _check_ctc(shape, frames(shape.input_length), label)
        if decoder_positions is not None and shape.label_length + 1 > decoder_positions:
            raise ShapeError(
                f"{label}: label_length {shape.label_length} + bos exceeds the decoder's "
                f"max_target_positions {decoder_positions}; truncate or split transcripts."
            )
        return {
            "input_features": torch.randn(
                shape.batch_size, shape.input_length, config.num_mel_bins
            ),
            "attention_mask": _mask(tr, shape.batch_size, shape.input_length),
            "labels": _labels(tr, shape, config.vocab_size),
        }

    return StepAdapter(label, build, make_inputs, _loss_attr, output_frames=frames, config=config)
