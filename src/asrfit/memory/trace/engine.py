"""Make a traced backward pass accumulate gradients as a plain (mode-free) step does.

When two or more gradients flow into the same tensor, PyTorch's autograd engine sums them
in that tensor's input buffer (``InputBuffer::accumulate`` in
``torch/csrc/autograd/input_buffer.cpp``). In a plain step it adds **in place**,
``old.add_(new)``, when ``old`` (the contribution that arrived first) is non-overlapping and
dense and the buffer holds the last reference to it *and to its storage*; otherwise it
adds ``old + new`` out of place, even in a plain step. The storage test fails for a
gradient that arrives as a view: autograd's view metadata keeps the view's base alive, so
the storage has two owners. That is the common case for a weight used twice: ``F.linear``
differentiates through ``weight.t()``, whose backward (``TBackward0``) hands the engine a
transposed view of the matmul's result. A tied embedding (Whisper's ``proj_out``,
Speech2Text's ``lm_head``, any model whose ``_tied_weights_keys`` is set) is summed that
way, so a plain step holds three vocabulary-by-width tensors at once. The in-place branch
is skipped too when ``at::isTensorSubclassLike`` is true, and that function returns true
for every tensor while *any* ``TorchDispatchMode`` is active
(``c10::impl::dispatch_mode_enabled()``) and for every fake tensor (Python dispatch key). The simulator traces under such a mode, so each
accumulation there is ``old + new``: one more storage live until ``old`` is dropped. A
real Parakeet-TDT step, whose loss sends many gradients into the same logits, peaks 6.5 %
higher under a pass-through mode than without one (``bench/_truth.py``).

:func:`plain_accumulation` restores the plain behaviour in the trace. It hooks every node
of the backward graph: a node's post-hook marks "the engine is now filling input buffers",
the next node's pre-hook clears it. An ``aten.add.Tensor`` seen in that window is an
input-buffer accumulation. After the backward pass, each such add whose first operand
is a dense tensor of the output's size and not a view, dropped before the next
allocation (the buffer held its last reference, as the in-place branch requires), is
rewritten in the event log as in-place: the output takes over the operand's storage, so
the new allocation and the operand's free cancel. The engine never writes into the second
operand of a dense sum, so neither does the rewrite.

:func:`plain_composites` does the same for composite ATen code that makes the same test
(CPU attention's math path adding its mask, ``gather``'s backward); see the comment above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode

from asrfit.memory.trace.values import device_query

_ADD = torch.ops.aten.add.Tensor


def _graph_nodes(roots: list[Any]) -> list[Any]:
    seen: dict[int, Any] = {}
    stack = [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return list(seen.values())


class _AccumulationWatcher(TorchDispatchMode):
    """Records input-buffer accumulations (adds made by the engine between nodes)."""

    def __init__(self, tracker: Any) -> None:
        super().__init__()
        self.tracker = tracker
        self.between_nodes = False
        self.candidates: list[tuple[int, int | None, int | None, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        device = device_query(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if (
            func is _ADD
            and self.between_nodes
            and not kwargs
            and len(args) == 2
            and all(isinstance(a, torch.Tensor) for a in args)
        ):
            # A view's base keeps its storage alive: the engine's last-reference test fails.
            self._record(None if args[0]._is_view() else args[0], None, out)
        return out

    def _key(self, t: torch.Tensor) -> int | None:
        return self.tracker._keys.get(t.untyped_storage()._cdata)

    def _record(self, old: torch.Tensor, new: Any, out: torch.Tensor) -> None:
        out_key = self._key(out)
        if out_key is None:
            return
        keys: list[int | None] = []
        for t in (old, new):
            if not isinstance(t, torch.Tensor):
                keys.append(None)
                continue
            dense = (
                t.shape == out.shape
                and t.dtype == out.dtype
                and is_non_overlapping_and_dense_or_false(t)
                and t.storage_offset() == 0
                and t.untyped_storage().nbytes() == out.untyped_storage().nbytes()
            )
            keys.append(self._key(t) if dense else None)
        index = len(self.tracker.log.events) - 1  # the output's allocation event
        self.candidates.append((out_key, keys[0], keys[1], index))


def _is_workspace(log: Any, key: int) -> bool:
    tag = log.blocks[key].tag
    return tag is not None and tag.startswith("workspace:")


def _merge(log: Any, candidates: list[tuple[int, int | None, int | None, int]]) -> int:
    """Rewrite accumulations as in place in ``log``; returns how many were rewritten."""
    events = log.events
    drop: set[int] = set()
    replace: dict[int, tuple[int, int]] = {}
    merged = 0
    # Where each block is allocated (looked up, not taken from the recorded index: an earlier
    # rewrite, or a kernel workspace accounted after the output, moves it).
    allocated_at = {key: i for i, (key, sign) in enumerate(events) if sign > 0}
    for out_key, old_key, new_key, _ in candidates:
        index = allocated_at.get(out_key)
        if index is None:
            continue
        for operand in (old_key, new_key):
            if operand is None:
                continue
            # The operand must die before anything else is allocated (last reference); a
            # kernel's workspace (allocated and freed inside the op) does not count.
            free_at = None
            for j in range(index + 1, len(events)):
                key, sign = events[j]
                if _is_workspace(log, key):
                    continue
                if sign > 0:
                    break
                if key == operand:
                    free_at = j
                    break
            if free_at is None or free_at in drop:
                continue
            # In place: the output reuses the operand's storage. Drop the output's
            # allocation and the operand's free; the output's later free frees the bytes.
            drop.update((index, free_at))
            if log.blocks[out_key].tag is None:
                log.blocks[out_key].tag = log.blocks[operand].tag
            replace[index] = (operand, out_key)
            log.merged[out_key] = operand
            merged += 1
            break
    if drop:
        log.events[:] = [e for i, e in enumerate(events) if i not in drop]
    return merged


@contextlib.contextmanager
def plain_accumulation(tracker: Any, roots: list[torch.Tensor]) -> Iterator[None]:
    """Trace the backward pass of ``roots`` with a plain step's in-place gradient accumulation.

    Args:
        tracker: The active :class:`~asrfit.memory.trace.tracker.StorageTracker`.
        roots: The tensors ``backward()`` is called on (their ``grad_fn`` graphs are hooked).
    """
    watcher = _AccumulationWatcher(tracker)
    handles = []

    def pre(*_: Any) -> None:
        watcher.between_nodes = False

    def post(*_: Any) -> None:
        watcher.between_nodes = True

    for node in _graph_nodes([getattr(r, "grad_fn", None) for r in roots]):
        try:
            handles.append(node.register_prehook(pre))
            handles.append(node.register_hook(post))
        except (AttributeError, RuntimeError):  # a node type without hooks
            continue
    try:
        with watcher:
            yield
    finally:
        for h in handles:
            h.remove()
    _merge(tracker.log, watcher.candidates)


# -- composite code that runs in place only outside a dispatch mode ----------------------------
#
# The same ``at::isTensorSubclassLike`` test picks out-of-place variants inside some composite
# ATen code (``areAnyTensorSubclassLike``), so the trace allocates where a plain step writes in
# place. Two sites matter for speech models: the math path of CPU scaled-dot-product attention
# (``aten/src/ATen/native/transformers/attention.cpp``: ``attn.add_(attn_mask)``, else
# ``attn = attn.add(attn_mask)``), taken in training when the mask needs a gradient (relative
# position biases), and ``gather``'s backward (``torch/csrc/autograd/FunctionsManual.cpp``,
# ``gather_backward``: ``result.scatter_add_``, else ``result.scatter_add``), used by
# disentangled attention (SEW-D). :func:`plain_composites` rewrites them as in place, with the
# same last-reference test as the accumulation rewrite above.

_SCATTER_ADD = torch.ops.aten.scatter_add.default
_ZEROS = (torch.ops.aten.new_zeros.default, torch.ops.aten.zeros.default)


class _CompositeWatcher(_AccumulationWatcher):
    """Records the out-of-place ops of the composite sites above."""

    def __init__(self, tracker: Any) -> None:
        super().__init__(tracker)
        self.in_sdpa = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        device = device_query(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not args or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
            return out
        if func is _ADD and self.in_sdpa and len(args) == 2 and not kwargs:
            self._record(args[0], None, out)
        elif func is _SCATTER_ADD:
            key = self._key(args[0])
            if key is not None and self.tracker.log.blocks[key].op in _ZEROS:
                self._record(args[0], None, out)
        return out


@contextlib.contextmanager
def plain_composites(tracker: Any) -> Iterator[None]:
    """Trace a step with the in-place variants a plain step's composite ATen code takes.

    Args:
        tracker: The active :class:`~asrfit.memory.trace.tracker.StorageTracker`.
    """
    import torch.nn.functional as F

    watcher = _CompositeWatcher(tracker)
    sdpa = F.scaled_dot_product_attention

    def counted_sdpa(*args: Any, **kwargs: Any) -> Any:
        watcher.in_sdpa += 1
        try:
            return sdpa(*args, **kwargs)
        finally:
            watcher.in_sdpa -= 1

    F.scaled_dot_product_attention = counted_sdpa
    try:
        with watcher:
            yield
    finally:
        F.scaled_dot_product_attention = sdpa
    _merge(tracker.log, watcher.candidates)
