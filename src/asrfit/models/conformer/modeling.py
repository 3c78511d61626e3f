"""asrfit's built-in Conformer-CTC model, a transformers ``PreTrainedModel``.

Shapes (B: batch, T: mel frames, T': encoder frames, U: label tokens, D: ``d_model``):

- Subsampling: ``log2(subsampling_factor)`` stages of ``Conv2d(3x3, stride 2, padding 1)`` +
  ReLU over (time, mel), ``subsampling_conv_channels`` channels (default ``d_model``), then a
  Linear to ``d_model`` (NeMo/ESPnet "striding"). Each stage maps ``n`` frames to
  ``(n - 1) // 2 + 1``; padded frames are zeroed before every stage, so padding never reaches
  a real frame.
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
- Optional intermediate CTC (``intermediate_ctc_layer = k > 0``; Lee and Watanabe, 2021): the
  same CTC head on block k's output, given labels; the CTC loss is
  ``(1 - intermediate_ctc_weight) * final + intermediate_ctc_weight * intermediate``.
- Optional attention decoder (``decoder_layers > 0``, :mod:`asrfit.models.conformer.decoder`):
  joint loss ``ctc_weight * ctc + (1 - ctc_weight) * cross-entropy``.

Importing :mod:`asrfit.models.conformer` registers ``"asrfit_conformer"`` with ``AutoConfig``
and ``AutoModelForCTC``, so ``save_pretrained`` / ``AutoModelForCTC.from_pretrained`` round-trip.
This module itself registers nothing: a saved model folder carries a copy of it
(:mod:`asrfit.models.hub`), which transformers imports without asrfit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from asrfit.errors import ConfigError
from asrfit.models.conformer.config import ConformerCTCConfig
from asrfit.models.conformer.decoder import ConformerDecoder
from asrfit.models.conformer.layers import ConformerEncoder, length_mask
from asrfit.models.dropout import Dropout


@dataclass
class ConformerCTCOutput(ModelOutput):
    """Output of :class:`ConformerForCTC`.

    Attributes:
        loss: Joint loss (CTC only without a decoder), when labels were given.
        logits: CTC logits (B, T', vocab_size).
        ctc_loss: The CTC part of the loss (with intermediate CTC, final and intermediate joined).
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
        self.ctc_dropout = Dropout(config.dropout)
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
        keep = self.config.intermediate_ctc_layer if labels is not None else 0
        hidden, lengths, intermediate = self.encoder(input_features, input_lengths, keep)
        logits = self.ctc_head(self.ctc_dropout(hidden))
        frames = hidden.shape[1]
        if lengths is None:
            lengths = torch.full((hidden.shape[0],), frames, dtype=torch.long, device=hidden.device)
        loss = ctc_loss = decoder_loss = decoder_logits = None
        if labels is not None:
            loss = ctc_loss = self._ctc_loss(logits, labels, lengths)
            if intermediate is not None:  # the shared head on an earlier block's output
                weight = self.config.intermediate_ctc_weight
                inter_logits = self.ctc_head(self.ctc_dropout(intermediate))
                inter_loss = self._ctc_loss(inter_logits, labels, lengths)
                loss = ctc_loss = (1.0 - weight) * ctc_loss + weight * inter_loss
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


__all__ = ["ConformerCTCOutput", "ConformerForCTC"]
