"""A CUDA target's trace follows CUDA autocast and CUDA layer norm, not the CPU's.

References: PyTorch's autocast lists (``aten/src/ATen/autocast_mode.h``: layer norm and
group norm in ``AT_FORALL_FP32``, softmax and log-softmax in
``AT_FORALL_FP32_SET_OPT_DTYPE``; CPU autocast leaves them in the low-precision dtype),
CUDA layer norm's ``expect_contiguous()`` of its input, and closed-form byte counts; not the
simulator's own output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from asrfit.memory import simulate_model
from asrfit.memory.setup import Setup
from asrfit.memory.trace.kernels import device_kernels
from asrfit.memory.trace.scratch import scratch_rules

_ORIGINAL_LAYER_NORM = F.layer_norm
_ORIGINAL_TENSOR_SOFTMAX = torch.Tensor.softmax


def _dtypes(x: torch.Tensor) -> dict[str, torch.dtype]:
    return {
        "layer_norm": F.layer_norm(x, (8,)).dtype,
        "group_norm": F.group_norm(x, 2).dtype,
        "softmax": F.softmax(x, -1).dtype,
        "log_softmax": F.log_softmax(x, dim=-1).dtype,
        "torch.softmax": torch.softmax(x, -1).dtype,
        "Tensor.softmax": x.softmax(-1).dtype,
        "linear": F.linear(x, torch.randn(8, 8)).dtype,
    }


def test_cuda_autocast_runs_norms_and_softmax_in_fp32_and_matmuls_in_bf16() -> None:
    x = torch.randn(2, 4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu = _dtypes(x.bfloat16())
        with device_kernels("cuda", mixed_precision=True):
            cuda = _dtypes(x.bfloat16())
            explicit = F.softmax(x.bfloat16(), -1, dtype=torch.bfloat16).dtype
    assert set(cpu.values()) == {torch.bfloat16}  # CPU autocast: all in bf16
    assert cuda == {**{k: torch.float32 for k in cpu}, "linear": torch.bfloat16}
    assert explicit == torch.bfloat16  # an explicit dtype is kept, as CUDA autocast keeps it
    assert F.layer_norm is _ORIGINAL_LAYER_NORM  # restored after the block
    assert torch.Tensor.softmax is _ORIGINAL_TENSOR_SOFTMAX


def test_fp32_policy_only_under_autocast_and_only_with_mixed_precision() -> None:
    x = torch.randn(2, 4, 8).bfloat16()
    with device_kernels("cuda", mixed_precision=True):
        assert F.layer_norm(x, (8,)).dtype == torch.bfloat16  # autocast off: the op as called
    with torch.autocast("cpu", dtype=torch.bfloat16), device_kernels("cuda"):
        assert F.layer_norm(x, (8,)).dtype == torch.bfloat16  # fp32 setups: nothing patched


def test_checkpoint_recompute_sees_the_same_dtypes() -> None:
    """A checkpointed forward recomputed in backward takes the fp32 policy too (else
    torch.utils.checkpoint finds fp32 saved tensors recomputed as bf16 and raises)."""
    norm = nn.LayerNorm(8)
    x = torch.randn(2, 4, 8, requires_grad=True)
    with device_kernels("cuda", mixed_precision=True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = checkpoint(lambda t: norm(t).softmax(-1), x, use_reentrant=False)
        assert y.dtype == torch.float32
        y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_cuda_layer_norm_copies_a_strided_input() -> None:
    rules = scratch_rules("cuda")
    x = torch.randn(3, 32, 50)  # (batch, channels, frames): normalised over channels
    transposed = x.transpose(1, 2)
    grad = torch.randn(3, 50, 32)
    forward = rules[torch.ops.aten.native_layer_norm.default]
    backward = rules[torch.ops.aten.native_layer_norm_backward.default]
    assert forward((transposed, [32], None, None, 1e-5), {}, None) == 4 * x.numel()
    assert forward((grad, [32], None, None, 1e-5), {}, None) == 0  # contiguous: no copy
    assert backward((grad, transposed, [32]), {}, None) == 4 * x.numel()
    assert scratch_rules("cpu") != rules  # the CPU's own (measured) rules are separate


class _NormOverChannels(nn.Module):
    """A wav2vec2 feature-encoder layer's normalisation: layer norm over channels of a
    (batch, channels, frames) tensor, through a transpose."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


def test_cuda_trace_adds_the_contiguous_copy_at_the_layer_norm() -> None:
    """Closed form: with the copy the forward's peak is at the layer norm, where the input
    (kept), the output, mean and rstd and the input's contiguous copy are live; without it
    the peak is one block later, at the loss's scalar (one 512-byte block)."""
    batch, channels, frames = 2, 64, 100

    def peak(target: str) -> int:
        return simulate_model(
            lambda: _NormOverChannels(channels),
            lambda: torch.randn(batch, channels, frames, requires_grad=True),
            lambda m, x: m(x).sum(),
            setup=Setup(optimizer="sgd"),
            target=target,
        ).phase_peaks_bytes["forward"]

    # the CPU target measures its own kernels' scratch; compare with a CUDA trace without
    # the rule instead: the difference is the one copy
    from asrfit.memory.trace import scratch

    with_copy = peak("cuda")
    saved = dict(scratch.CUDA_SCRATCH)
    scratch.CUDA_SCRATCH.clear()
    try:
        without = peak("cuda")
    finally:
        scratch.CUDA_SCRATCH.update(saved)
    copy = 4 * batch * channels * frames  # a multiple of 512: no rounding
    assert with_copy - without == copy - 512


def test_softmax_with_its_input_by_keyword_still_runs_in_fp32() -> None:
    """``F.softmax(input=...)`` passes its wrapper unchanged (no positional input to look
    at) and reaches ``Tensor.softmax``, whose wrapper applies the policy, as CUDA autocast
    applies it to the aten op however Python called it."""
    x = torch.randn(2, 4, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16), device_kernels("cuda", mixed_precision=True):
        assert F.softmax(input=x, dim=-1).dtype == torch.float32
