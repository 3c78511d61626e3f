"""Configuration of asrfit's built-in Conformer-CTC: :class:`ConformerCTCConfig` and presets."""

from __future__ import annotations

import math
from typing import Any

from transformers import PretrainedConfig

from asrfit.errors import ConfigError

MODEL_TYPE = "asrfit_conformer"
SUBSAMPLING_FACTORS = (4, 8)

# Presets (d_model, layers, heads); everything else takes the config defaults.
CONFORMER_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 96, "encoder_layers": 4, "encoder_attention_heads": 4},
    "small": {"d_model": 128, "encoder_layers": 6, "encoder_attention_heads": 4},
    "medium": {"d_model": 192, "encoder_layers": 8, "encoder_attention_heads": 4},
    "large": {"d_model": 256, "encoder_layers": 12, "encoder_attention_heads": 4},
}


_MINIMUM = {  # integer fields and their smallest allowed value
    "vocab_size": 2,
    "num_mel_bins": 1,
    "d_model": 2,
    "encoder_layers": 1,
    "encoder_attention_heads": 1,
    "ffn_mult": 1,
    "conv_kernel_size": 1,
    "decoder_layers": 0,
    "decoder_attention_heads": 1,
    "max_target_positions": 2,
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def subsampled_frames(num_frames: int, subsampling_factor: int) -> int:
    """Encoder frames after the stride-2 conv stages (3x3 kernel, padding 1).

    Args:
        num_frames: Input mel frames.
        subsampling_factor: 4 or 8 (2 or 3 stages).

    Returns:
        ``num_frames`` mapped ``log2(subsampling_factor)`` times by ``n -> (n - 1) // 2 + 1``
        (``ceil(n / 2)``); 0 stays 0.
    """
    for _ in range(int(math.log2(subsampling_factor))):
        num_frames = (num_frames - 1) // 2 + 1
    return num_frames


class ConformerCTCConfig(PretrainedConfig):
    """Configuration of :class:`ConformerForCTC` (values are checked on construction).

    Attributes:
        vocab_size: CTC output classes, blank included (Default: 32).
        num_mel_bins: Log-mel features per input frame (Default: 80).
        d_model: Model dimension D (Default: 256); even, divisible by the head counts.
        encoder_layers: Conformer blocks (Default: 12).
        encoder_attention_heads: Self-attention heads (Default: 4).
        ffn_mult: Feed-forward inner size as a multiple of D (Default: 4).
        conv_kernel_size: Depthwise conv kernel over time, odd (Default: 15).
        subsampling_factor: Time subsampling, 4 or 8 (Default: 4).
        subsampling_conv_channels: Channels of the subsampling convolutions (Default: None,
            ``d_model``); fewer make the front-end's stride-2 3x3 convolutions, often the
            costliest part of a small model's step on a CPU, cheaper (NeMo's name).
        dropout: Dropout everywhere: positions, attention, FFN, residuals (Default: 0.1).
        decoder_layers: Attention-decoder layers; 0 means CTC only (Default: 0).
        decoder_attention_heads: Decoder self- and cross-attention heads (Default: 4).
        ctc_weight: Weight of CTC in the joint loss with a decoder (Default: 0.3).
        intermediate_ctc_layer: Intermediate CTC (Lee and Watanabe, 2021; ESPnet's
            ``interctc_layer_idx``, NeMo's ``interctc``): the CTC head also reads the output of
            this block (1-based, below ``encoder_layers``) and its loss joins the final one; 0
            for none (Default: 0).
        intermediate_ctc_weight: The intermediate loss's weight: the CTC loss is
            ``(1 - w) * final + w * intermediate`` (Default: 0.3).
        max_target_positions: Decoder positions, i.e. the longest label + 1 (Default: 512).
        initializer_range: Std of the normal init of decoder embeddings (Default: 0.02); Linear
            and Conv layers keep PyTorch's default init.
        pad_token_id: The CTC blank (Default: 0).
        bos_token_id: Decoder start token (Default: ``vocab_size`` with a decoder: a token of
            its own after the CTC classes, so it never collides with a character).
        eos_token_id: Decoder end token (Default: ``vocab_size``, the same token as ``bos``).
    """

    model_type = MODEL_TYPE
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
        "num_attention_heads": "encoder_attention_heads",
    }

    vocab_size: int = 32
    num_mel_bins: int = 80
    d_model: int = 256
    encoder_layers: int = 12
    encoder_attention_heads: int = 4
    ffn_mult: int = 4
    conv_kernel_size: int = 15
    subsampling_factor: int = 4
    subsampling_conv_channels: int | None = None
    dropout: float = 0.1
    decoder_layers: int = 0
    decoder_attention_heads: int = 4
    ctc_weight: float = 0.3
    intermediate_ctc_layer: int = 0
    intermediate_ctc_weight: float = 0.3
    max_target_positions: int = 512
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        for name in ("bos_token_id", "eos_token_id"):  # one <sos/eos> after the CTC classes
            if self.decoder_layers and _is_int(self.vocab_size) and getattr(self, name) is None:
                setattr(self, name, self.vocab_size)
        self._check()

    def _fail(self, name: str, rule: str) -> ConfigError:
        return ConfigError(
            f"ConformerCTCConfig.{name}={getattr(self, name)!r}: {rule}; "
            "fix that value in the config."
        )

    def _check(self) -> None:
        for name, low in _MINIMUM.items():
            if not _is_int(getattr(self, name)) or getattr(self, name) < low:
                raise self._fail(name, f"must be an integer >= {low}")
        heads = [("encoder", self.encoder_attention_heads)]
        heads += [("decoder", self.decoder_attention_heads)] if self.decoder_layers else []
        for which, count in heads:
            if self.d_model % 2 or self.d_model % count:  # sinusoidal positions come in pairs
                raise self._fail(
                    "d_model", f"must be even and divisible by {which}_attention_heads={count}"
                )
        if self.conv_kernel_size % 2 == 0:
            raise self._fail("conv_kernel_size", "must be odd, so that frames stay centred")
        if self.subsampling_factor not in SUBSAMPLING_FACTORS:
            raise self._fail("subsampling_factor", f"must be one of {SUBSAMPLING_FACTORS}")
        channels = self.subsampling_conv_channels
        if channels is not None and (not _is_int(channels) or channels < 1):
            raise self._fail(
                "subsampling_conv_channels", "must be None (d_model) or an integer >= 1"
            )
        layer = self.intermediate_ctc_layer
        if not _is_int(layer) or not 0 <= layer < self.encoder_layers:
            raise self._fail(
                "intermediate_ctc_layer",
                f"must be 0 (none) or a block below encoder_layers={self.encoder_layers}",
            )
        numbers = (("dropout", False), ("ctc_weight", True), ("intermediate_ctc_weight", False))
        for name, closed in numbers:
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
                raise self._fail(name, f"must be a number in [0, 1{']' if closed else ')'}")
        value = self.pad_token_id
        if not _is_int(value) or not 0 <= value < self.vocab_size:
            raise self._fail(
                "pad_token_id", f"must be a token id in [0, vocab_size={self.vocab_size})"
            )
        for name in ("bos_token_id", "eos_token_id") if self.decoder_layers else ():
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value <= self.vocab_size:
                raise self._fail(
                    name,
                    f"must be a token id in [0, vocab_size={self.vocab_size}] (vocab_size: the "
                    "decoder's own token after the CTC classes)",
                )
            if value == self.pad_token_id:
                raise self._fail(
                    name, f"must differ from pad_token_id={self.pad_token_id} (the CTC blank)"
                )

    def validate_token_ids(self) -> None:
        """No-op: :meth:`_check` validates the ids, allowing ``bos``/``eos`` = ``vocab_size``
        (transformers' own check would warn that it lies outside the CTC classes)."""

    @property
    def decoder_vocab_size(self) -> int:
        """Decoder classes: the CTC classes, plus ``<sos/eos>`` when it lies after them."""
        return max(self.vocab_size, (self.bos_token_id or 0) + 1, (self.eos_token_id or 0) + 1)

    def output_frames(self, num_frames: int) -> int:
        """Encoder frames for ``num_frames`` input mel frames (see :func:`subsampled_frames`)."""
        return subsampled_frames(num_frames, self.subsampling_factor)


def conformer_config(
    size_or_d_model: str | int = "small", vocab_size: int = 32, **overrides: Any
) -> ConformerCTCConfig:
    """Build a config from a preset of :data:`CONFORMER_SIZES` or a model dimension.

    Args:
        size_or_d_model: ``"small"``, ``"medium"``, ``"large"``, or an int ``d_model`` (then
            6 layers and 4 heads unless overridden).
        vocab_size: CTC classes, blank included (Default: 32).
        **overrides: Any other :class:`ConformerCTCConfig` field.

    Returns:
        The config, with ``architectures = ["ConformerForCTC"]``.

    Raises:
        ConfigError: For an unknown size or a bad value.
    """
    if isinstance(size_or_d_model, str):
        if size_or_d_model not in CONFORMER_SIZES:
            raise ConfigError(
                f"conformer size {size_or_d_model!r} is not known; use one of "
                f"{', '.join(CONFORMER_SIZES)} or an integer d_model."
            )
        values: dict[str, Any] = dict(CONFORMER_SIZES[size_or_d_model])
    else:
        values = {"d_model": size_or_d_model, "encoder_layers": 6, "encoder_attention_heads": 4}
    values.update(vocab_size=vocab_size, architectures=["ConformerForCTC"], **overrides)
    return ConformerCTCConfig(**values)
