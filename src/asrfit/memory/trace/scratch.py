"""Kernel-internal scratch memory: CPU convolutions (oneDNN) for ``target="cpu"`` traces,
and CUDA layer norm's contiguous copy for ``target="cuda"`` (:data:`CUDA_SCRATCH`).

The simulator measures each CPU kernel's scratch on this CPU instead
(:mod:`asrfit.memory.trace.cpu_kernels`; :func:`scratch_rules` with a tracker); the rules below
remain for ``scratch_rules("cpu")`` without a tracker. On held-out shapes they missed by up
to -11 % (a Conformer's Conv2d subsampling backward holds about twice its input, not
``in + out``).

A fake-tensor trace sees every tensor an op returns, but not the buffers a kernel
allocates and frees inside itself. On CPU, PyTorch runs convolutions through oneDNN,
which reorders its inputs into blocked layouts in temporary buffers. For the small
models of ``bench/memory_accuracy.py`` those buffers were most of the gap between the
simulated peak and the allocator-level peak (up to a third of it for fp32 wav2vec2).

The rules below are measured, not derived: ``bench/cpu_conv_scratch.py`` runs single
convolutions (1-D and 2-D, strided, grouped, depthwise, one input channel; fp32 and
bf16) under ``torch.profiler`` and reports the bytes live inside the op beyond its
inputs and outputs, beside these rules (PyTorch 2.13 CPU, oneDNN). With ``in``, ``out``
and ``w`` the bytes of the input, output and weight:

========================  =======================================================
op                        scratch beyond the op's outputs
========================  =======================================================
convolution (forward)     ``max(in + w, out)``: source and weight reorders, or the
                          destination reorder when the output is the larger
convolution_backward      ``in + out``; for a 1-D depthwise convolution, which oneDNN
                          runs without reorders, ``out`` when the input needs a
                          gradient, else 0; for a grouped, non-depthwise
                          convolution ``w + (threads - 1) x (in + out + k w)`` with
                          ``k`` = 8 (fp32) or 12 (16-bit): per-thread buffers, fitted
                          on 1 and 2 threads
both, strided inputs      plus a ``.contiguous()`` copy of each non-contiguous input
========================  =======================================================

The backward rules are the coarser ones: within about 25 % of the measured scratch for
single standard convolutions (16-bit ones alone can reach twice ``in + out``, yet the
bf16 autocast steps of the accuracy grid match ``in + out``), and the grouped rule
depends on the thread count. These convolution rules apply only to ``target="cpu"``. CUDA
convolution workspaces are a different thing and are not added: PyTorch moves to another
cuDNN algorithm when the workspace does not fit, so near the memory limit they shrink
(``docs/memory_cuda.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

ScratchRule = Callable[[tuple, dict, Any], int]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _copy_unless_contiguous(*tensors: torch.Tensor) -> int:
    """Bytes of the ``.contiguous()`` copies a CPU kernel makes of strided inputs."""
    return sum(_nbytes(t) for t in tensors if not t.is_contiguous())


def _conv_forward(args: tuple, kwargs: dict, out: Any) -> int:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    x, w = args[0], args[1]
    return _copy_unless_contiguous(x) + max(_nbytes(x) + _nbytes(w), _nbytes(out))


def _conv_backward(args: tuple, kwargs: dict, out: Any) -> int:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    grad_out, x, w = args[0], args[1], args[2]
    groups = int(args[9]) if len(args) > 9 else int(kwargs.get("groups", 1))
    depthwise = groups > 1 and groups == x.shape[1]
    copies = _copy_unless_contiguous(grad_out, x)
    if depthwise and x.dim() == 3:  # no reorders; a buffer for the input gradient only
        mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True))
        return copies + (_nbytes(grad_out) if mask[0] else 0)
    if groups > 1 and not depthwise:
        # Grouped: one weight-gradient buffer, plus per extra thread the input, the output
        # gradient and several weights' worth (fit: 8x fp32, 12x 16-bit; 1 and 2 threads).
        per_thread = (
            _nbytes(x) + _nbytes(grad_out) + (8 if x.element_size() >= 4 else 12) * _nbytes(w)
        )
        return copies + _nbytes(w) + (torch.get_num_threads() - 1) * per_thread
    return copies + _nbytes(x) + _nbytes(grad_out)


CPU_SCRATCH: dict[Any, ScratchRule] = {
    aten.convolution.default: _conv_forward,
    aten.convolution_backward.default: _conv_backward,
}


def _layer_norm_copies(args: tuple, kwargs: dict, out: Any) -> int:
    # native_layer_norm(input, ...) / native_layer_norm_backward(grad_out, input, ...)
    return _copy_unless_contiguous(*(a for a in args[:2] if isinstance(a, torch.Tensor)))


# CUDA kernels that copy strided inputs: ``layer_norm_cuda`` and its backward take
# ``expect_contiguous()`` of their input (and of the output gradient) before the kernel,
# a copy live beside the outputs (aten/src/ATen/native/cuda/layer_norm_kernel.cu). A
# wav2vec2 feature encoder normalises each convolution's output transposed; on an H200
# the allocator's history of a tiny wav2vec2's step (fp32, 1 x 1 s) held that copy at the
# peak, 0.39 of the 0.39 MiB the trace had missed (docs/benchmarks.md).
CUDA_SCRATCH: dict[Any, ScratchRule] = {
    aten.native_layer_norm.default: _layer_norm_copies,
    aten.native_layer_norm_backward.default: _layer_norm_copies,
}


def scratch_rules(target: str, tracker: Any = None) -> dict[Any, ScratchRule]:
    """The scratch rules for ``target``.

    For ``"cpu"`` with a tracker: each CPU kernel's scratch measured on this CPU
    (:func:`asrfit.memory.trace.cpu_kernels.measured_cpu_rules`); for ``"cpu"`` without one: the
    convolution rules above; for ``"cuda"``: :data:`CUDA_SCRATCH` (no convolution
    workspaces, see above).
    """
    if target != "cpu":
        return dict(CUDA_SCRATCH)
    if tracker is not None:
        from asrfit.memory.trace.cpu_kernels import measured_cpu_rules

        return measured_cpu_rules(tracker)
    return dict(CPU_SCRATCH)
