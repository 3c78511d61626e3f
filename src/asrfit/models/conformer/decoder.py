"""Attention blocks of :class:`asrfit.models.conformer.ConformerForCTC` and its optional decoder.

:class:`MultiHeadAttention` and :class:`FeedForward` serve the Conformer encoder blocks too.

A small pre-LayerNorm Transformer decoder (as ``nn.TransformerDecoderLayer(norm_first=True,
batch_first=True)``): token embedding plus learned positions, layers of causal
self-attention, cross-attention to the encoder output and a feed-forward block, a final
LayerNorm and a Linear to the vocabulary. Training is teacher-forced from the CTC labels
(:func:`teacher_forcing`): inputs are ``bos`` + labels, targets are labels + ``eos``, and the
cross-entropy ignores -100. The decoder's vocabulary is
``ConformerCTCConfig.decoder_vocab_size``: the CTC classes plus ``<sos/eos>`` (by default
id ``vocab_size``, after them, so it never stands for a character as well).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from asrfit.errors import ShapeError
from asrfit.models.conformer.config import ConformerCTCConfig
from asrfit.models.conformer.layers import FeedForward, MultiHeadAttention
from asrfit.models.dropout import Dropout

IGNORE_INDEX = -100


def teacher_forcing(
    labels: torch.Tensor, bos_token_id: int, eos_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder inputs and targets from right-padded labels.

    Args:
        labels: (B, U) token ids padded with -100 at the end.
        bos_token_id: Start token put before each sequence.
        eos_token_id: End token put after each sequence (and into the inputs' padding).

    Returns:
        ``(decoder_input_ids, targets)``, both (B, U + 1): for labels ``[a, b, -100]``, inputs
        ``[bos, a, b, eos]`` and targets ``[a, b, eos, -100]``.
    """
    batch, length = labels.shape
    real = labels != IGNORE_INDEX
    bos = torch.full((batch, 1), bos_token_id, dtype=labels.dtype, device=labels.device)
    inputs = torch.cat([bos, labels.masked_fill(~real, eos_token_id)], dim=1)
    padded = torch.cat([labels, torch.full_like(bos, IGNORE_INDEX)], dim=1)
    positions = torch.arange(length + 1, device=labels.device)[None, :]
    at_end = positions == real.sum(-1, keepdim=True)
    targets = padded.masked_fill(at_end, eos_token_id)
    return inputs, targets


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward (pre-LN, residual)."""

    def __init__(self, d_model: int, num_heads: int, ffn_mult: int, dropout: float) -> None:
        super().__init__()
        self.self_norm = nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_norm = nn.LayerNorm(d_model)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ffn = FeedForward(d_model, ffn_mult, dropout)
        self.dropout = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``x`` (B, U, D), ``memory`` (B, T', D), ``memory_mask`` (B, T') or None -> (B, U, D)."""
        x = x + self.dropout(self.self_attn(self.self_norm(x), is_causal=True))
        x = x + self.dropout(
            self.cross_attn(self.cross_norm(x), memory=memory, key_mask=memory_mask)
        )
        return x + self.dropout(self.ffn(x))


class ConformerDecoder(nn.Module):
    """Token + position embeddings, :class:`DecoderLayer` stack, LayerNorm, Linear to vocab."""

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__()
        d = config.d_model
        self.bos_token_id = config.bos_token_id
        self.eos_token_id = config.eos_token_id
        self.max_target_positions = config.max_target_positions
        self.embed_tokens = nn.Embedding(config.decoder_vocab_size, d)
        self.embed_positions = nn.Embedding(config.max_target_positions, d)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(d, config.decoder_attention_heads, config.ffn_mult, config.dropout)
            for _ in range(config.decoder_layers)
        )
        self.final_norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, config.decoder_vocab_size)
        self.gradient_checkpointing = False

    def forward(
        self,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None,
        labels: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode teacher-forced; return logits (B, U + 1, vocab) and the loss (None without labels).

        Args:
            memory: Encoder output (B, T', D).
            memory_mask: (B, T') True at real encoder frames, or None.
            labels: (B, U) padded with -100 (Default: None).
            decoder_input_ids: (B, U + 1) (Default: from ``labels``, see :func:`teacher_forcing`).

        Raises:
            ShapeError: When the sequence is longer than ``max_target_positions``.
        """
        targets = None
        if labels is not None:
            inputs, targets = teacher_forcing(labels, self.bos_token_id, self.eos_token_id)
            decoder_input_ids = inputs if decoder_input_ids is None else decoder_input_ids
        length = decoder_input_ids.shape[1]
        if length > self.max_target_positions:
            raise ShapeError(
                f"decoder sequence of {length} tokens (labels + bos) exceeds "
                f"ConformerCTCConfig.max_target_positions={self.max_target_positions}; raise it "
                "or drop longer transcripts."
            )
        positions = torch.arange(length, device=decoder_input_ids.device)
        x = self.dropout(self.embed_tokens(decoder_input_ids) + self.embed_positions(positions))
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = self._gradient_checkpointing_func(layer.__call__, x, memory, memory_mask)
            else:
                x = layer(x, memory, memory_mask)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits, None
        if targets.shape != logits.shape[:2]:
            raise ShapeError(
                f"decoder_input_ids has shape {tuple(decoder_input_ids.shape)}; with labels of "
                f"shape {tuple(labels.shape)} it must be {tuple(targets.shape)} (bos + labels)."
            )
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
        )
        return logits, loss


__all__ = ["IGNORE_INDEX", "ConformerDecoder", "DecoderLayer", "teacher_forcing"]
