"""Building blocks of the built-in Conformer: attention, feed-forward, convolution, encoder.

:class:`MultiHeadAttention` and :class:`FeedForward` serve the encoder blocks and the optional
decoder (:mod:`asrfit.models.conformer.decoder`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from asrfit.models.conformer.config import ConformerCTCConfig, subsampled_frames
from asrfit.models.dropout import Dropout, attention, conv1d_time_last, conv2d


class FeedForward(nn.Module):
    """LayerNorm, Linear D -> ffn_mult*D, SiLU, dropout, Linear back to D."""

    def __init__(self, d_model: int, ffn_mult: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, ffn_mult * d_model)
        self.fc2 = nn.Linear(ffn_mult * d_model, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``."""
        return self.fc2(self.dropout(F.silu(self.fc1(self.norm(x)))))


class MultiHeadAttention(nn.Module):
    """Multi-head attention over SDPA: self-attention, or cross-attention to ``memory``."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Attend ``x`` (B, T, D) to itself or to ``memory`` (B, S, D).

        Args:
            x: Queries (and keys/values for self-attention).
            memory: Keys/values for cross-attention (Default: None, self-attention).
            key_mask: (B, S) bool, True at real keys (Default: None, all real).
            is_causal: Mask future positions (self-attention only).

        Returns:
            (B, T, D).
        """
        batch, length, d_model = x.shape
        source = x if memory is None else memory
        heads, head_dim = self.num_heads, d_model // self.num_heads
        q = self.q_proj(x).view(batch, length, heads, head_dim).transpose(1, 2)
        kv = self.kv_proj(source).view(batch, source.shape[1], 2, heads, head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        mask = key_mask[:, None, None, :] if key_mask is not None else None
        # SDPA, or on a CPU with dropout its math path with a fast mask (asrfit.models.dropout)
        out = attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, d_model))


def length_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Boolean ``(B, max_length)`` mask, True at the first ``lengths[b]`` positions."""
    return torch.arange(max_length, device=lengths.device)[None, :] < lengths[:, None]


class ConvSubsampling(nn.Module):
    """Stride-2 Conv2d stages + ReLU, then Linear: ``(B, T, F) -> (B, T', D)``."""

    def __init__(self, config: ConformerCTCConfig) -> None:
        super().__init__()
        channels = config.subsampling_conv_channels or config.d_model
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
                x = x * length_mask(lengths, x.shape[2])[:, None, :, None].to(x.dtype)
                lengths = torch.div(lengths - 1, 2, rounding_mode="floor") + 1
            x = F.relu(conv2d(conv, x))
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
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, frame_mask: torch.Tensor | None) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``; ``frame_mask`` (B, T) True at real frames, or None."""
        x = F.glu(self.pointwise_conv1(self.norm(x)), dim=-1)
        if frame_mask is not None:
            x = x * frame_mask[:, :, None].to(x.dtype)
        x = conv1d_time_last(self.depthwise_conv, x)
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
        self.dropout = Dropout(p)

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
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(ConformerBlock(config) for _ in range(config.encoder_layers))
        self.gradient_checkpointing = False

    # Each block may be checkpointed alone through its own ``gradient_checkpointing`` flag.
    per_layer_checkpointing = True

    def forward(
        self,
        features: torch.Tensor,
        input_lengths: torch.Tensor | None = None,
        keep_layer: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Encode; returns hidden states, encoder lengths (None when ``input_lengths`` is) and
        the output of block ``keep_layer`` (1-based; None for 0: intermediate CTC reads it)."""
        x, lengths = self.subsampling(features, input_lengths)
        positions = sinusoidal_positions(x.shape[1], self.d_model, x.device)
        x = self.dropout(x * math.sqrt(self.d_model) + positions.to(x.dtype))
        frame_mask = length_mask(lengths, x.shape[1]) if lengths is not None else None
        kept = None
        for index, layer in enumerate(self.layers, start=1):
            if self.gradient_checkpointing and self.training:
                x = self._gradient_checkpointing_func(layer.__call__, x, frame_mask)
            elif getattr(layer, "gradient_checkpointing", False) and self.training:
                # this block alone (asrfit.models.checkpointing.checkpoint_first_layers)
                x = layer._gradient_checkpointing_func(layer.__call__, x, frame_mask)
            else:
                x = layer(x, frame_mask)
            if index == keep_layer:
                kept = x
        return x, lengths, kept
