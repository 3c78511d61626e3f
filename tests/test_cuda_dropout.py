"""Dropout traced for a CUDA target keeps what the GPU keeps: a boolean mask.

PyTorch runs ``aten::dropout`` on a CUDA tensor as the fused ``native_dropout`` kernel, whose
backward keeps a 1-byte mask per element; on a CPU tensor it multiplies by a noise tensor of
the input's dtype and keeps that (``aten/src/ATen/native/Dropout.cpp``). The references here
are that rule and closed-form byte counts, not the simulator's own output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from asrfit.memory import simulate_model
from asrfit.memory.setup import Setup
from asrfit.memory.trace.eventlog import round_block
from asrfit.memory.trace.kernels import device_kernels

_ORIGINAL_DROPOUT = F.dropout


def _saved_by_dropout(x: torch.Tensor, p: float) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.dropout(x, p, training=True)
    return saved


def test_cuda_target_dropout_saves_a_boolean_mask_and_the_cpu_one_its_noise() -> None:
    x = torch.randn(8, 128, requires_grad=True)
    with device_kernels("cuda"):
        saved = _saved_by_dropout(x, 0.1)
    assert [(t.dtype, tuple(t.shape)) for t in saved] == [(torch.bool, (8, 128))]
    plain = _saved_by_dropout(x, 0.1)
    assert [(t.dtype, tuple(t.shape)) for t in plain] == [(torch.float32, (8, 128))]
    assert F.dropout is _ORIGINAL_DROPOUT  # restored after the block


def test_cuda_target_dropout_drops_and_scales_like_dropout() -> None:
    torch.manual_seed(0)
    x = torch.ones(256, 256, requires_grad=True)
    with device_kernels("cuda"):
        y = F.dropout(x, 0.25, training=True)
        assert torch.equal(F.dropout(x, 0.25, training=False), x)  # eval: identity
        assert torch.equal(F.dropout(x, 0.0, training=True), x)  # p = 0: identity
    zeros = (y == 0).float().mean().item()
    assert 0.23 < zeros < 0.27
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.75))
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float() / 0.75)


class _Stack(nn.Module):
    """``n`` x (Linear without bias, Dropout(p)): each layer keeps its input and a mask."""

    def __init__(self, n: int, width: int, p: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[m for _ in range(n) for m in (nn.Linear(width, width, bias=False), nn.Dropout(p))]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _forward_peak(p: float, n: int, batch: int, width: int) -> int:
    sim = simulate_model(
        lambda: _Stack(n, width, p),
        lambda: torch.randn(batch, width),
        lambda m, x: m(x).sum(),
        setup=Setup(optimizer="sgd"),
        target="cuda",
    )
    return sim.phase_peaks_bytes["forward"]


def test_cuda_trace_of_dropout_adds_one_byte_per_element_per_layer() -> None:
    """Closed form. With p = 0 dropout returns its input, and the forward's peak is at the
    loss: the n kept layer inputs, the last linear output and the loss's scalar. With p > 0
    it is at the last dropout: the n kept layer inputs (dropout outputs now, the same size),
    n boolean masks (batch x width bytes each), and the last linear output beside the
    dropout output made from it (4 bytes an element); the loss's scalar comes after."""
    n, batch, width = 4, 8, 128
    extra = _forward_peak(0.1, n, batch, width) - _forward_peak(0.0, n, batch, width)
    masks = n * round_block(batch * width)
    assert extra == masks + round_block(4 * batch * width) - round_block(4)
    # the CPU kernel's noise would have added 4 bytes an element per layer instead of 1
    assert extra < n * round_block(4 * batch * width)
