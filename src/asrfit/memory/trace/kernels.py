"""Kernels whose saved tensors differ between CPU and CUDA, run as the target device would.

The trace runs on fake CPU tensors, but scaled-dot-product attention picks a different
kernel per device, and the difference dominates activation memory at long sequences:

- On CPU in training (dropout > 0, or an arbitrary mask with some dtypes) PyTorch falls
  back to the *math* path, which keeps the ``(B, H, T, T)`` attention probabilities.
- On CUDA it picks FlashAttention-2 (fp16/bf16, no arbitrary mask, head dim <= 256) or the
  memory-efficient kernel (any float dtype, additive mask allowed), which keep only the
  output and a ``(B, H, T)`` log-sum-exp (padded to a multiple of 32 for the efficient
  kernel), and recompute attention in backward.

With ``target="cuda"``, :func:`device_kernels` replaces
``torch.nn.functional.scaled_dot_product_attention`` during the trace by a function that
makes the same choice PyTorch's CUDA dispatcher makes (flash, then memory-efficient, then
math) and calls that kernel's aten op; the ops' meta implementations give exact output
and saved-tensor shapes on fake CPU tensors, forward and backward. Under autocast the
inputs are cast to the autocast dtype first, as CUDA autocast does for attention.

Dropout differs the same way. ``aten::dropout`` on a CUDA tensor runs the fused
``native_dropout`` kernel (``is_fused_kernel_acceptable`` in PyTorch's
``aten/src/ATen/native/Dropout.cpp``), whose backward keeps a *boolean* mask, 1 byte per
element; on a CPU tensor it draws a noise tensor of the input's dtype (``bernoulli_``,
``div_``) and multiplies, and the multiplication keeps that noise for backward: 4 bytes per
element in fp32. Traced on fake CPU tensors for a GPU, every dropout of a training step
kept 3 bytes per element too many (wav2vec2-base, fp32, 16 s: 0.63 GiB per utterance
predicted, where 273 utterances ran in the 139.3 GiB of an H200, at most 0.51 GiB each;
docs/benchmarks.md). With
``target="cuda"`` the out-of-place ``torch.nn.functional.dropout`` calls ``native_dropout``;
in-place dropout (``dropout_``) takes the noise path on CUDA too and is left as it is.

Autocast differs too. The trace runs CPU autocast, whose lists leave layer norm, group
norm, softmax, ``exp``, ``pow``, ``sum`` and the like in bf16 / fp16; CUDA autocast runs
them in fp32 (``AT_FORALL_FP32`` and ``AT_FORALL_FP32_SET_OPT_DTYPE`` in PyTorch's
``aten/src/ATen/autocast_mode.h``), so their outputs, and what backward keeps of them, take
4 bytes an element instead of 2 (on an H200 a tiny wav2vec2's bf16 step peaked at 10.5 MiB
where the CPU-autocast trace said 4.6: its feature encoder's layer norms and their fp32
copies, from the allocator's history). With ``target="cuda"`` and mixed precision,
:data:`_FP32_CALLS` apply CUDA's fp32 policies to layer norm, group norm, softmax and
log-softmax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from asrfit.models.dropout import host_kernels

_ORIGINAL_SDPA = F.scaled_dot_product_attention
_ORIGINAL_DROPOUT = F.dropout
TARGETS = ("cuda", "cpu")


def _cuda_dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """``F.dropout`` as a CUDA tensor runs it: the fused kernel where ATen picks it."""
    if training and not inplace and 0.0 < p < 1.0 and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    return _ORIGINAL_DROPOUT(input, p, training, inplace)


_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOW_PRECISION:
        return value.float()
    return value


def _cuda_fp32(original: Any) -> Any:
    """``original`` under CUDA autocast's fp32 policy (``AT_FORALL_FP32``): while autocast
    is on, low-precision tensor arguments are cast to fp32 and the op runs with autocast
    off, as CUDA autocast redispatches below itself."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_autocast_enabled("cpu"):
            return original(*args, **kwargs)
        args, kwargs = tree_map(_to_fp32, args), tree_map(_to_fp32, kwargs)
        with torch.autocast("cpu", enabled=False):
            return original(*args, **kwargs)

    return run


def _cuda_fp32_dtype(original: Any, dtype_at: int) -> Any:
    """``original`` under CUDA autocast's fp32-set-optional-dtype policy
    (``AT_FORALL_FP32_SET_OPT_DTYPE``): without a ``dtype`` argument (keyword, or
    positional at ``dtype_at``) a low-precision input runs with ``dtype=float32``."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if (
            not torch.is_autocast_enabled("cpu")
            or kwargs.get("dtype") is not None
            or len(args) > dtype_at
            or not args  # the input by keyword: left as called
            or not (isinstance(args[0], torch.Tensor) and args[0].dtype in _LOW_PRECISION)
        ):
            return original(*args, **kwargs)
        with torch.autocast("cpu", enabled=False):
            return original(*args, **{**kwargs, "dtype": torch.float32})

    return run


# (owner, name, wrapper) of the calls through which models reach CUDA autocast's fp32 ops
# on their activations: layer and group norm, softmax and log-softmax. The other ops of
# those lists (exp, pow, sum, losses, ...) are left to CPU autocast.
_FP32_CALLS = (
    (F, "layer_norm", _cuda_fp32),
    (F, "group_norm", _cuda_fp32),
    (F, "softmax", lambda f: _cuda_fp32_dtype(f, 3)),
    (F, "log_softmax", lambda f: _cuda_fp32_dtype(f, 3)),
    (torch, "softmax", lambda f: _cuda_fp32_dtype(f, 2)),
    (torch, "log_softmax", lambda f: _cuda_fp32_dtype(f, 2)),
    (torch.Tensor, "softmax", lambda f: _cuda_fp32_dtype(f, 2)),
    (torch.Tensor, "log_softmax", lambda f: _cuda_fp32_dtype(f, 2)),
)


@contextlib.contextmanager
def _patched(calls: tuple) -> Iterator[None]:
    """In the block, ``owner.name = wrap(original)`` for each ``(owner, name, wrap)`` of
    ``calls``, restored after. Patched where Python looks them up, not by a function mode
    (which is off inside its own handler), so that a checkpointed forward recomputed inside
    ``backward()`` takes them too."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in calls]
    try:
        for (owner, name, wrap), (_, _, original) in zip(calls, originals, strict=True):
            setattr(owner, name, wrap(original))
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def _cuda_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) for t in (query, key, value))
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    head_dim = query.shape[-1]
    dims_ok = query.dim() == 4 and head_dim % 8 == 0
    if (
        attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and dims_ok
        and head_dim <= 256
    ):
        out = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )
        return out[0]
    if dims_ok:
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:
            # CUDA SDPA turns a boolean mask into an additive float mask of the same shape.
            bias = torch.zeros(bias.shape, dtype=query.dtype).masked_fill(~bias, float("-inf"))
        elif bias is not None and bias.dtype != query.dtype:
            bias = bias.to(query.dtype)
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        needs_grad = any(t.requires_grad for t in (query, key, value))
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale
        )
        return out[0]
    return _ORIGINAL_SDPA(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )


# the calls a CUDA target's trace replaces: attention and dropout as CUDA runs them
_CUDA_CALLS = (
    (F, "scaled_dot_product_attention", lambda _: _cuda_sdpa),
    (F, "dropout", lambda _: _cuda_dropout),
)


def _not_tracing(tensor: Any = None) -> bool:
    return False


@contextlib.contextmanager
def _mask_checks_use_values() -> Iterator[None]:
    """Let transformers inspect mask values during the trace.

    transformers skips building an SDPA attention mask when the padding mask is all ones,
    but treats any fake tensor as "tracing" and then always builds it. Masks carry real
    shadow values in the simulator, so the check can run as in a real step.
    """
    try:
        import transformers.masking_utils as masking
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield
        return
    original = getattr(masking, "is_tracing", None)
    if original is None:
        yield
        return
    masking.is_tracing = _not_tracing
    try:
        yield
    finally:
        masking.is_tracing = original


def _current_tracker() -> Any:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    from asrfit.memory.trace.tracker import StorageTracker

    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, StorageTracker):
            return mode
    return None


def _full_length_when_unknown(original: Any) -> Any:
    def compute_mask_indices(
        shape: Any,
        mask_prob: float,
        mask_length: int,
        attention_mask: Any = None,
        min_masks: int = 0,
    ) -> Any:
        tracker = _current_tracker()
        if (
            attention_mask is not None
            and tracker is not None
            and tracker.value_of(attention_mask) is None
        ):
            tracker.assume(
                "_compute_mask_indices",
                "SpecAugment spans drawn as if every utterance were full length (host-side "
                "numpy; the device mask has the same shape either way)",
            )
            attention_mask = None
        # The spans are drawn from NumPy's global generator: seeded here (and restored), so
        # that a trace, and the kernel bytes it counts where spans overlap, is the same every
        # time
        state = np.random.get_state()
        np.random.seed(0)
        try:
            return original(shape, mask_prob, mask_length, attention_mask, min_masks)
        finally:
            np.random.set_state(state)

    compute_mask_indices.asrfit_original = original  # type: ignore[attr-defined]
    return compute_mask_indices


@contextlib.contextmanager
def _spec_augment_spans_on_host() -> Iterator[None]:
    """Let wav2vec2-style SpecAugment draw its spans when the padding mask's values are unknown.

    ``_compute_mask_indices`` reads each utterance's length from the attention mask with
    ``.tolist()`` and draws the masked spans in NumPy. The tracker knows mask values only up
    to a size limit (large batches of raw audio exceed it); the values change where the spans
    fall, never the size of the boolean mask sent to the device, so full lengths are used.
    The spans are drawn with a fixed seed, so that a trace is the same every time.
    """
    import sys

    patched = []
    for name, module in list(sys.modules.items()):
        original = (
            getattr(module, "_compute_mask_indices", None)
            if name.startswith("transformers.models.")
            else None
        )
        if callable(original) and not hasattr(original, "asrfit_original"):
            module._compute_mask_indices = _full_length_when_unknown(original)  # type: ignore[attr-defined]
            patched.append((module, original))
    try:
        yield
    finally:
        for module, original in patched:
            module._compute_mask_indices = original  # type: ignore[attr-defined]


@contextlib.contextmanager
def device_kernels(target: str, mixed_precision: bool = False) -> Iterator[None]:
    """Run attention and dropout as ``target`` ("cuda" or "cpu") would, in the block; with
    ``mixed_precision`` on a CUDA target, autocast's fp32 ops too."""
    if target not in TARGETS:
        raise ValueError(f"target={target!r}: use one of {', '.join(TARGETS)}.")
    with _mask_checks_use_values(), _spec_augment_spans_on_host():
        if target == "cpu":
            yield
            return
        calls = _CUDA_CALLS + (_FP32_CALLS if mixed_precision else ())
        with _patched(calls), host_kernels(False):  # the GPU's kernels, not the CPU's
            yield


def sdpa_is_patched() -> Any:
    """Whether :func:`device_kernels` currently replaces SDPA (for tests)."""
    return F.scaled_dot_product_attention is _cuda_sdpa
