"""CPU kernel memory that a fake-tensor trace cannot see, measured on this CPU once per shape.

A fake tensor has the size an op's *meta* function gives it and nothing else, so two kinds
of CPU memory escape a tensor-level trace:

1. **Scratch inside a kernel.** oneDNN (behind ``mkldnn_convolution``, RNNs, bf16 matmuls)
   reorders its operands into blocked layouts in temporary buffers, keeps per-thread
   buffers, converts dtypes; ATen kernels make ``.contiguous()`` copies of strided inputs.
   Which primitive runs depends on the instruction set (AVX2, AVX-512, AMX), the thread
   count and the layouts, so the same step has different scratch on different machines
   (a hubert fp32 step was 6.8 % under on one CPU and exact on another).
2. **Outputs whose meta size is wrong.** ``mkldnn_rnn_layer``'s meta returns a 0-byte
   workspace, while the real kernel returns the oneDNN RNN workspace (gate activations
   and states of every time step, saved for the backward pass).

For ``target="cpu"`` -- a prediction *for this CPU* -- the simulator therefore runs each of
the ops in :data:`MEASURED_OPS` once for real, on zero-filled tensors with the fake
arguments' sizes, strides and dtypes (integer arguments take the tracker's real shadow
values when known), under ``torch.profiler``'s allocator events, and caches the result per
``(op, sizes, strides, dtypes, scalar arguments, threads)``:

- *scratch* = the highest bytes the op holds at once beyond the bytes of its outputs; the
  tracker accounts it as a transient inside the op;
- each output whose real storage is larger than its fake one (the RNN workspace) has its
  traced block grown to the real size, so it stays live as long as the traced tensor.

This is the issue's fallback "measure on this machine once per (op, shapes, dtype) and
cache it" applied uniformly: it is exact for the kernels this CPU runs, whatever oneDNN
picks, at the cost of one real op per distinct shape (repeated layers hit the cache). The
list was chosen by measuring a wider set of candidates on the six diagnosis steps
(``bench/cases.py``, set memory-rules): scratch appeared in convolution (forward about
``max(in + w, out)``, backward up to twice its input for Conv2d: source and gradient reorders
to blocked layouts), ``mkldnn_rnn_layer`` (workspace and scratch), layer norm, CPU flash attention,
CTC backward, log-softmax, ``logsumexp`` and dimension reductions; none in fp32
``mm``/``addmm``/``bmm``, softmax, GLU or ``cumsum``, which are therefore not measured
(matmuls are, with 16-bit operands, where oneDNN may convert or pack). An op outside the
list that allocates scratch on another CPU is not seen.

A held-out wav2vec2-bert step (-1.76 %) showed what such a list misses: the
tracker sees an op whose CPU implementation is *composite* as one op. CPU SDPA's math path
(taken in training when the mask needs a gradient, as relative-position biases do) calls
``_safe_softmax``, which runs ``softmax``, then ``isneginf`` (a boolean copy of the scores)
and ``all`` inside the op. Measuring every op of held-out traces of six families once
then added ``_safe_softmax``, ``embedding_dense_backward`` (a (T, T, D) distance
embedding's backward holds a gradient-sized buffer), ``gather``/``scatter_add`` and batch
norm (forward and backward). And any *pointwise* op whose non-scalar inputs have different
dtypes is measured: on the CPU, TensorIterator makes a converted copy of each input whose
dtype is not the common dtype (a bf16 activation plus an fp32 tensor copies the activation
to fp32 first); CUDA converts inside the kernel. The measurement runs with the
thread count of the trace, which is the thread count of a training run in the process.
``torch.profiler`` costs about 40 ms per measurement (3 s for the first in a process).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._pytree import tree_flatten, tree_map

logger = logging.getLogger(__name__)
aten = torch.ops.aten

# Ops whose CPU kernels allocate memory beyond their outputs (or whose meta output size is wrong).
MEASURED_OPS = (
    aten.convolution.default,
    aten.convolution_backward.default,
    aten.mkldnn_rnn_layer.default,
    aten.mkldnn_rnn_layer_backward.default,
    aten.native_layer_norm.default,
    aten.native_layer_norm_backward.default,
    aten.native_group_norm.default,
    aten.native_group_norm_backward.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._ctc_loss.default,
    aten._ctc_loss.Tensor,
    aten._ctc_loss_backward.default,
    aten._ctc_loss_backward.Tensor,
    aten.mean.dim,
    aten.sum.dim_IntList,
    aten._log_softmax.default,
    aten._log_softmax_backward_data.default,
    aten.logsumexp.default,
    # Added after the held-out wav2vec2-bert step missed by -1.76 % (see below).
    aten._safe_softmax.default,
    aten.embedding_dense_backward.default,
    aten.gather.default,
    aten.scatter_add.default,
    aten.native_batch_norm.default,
    aten.native_batch_norm_backward.default,
)
# Matmuls: measured only with 16-bit operands (fp32 BLAS calls allocated nothing on the
# cases measured; oneDNN's bf16/fp16 paths may convert or pack operands).
MEASURED_16BIT_OPS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
_16BIT = (torch.bfloat16, torch.float16)
MEASURED_SET = frozenset((*MEASURED_OPS, *MEASURED_16BIT_OPS))

_CACHE: dict[tuple, tuple[int, tuple[int, ...]]] = {}


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype), x.storage_offset())
    if isinstance(x, (list, tuple)):
        return tuple(_describe(v) for v in x)
    if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(x)
    return x


def _real_copy(x: Any, tracker: Any) -> Any:
    if not isinstance(x, torch.Tensor):
        return x
    value = tracker.value_of(x) if isinstance(x, FakeTensor) else x
    if value is not None and not isinstance(value, FakeTensor) and value.shape == x.shape:
        return value.clone()
    nbytes = x.untyped_storage().nbytes()
    block_key = tracker._keys.get(x.untyped_storage()._cdata)
    if block_key is not None:  # a grown output (RNN workspace) keeps its real size
        nbytes = max(nbytes, tracker.log.blocks[block_key].nbytes)
    size = nbytes // max(1, x.element_size())
    base = torch.zeros(max(size, 1), dtype=x.dtype)
    return base.as_strided(tuple(x.shape), tuple(x.stride()), x.storage_offset())


def _measure(func: Any, args: tuple, kwargs: dict, tracker: Any) -> tuple[int, tuple[int, ...]]:
    """Run ``func`` for real: (bytes held at once beyond the outputs, each output's bytes)."""
    from torch.autograd import DeviceType

    with unset_fake_temporarily():
        rargs = tree_map(lambda x: _real_copy(x, tracker), args)
        rkwargs = tree_map(lambda x: _real_copy(x, tracker), kwargs)
        rkwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in rkwargs.items()}
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
            out = func(*rargs, **rkwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        out_sizes = tuple(t.untyped_storage().nbytes() for t in outs)
        seen: set[int] = set()
        out_bytes = 0
        for t in outs:
            ptr = t.untyped_storage().data_ptr()
            if ptr and ptr not in seen:
                seen.add(ptr)
                out_bytes += t.untyped_storage().nbytes()
        live = peak = 0
        events = sorted(
            (e.start_ns(), i, e.nbytes())
            for i, e in enumerate(prof.profiler.kineto_results.events())
            if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
        )
        for _, _, nbytes in events:
            live += nbytes
            peak = max(peak, live)
        del out, outs, rargs, rkwargs
    return max(0, peak - out_bytes), out_sizes


def _mixed_dtypes(args: tuple) -> bool:
    """Whether the non-scalar tensor inputs of an op have more than one dtype."""
    dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() > 0}
    return len(dtypes) > 1


class _Rules(dict):
    """``op -> rule``, plus a measuring rule for any pointwise op called with mixed dtypes.

    On the CPU, TensorIterator promotes each input whose dtype differs from the common dtype
    by making a converted copy (``TensorIteratorBase::compute_types``; CUDA converts inside
    the kernel instead): a bf16 activation added to an fp32 tensor is copied to fp32 first.
    """

    def __init__(self, rules: dict, pointwise_rule: Callable[[Any], Any]) -> None:
        super().__init__(rules)
        self._pointwise_rule = pointwise_rule
        self._pointwise: dict[Any, Any] = {}

    def get(self, func: Any, default: Any = None) -> Any:
        rule = dict.get(self, func)
        if rule is not None:
            return rule
        if torch.Tag.pointwise not in getattr(func, "tags", ()):
            return default
        found = self._pointwise.get(func)
        if found is None:
            found = self._pointwise[func] = self._pointwise_rule(func)
        return found


def measured_cpu_rules(tracker: Any) -> dict[Any, Callable[[tuple, dict, Any], int]]:
    """Scratch rules for ``target="cpu"`` that measure each op's kernel on this CPU (cached).

    Args:
        tracker: The :class:`~asrfit.memory.trace.tracker.StorageTracker` of the trace; outputs
            whose real size exceeds their fake size (the RNN workspace) are grown in its log.

    Returns:
        ``op -> rule(args, kwargs, out) -> scratch bytes`` (a dict whose ``get`` also answers
        for pointwise ops, measured when called with mixed input dtypes), for
        :data:`MEASURED_OPS`, :data:`MEASURED_16BIT_OPS` and mixed-dtype pointwise ops.
    """

    def rule_for(func: Any) -> Callable[[tuple, dict, Any], int]:
        def rule(args: tuple, kwargs: dict, out: Any) -> int:
            if func in MEASURED_16BIT_OPS and not any(
                isinstance(a, torch.Tensor) and a.dtype in _16BIT for a in args
            ):
                return 0
            if func not in MEASURED_SET and not _mixed_dtypes(args):
                return 0  # a pointwise op whose inputs share a dtype: no promotion copies
            key = (
                str(func),
                _describe(args),
                _describe(sorted(kwargs.items())),
                torch.get_num_threads(),
            )
            found = _CACHE.get(key)
            if found is None:
                try:
                    found = _measure(func, args, kwargs, tracker)
                except Exception as exc:  # a kernel that cannot run here adds nothing
                    logger.debug("could not measure %s on this CPU: %s", func, exc)
                    found = (0, ())
                _CACHE[key] = found
            scratch, real_sizes = found
            fakes = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            for fake, real_bytes in zip(fakes, real_sizes, strict=False):
                st = fake.untyped_storage()
                block_key = tracker._keys.get(st._cdata)
                if block_key is None:
                    continue
                block = tracker.log.blocks[block_key]
                if block.op is func and real_bytes > block.nbytes:
                    block.nbytes = real_bytes  # e.g. mkldnn_rnn_layer's oneDNN workspace
            return scratch

        return rule

    return _Rules({op: rule_for(op) for op in MEASURED_SET}, rule_for)
