"""asrfit's built-in Conformer-CTC model, a transformers ``PreTrainedModel``.

Shapes (B: batch, T: mel frames, T': encoder frames, U: label tokens, D: ``d_model``):

- Subsampling: ``log2(subsampling_factor)`` stages of ``Conv2d(3x3, stride 2, padding 1)`` +
  ReLU over (time, mel), ``d_model`` channels, then a Linear to ``d_model`` (NeMo/ESPnet
  "striding"). Each stage maps ``n`` frames to ``(n - 1) // 2 + 1``; padded frames are zeroed
  before every stage, so padding never reaches a real frame.
- Positions: sinusoidal absolute positions added after subsampling (input scaled by
  ``sqrt(D)`` first, as ESPnet's ``PositionalEncoding``). Relative positions are not used.
- Conformer block (pre-LayerNorm): half-step FFN, multi-head self-attention
  (``F.scaled_dot_product_attention`` with a key padding mask), convolution module, half-step
  FFN, final LayerNorm. The convolution module is pointwise (a Linear, i.e. a 1x1 conv) to 2D,
  GLU, depthwise conv over time, **LayerNorm over channels** (instead of BatchNorm, so padded
  frames never enter normalisation statistics), SiLU, pointwise to D. Padded frames are
  zeroed before the depthwise conv.
- CTC head: Linear D -> ``vocab_size``; blank is ``pad_token_id``. The loss follows Hugging
  Face Wav2Vec2's ``"mean"`` reduction: each utterance's CTC loss divided by its target
  length, then the batch mean (``zero_infinity=True``).
- Optional attention decoder (``decoder_layers > 0``, :mod:`asrfit.asr.conformer_decoder`):
  joint loss ``ctc_weight * ctc + (1 - ctc_weight) * cross-entropy``.

Importing this module registers ``"asrfit_conformer"`` with ``AutoConfig`` and
``AutoModelForCTC``, so ``save_pretrained`` / ``AutoModelForCTC.from_pretrained`` round-trip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from asrfit.asr.conformer_decoder import ConformerDecoder, FeedForward, MultiHeadAttention
from asrfit.asr.text import ctc_collapse
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
        dropout: Dropout everywhere: positions, attention, FFN, residuals (Default: 0.1).
        decoder_layers: Attention-decoder layers; 0 means CTC only (Default: 0).
        decoder_attention_heads: Decoder self- and cross-attention heads (Default: 4).
        ctc_weight: Weight of CTC in the joint loss with a decoder (Default: 0.3).
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
    dropout: float = 0.1
    decoder_layers: int = 0
    decoder_attention_heads: int = 4
    ctc_weight: float = 0.3
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
        for name, closed in (("dropout", False), ("ctc_weight", True)):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
                raise self._fail(name, f"must be a number in [0, 1{']' if closed else ')'}")
        value = self.pad_token_id
        if not _is_int(value) or not 0 <= value < self.vocab_size:
            raise self._fail("pad_token_id", f"must be a token id in [0, vocab_size={self.vocab_size})")
        for name in ("bos_token_id", "eos_token_id") if self.decoder_layers else ():
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value <= self.vocab_size:
                raise self._fail(
                    name, f"must be a token id in [0, vocab_size={self.vocab_size}] (vocab_size: the "
                    "decoder's own token after the CTC classes)"
                )
            if value == self.pad_token_id:
                raise self._fail(name, f"must differ from pad_token_id={self.pad_token_id} (the CTC blank)")

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


def length_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Boolean ``(B, max_length)`` mask, True at the first ``lengths[b]`` positions."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


class ConvSubsampling(nn.Module):
    """Stride-2 Conv2d stages + ReLU, then Linear: ``(B, T, F) -> (B, T', D)``."""

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__()
        channels = config.d_model
        stages = int(math.log2(config.subsampling_factor))
        self.convs = nn.ModuleList(
            nn.Conv2d(1 if i == 0 else channels, channels, 3, stride=2, padding=1)
            for i in range(stages)
        )
        freq = subsampled_frames(config.num_mel_bins, config.subsampling_factor)
        self.out = nn.Linear(channels * freq, config.d_model)

    def forward(
        self, features: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Subsample; ``lengths`` (B,) of real frames, or None when nothing is padded."""
        x = features.unsqueeze(1)  # (B, 1, T, F)
        for conv in self.convs:
            if lengths is not None:
                x = x.masked_fill(~length_mask(lengths, x.shape[2])[:, None, :, None], 0.0)
                lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
            x = F.relu(conv(x))
        batch, channels, frames, freq = x.shape
        return self.out(x.transpose(1, 2).reshape(batch, frames, channels * freq)), lengths


class ConvModule(nn.Module):
    """Pointwise + GLU, depthwise conv over time, LayerNorm over channels, SiLU, pointwise."""

    def __init__(self, d_model: int, kernel_size: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_conv1 = nn.Linear(d_model, 2 * d_model)  # a 1x1 conv over (B, T, D)
        self.depthwise_conv = nn.Conv1d(
            d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model
        )
        self.conv_norm = nn.LayerNorm(d_model)
        self.pointwise_conv2 = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``; ``frame_mask`` (B, T) True at real frames, or None."""
        x = F.glu(self.pointwise_conv1(self.norm(x)), dim=-1)
        if frame_mask is not None:
            x = x.masked_fill(~frame_mask[:, :, None], 0.0)
        x = self.depthwise_conv(x.transpose(1, 2)).transpose(1, 2)
        return self.dropout(self.pointwise_conv2(F.silu(self.conv_norm(x))))


class ConformerBlock(nn.Module):
    """Half-step FFN, self-attention, conv module, half-step FFN, LayerNorm (all residual)."""

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__()
        d, p = config.d_model, config.dropout
        self.ffn1 = FeedForward(d, config.ffn_mult, p)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = MultiHeadAttention(d, config.encoder_attention_heads, p)
        self.conv = ConvModule(d, config.conv_kernel_size, p)
        self.ffn2 = FeedForward(d, config.ffn_mult, p)
        self.final_norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(p)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``; ``frame_mask`` (B, T) True at real frames, or None."""
        x = x + 0.5 * self.dropout(self.ffn1(x))
        x = x + self.dropout(self.attn(self.attn_norm(x), key_mask=frame_mask))
        x = x + self.conv(x, frame_mask)
        x = x + 0.5 * self.dropout(self.ffn2(x))
        return self.final_norm(x)


def sinusoidal_positions(length: int, d_model: int, device: torch.device) -> torch.Tensor:
    """``(length, d_model)`` float32: sin at even channels, cos at odd (Vaswani et al.)."""
    position = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
        * (-math.log(10000.0) / d_model)
    )
    angles = position * inv_freq  # (length, d_model / 2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(length, d_model)


class ConformerEncoder(nn.Module):
    """Subsampling, positions, Conformer blocks: ``(B, T, F) -> (B, T', D)``."""

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.subsampling = ConvSubsampling(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(ConformerBlock(config) for _ in range(config.encoder_layers))
        self.gradient_checkpointing = False

    def forward(
        self, features: torch.Tensor, input_lengths: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode; returns hidden states and encoder lengths (None when ``input_lengths`` is)."""
        x, lengths = self.subsampling(features, input_lengths)
        positions = sinusoidal_positions(x.shape[1], self.d_model, x.device)
        x = self.dropout(x * math.sqrt(self.d_model) + positions.to(x.dtype))
        frame_mask = length_mask(lengths, x.shape[1]) if lengths is not None else None
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = self._gradient_checkpointing_func(layer.__call__, x, frame_mask)
            else:
                x = layer(x, frame_mask)
        return x, lengths


@dataclass
class ConformerCTCOutput(ModelOutput):
    """Output of :class:`ConformerForCTC`.

    Attributes:
        loss: Joint loss (CTC only without a decoder), when labels were given.
        logits: CTC logits (B, T', vocab_size).
        ctc_loss: The CTC part of the loss.
        decoder_loss: The decoder's token cross-entropy (decoder only).
        decoder_logits: Decoder logits (B, U + 1, decoder_vocab_size) (decoder only).
        output_lengths: Encoder frames per utterance (B,).
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ctc_loss: torch.Tensor | None = None
    decoder_loss: torch.Tensor | None = None
    decoder_logits: torch.Tensor | None = None
    output_lengths: torch.Tensor | None = None


class ConformerForCTC(PreTrainedModel):
    """Conformer encoder + CTC head (+ optional attention decoder); see the module docstring."""

    config_class = ConformerCTCConfig
    base_model_prefix = "encoder"
    main_input_name = "input_features"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["ConformerBlock"]

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__(config)
        self.encoder = ConformerEncoder(config)
        self.ctc_dropout = nn.Dropout(config.dropout)
        self.ctc_head = nn.Linear(config.d_model, config.vocab_size)
        self.decoder = ConformerDecoder(config) if config.decoder_layers > 0 else None
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # PyTorch's own Linear/Conv init (as ESPnet and NeMo keep): on a small demo corpus a
        # tiny model leaves the all-blank CTC plateau within ~50 steps, where transformers'
        # normal(0, 0.02) default had not left it after 72. Embeddings and norms: the default.
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.weight[0].numel())  # 1 / sqrt(fan_in)
                init.uniform_(module.bias, -bound, bound)
        else:
            super()._init_weights(module)

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """Exact encoder frames for input lengths (B,) in mel frames (see :func:`subsampled_frames`)."""
        lengths = input_lengths.long()
        for _ in self.encoder.subsampling.convs:
            lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
        return lengths

    def _ctc_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        if labels.max() >= self.config.vocab_size:
            raise ConfigError(
                f"labels hold a token id >= ConformerCTCConfig.vocab_size={self.config.vocab_size}; "
                "set vocab_size to the tokenizer's size (blank included)."
            )
        log_probs = F.log_softmax(logits, dim=-1, dtype=torch.float32).transpose(0, 1)
        labels_mask = labels >= 0
        target_lengths = labels_mask.sum(-1)
        with torch.backends.cudnn.flags(enabled=False):
            return F.ctc_loss(
                log_probs,
                labels.masked_select(labels_mask),
                lengths,
                target_lengths,
                blank=self.config.pad_token_id,
                reduction="mean",
                zero_infinity=True,
            )

    def forward(
        self,
        input_features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> ConformerCTCOutput | tuple:
        """Encode, project to CTC logits and, given labels, compute the loss.

        Args:
            input_features: (B, T, num_mel_bins) log-mel features.
            attention_mask: (B, T), 1 at real frames, right-padded (Default: None, all real).
            labels: (B, U) token ids padded with -100 (Default: None, no loss).
            decoder_input_ids: (B, U + 1) decoder inputs (Default: bos + labels, -100 -> eos).
            return_dict: Return a tuple when False (Default: the config's ``return_dict``).

        Returns:
            :class:`ConformerCTCOutput` (or its tuple).
        """
        input_lengths = attention_mask.sum(-1).long() if attention_mask is not None else None
        hidden, lengths = self.encoder(input_features, input_lengths)
        logits = self.ctc_head(self.ctc_dropout(hidden))
        frames = hidden.shape[1]
        if lengths is None:
            lengths = torch.full((hidden.shape[0],), frames, dtype=torch.long, device=hidden.device)
        loss = ctc_loss = decoder_loss = decoder_logits = None
        if labels is not None:
            loss = ctc_loss = self._ctc_loss(logits, labels, lengths)
        if self.decoder is not None and (labels is not None or decoder_input_ids is not None):
            frame_mask = length_mask(lengths, frames) if input_lengths is not None else None
            decoder_logits, decoder_loss = self.decoder(
                hidden, frame_mask, labels=labels, decoder_input_ids=decoder_input_ids
            )
            if decoder_loss is not None:
                weight = self.config.ctc_weight
                loss = weight * ctc_loss + (1.0 - weight) * decoder_loss
        # Built once at the end: a ModelOutput drops fields first set to None from its tuple.
        out = ConformerCTCOutput(
            loss=loss,
            logits=logits,
            ctc_loss=ctc_loss,
            decoder_loss=decoder_loss,
            decoder_logits=decoder_logits,
            output_lengths=lengths,
        )
        use_dict = self.config.return_dict if return_dict is None else return_dict
        return out if use_dict else out.to_tuple()


def ctc_greedy(
    logits: torch.Tensor, output_lengths: torch.Tensor | None = None, blank_id: int = 0
) -> list[list[int]]:
    """Greedy CTC decoding: argmax per frame, collapse repeats, drop blanks.

    Args:
        logits: (B, T', vocab) scores (or log-probabilities).
        output_lengths: (B,) real frames per utterance (Default: None, all T').
        blank_id: The blank class (Default: 0).

    Returns:
        One token-id list per utterance.
    """
    best = logits.argmax(dim=-1).tolist()
    lengths = output_lengths.tolist() if output_lengths is not None else [len(b) for b in best]
    return [ctc_collapse(path[: int(n)], blank_id) for path, n in zip(best, lengths, strict=True)]


def _register() -> None:
    from transformers import AutoConfig, AutoModelForCTC

    AutoConfig.register(MODEL_TYPE, ConformerCTCConfig, exist_ok=True)
    AutoModelForCTC.register(ConformerCTCConfig, ConformerForCTC, exist_ok=True)


_register()

__all__ = [
    "CONFORMER_SIZES",
    "MODEL_TYPE",
    "ConformerCTCConfig",
    "ConformerCTCOutput",
    "ConformerEncoder",
    "ConformerForCTC",
    "conformer_config",
    "ctc_greedy",
    "length_mask",
    "subsampled_frames",
]
