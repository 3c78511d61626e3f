"""Dropout, attention with dropout, and convolutions that run fast on a CPU.

PyTorch's CPU dropout draws one Bernoulli number per element with ``bernoulli_``, one at a
time from the Mersenne twister; in a training step of the built-in Conformer (6 layers of
128, batch 8 x 5 s, 2 threads) it took a quarter of the step. And scaled-dot-product
attention with dropout has no fused CPU kernel: it runs PyTorch's *math* path, whose
dropout is the same ``bernoulli_`` over the ``(B, H, T, T)`` probabilities.

Here a mask element costs 16 random bits: 64-bit words from the same generator (so
``torch.manual_seed`` and the saved RNG state govern it as they do ``F.dropout``), viewed as
four int16 lanes, each compared with a threshold. The drop probability is ``p`` rounded to
a multiple of 1/65536 and the kept values are scaled by the exact inverse of the keep
probability, so the output's expectation is the input, as with ``F.dropout``. The output is
the input times a float mask of zeros and that scale, one multiplication each way (backward
keeps that mask: 4 bytes an element, where ``native_dropout`` keeps 1): on a CPU,
``torch.where`` over a boolean mask runs several times slower than a multiplication.

Convolutions run on oneDNN. Its backward of a 2-D convolution over many channels (the
Conformer's subsampling) copies a channels-first input into channels-last order first; with
input and weight in channels-last order (:func:`conv2d`) it works in that order throughout and
no copy is made. A depthwise convolution over the time axis of a ``(B, T, C)`` activation (the
Conformer's convolution module) runs as a channels-last 2-D convolution on it as it lies
(:func:`conv1d_time_last`), without the transposed copies of ``conv(x.transpose(1, 2))``.

Only CPU tensors take these paths; on a GPU (and when the memory simulator traces a step for
a GPU on fake CPU tensors: :func:`host_kernels`) the calls are PyTorch's own dropout, fused
attention and convolution.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_LANES = 65536  # values of one int16 lane
_HOST_KERNELS = True  # CPU tensors take the fast path (off while tracing for a GPU)


@contextlib.contextmanager
def host_kernels(enabled: bool) -> Iterator[None]:
    """Let CPU tensors take the fast path (``enabled``) or PyTorch's own kernels, in a block.

    The memory simulator traces a step for a GPU on fake CPU tensors: there the step must
    run what the GPU would (``host_kernels(False)``).
    """
    global _HOST_KERNELS
    previous, _HOST_KERNELS = _HOST_KERNELS, enabled
    try:
        yield
    finally:
        _HOST_KERNELS = previous


def _on_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` takes this module's CPU paths (a CPU tensor, outside a GPU trace)."""
    return _HOST_KERNELS and tensor.device.type == "cpu"


def uses_fast_path(tensor: torch.Tensor, p: float) -> bool:
    """Whether dropout of ``tensor`` at ``p`` takes this module's fast CPU mask."""
    return _on_host(tensor) and 0.0 < p < 1.0


def _lanes(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, int, float]:
    """Random int16 lanes of ``shape``, the threshold below which a lane drops, and the scale."""
    numel = shape.numel()
    dropped = round(p * _LANES)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(2**63), 2**63 - 1)  # the whole 64 bits (random_() leaves the sign bit 0)
    lanes = words.view(torch.int16)[:numel].view(shape)
    return lanes, dropped - _LANES // 2, _LANES / (_LANES - dropped)


def drop_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[torch.Tensor, float]:
    """A boolean mask, True where an element is dropped, and the scale for the kept ones.

    Each element is dropped with probability ``round(p * 65536) / 65536``; the scale is the
    inverse of the keep probability.
    """
    lanes, threshold, scale = _lanes(shape, p, device)
    return lanes < threshold, scale


def keep_scale(shape: torch.Size, p: float, like: torch.Tensor) -> torch.Tensor:
    """The mask of :func:`drop_mask` as ``like``'s dtype: 0 where dropped, the scale elsewhere.

    It draws the same random words as :func:`drop_mask` (the same elements drop for a seed).
    """
    lanes, threshold, scale = _lanes(shape, p, like.device)
    return (lanes >= threshold).to(like.dtype) * scale


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the fast mask on a CPU."""
    if not training or p == 0.0:
        return x
    if not uses_fast_path(x, p):
        return F.dropout(x, p, training=True)
    return x * keep_scale(x.shape, p, x)  # backward keeps the float mask


def conv2d(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)``; on a CPU in channels-last order, input and weight (the output is then
    channels-last too, the same values up to summation order).

    The input is put in that order as well: a one-channel input (log-mel features) is the
    same either way, but only its channels-last strides make oneDNN's output channels-last,
    and the next layer's output gradient would otherwise meet a channels-first activation
    (ReLU's backward then runs 7x slower on the Conformer's subsampling).
    """
    if not (_on_host(x) and conv.padding_mode == "zeros"):
        return conv(x)
    x = x.to(memory_format=torch.channels_last)
    weight = conv.weight.contiguous(memory_format=torch.channels_last)
    return F.conv2d(x, weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)


def conv1d_time_last(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` over the time axis of ``x`` laid out ``(B, T, C)``, returned as ``(B, T, C)``.

    On a CPU it runs as a 2-D convolution in channels-last order, which ``(B, T, C)``
    already is: no transposed copies, and oneDNN's depthwise kernel in that order (the
    Conformer's 15-tap depthwise convolution over 8 x 83 x 128: forward and backward 1.1 ms
    against 2.5-2.9 ms through ``conv(x.transpose(1, 2))``, the same values).
    """
    if not (_on_host(x) and conv.padding_mode == "zeros"):
        return conv(x.transpose(1, 2)).transpose(1, 2)
    weight = conv.weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    padding = conv.padding if isinstance(conv.padding, str) else (0, conv.padding[0])
    out = F.conv2d(
        x.transpose(1, 2).unsqueeze(2),  # (B, C, 1, T), channels-last strides
        weight,
        conv.bias,
        (1, conv.stride[0]),
        padding,
        (1, conv.dilation[0]),
        conv.groups,
    )
    return out.squeeze(2).transpose(1, 2)


class Dropout(nn.Dropout):
    """``nn.Dropout`` that uses :func:`dropout` (the same module name and ``p``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Drop elements of ``x`` with probability ``p`` in training."""
        return dropout(x, self.p, self.training)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; with dropout on a CPU, its math path with the fast
    mask (what PyTorch's CPU kernel runs then, but for the dropout).

    ``attn_mask``: boolean (True attends) or additive float, broadcast to ``(B, H, T, S)``.
    Every query must attend to at least one key (a fully masked row gives NaN here, zeros in
    PyTorch's math path).
    """
    if not uses_fast_path(query, dropout_p):
        # looked up at call time: the memory simulator swaps in the CUDA kernels' shapes
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal
        )
    scores = torch.matmul(query * query.shape[-1] ** -0.5, key.transpose(-2, -1))
    # boolean masks become additive ones (0 or -inf, the mask's size): the same scores, and
    # an addition's backward passes the gradient through where masked_fill's runs again
    if is_causal:
        length, source = scores.shape[-2:]
        future = torch.ones(length, source, dtype=torch.bool, device=query.device).triu(1)
        scores = scores + _additive(future, scores)
    if attn_mask is not None:
        scores = scores + (
            _additive(~attn_mask, scores) if attn_mask.dtype == torch.bool else attn_mask
        )
    return torch.matmul(dropout(scores.softmax(-1), dropout_p), value)


def _additive(masked: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``-inf`` where ``masked``, else 0, in ``like``'s dtype (``masked``'s shape)."""
    zeros = torch.zeros(masked.shape, dtype=like.dtype, device=like.device)
    return zeros.masked_fill_(masked, float("-inf"))
