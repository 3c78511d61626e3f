"""Each encoder layer's forward pass, marked in a traced step: what checkpointing it costs
and frees.

Checkpointing the first ``k`` encoder layers (:mod:`asrfit.models.checkpointing`) runs each
one's forward pass again in backward, at the same shapes, up to the last op that saves a
tensor for backward: ``torch.utils.checkpoint`` (non-reentrant) stops the recompute as soon as
every tensor the layer saved is there again, before the op that saves the last of them runs
when it saves its inputs, after it when it saves its outputs (a pre-norm layer's last linear
and residual add are not run again). And it frees at most what the layer's forward pass
leaves live: the storages allocated inside it and not freed by its end (its saved tensors, and
its output, which the next layer keeps). So a trace without checkpointing, with each layer's
forward pass marked, bounds any checkpointing from its own figures; the planner uses that
instead of tracing setups that cannot win (:func:`asrfit.plan.checkpointing.recompute_bound`).

:class:`LayerSpans` hooks every encoder layer (its pre-hook runs inside the counter's module
hook) and, during each layer's forward pass of the last step, autograd's saved-tensor hooks,
which pass each tensor through unchanged. Per layer it keeps the calls counted from the
layer's start to its last save (a :class:`~collections.Counter` of row keys, and, where the
counter keeps every call in order, their indexes) and the tracker's event indexes at the
layer's start and end (:attr:`asrfit.memory.tape.Tape.layers`, :func:`left_live_bytes`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import torch
from torch import nn

from asrfit.errors import ConfigError
from asrfit.memory.steptime.roofline import StepCost
from asrfit.memory.steptime.runtime import OpCounter, cost_of
from asrfit.models.checkpointing import encoder_layers

#: One layer's marks: ``(first call, call after its last save, first event, event at its end)``.
Span = tuple[int, int, int, int]


class LayerSpans:
    """Marks each encoder layer's forward pass in step ``steps`` (a context manager).

    Args:
        model: The traced model; a model without an encoder layer stack marks nothing.
        counter: The trace's kernel counter.
        tracker: The trace's tracker (its ``phase``, ``step`` and ``log``).
        steps: The step whose forward pass is marked (the last traced).
        enabled: False marks nothing: for a step that checkpoints layers, whose own
            saved-tensor hooks the marking's would replace inside the layer.
    """

    def __init__(
        self, model: nn.Module, counter: OpCounter, tracker: Any, steps: int, enabled: bool = True
    ) -> None:
        self.counter, self.tracker, self.steps = counter, tracker, steps
        self._layers: list[nn.Module] = []
        if enabled:
            with contextlib.suppress(ConfigError):  # no encoder layer stack: nothing marked
                self._layers = list(encoder_layers(model)[1])
        # layer -> (its counts, its calls' indexes or None, its events' indexes)
        self._marks: dict[int, tuple[Counter, tuple[int, int] | None, tuple[int, int]]] = {}
        self._start: tuple[int, Counter, int | None, int] | None = None
        self._saved: tuple[Counter, int | None] | None = None  # where the last save was
        self._saves: Any = None  # autograd's saved-tensor hooks while a layer runs
        self._handles: list[Any] = []

    def _marking(self) -> bool:
        tracker = self.tracker
        return tracker.phase == "forward" and tracker.step == self.steps

    def _where(self) -> tuple[Counter, int | None]:
        counts = Counter(self.counter.counts.get(self.steps, Counter()))
        calls = self.counter.calls
        return counts, None if calls is None else len(calls)

    def _enter(self, index: int) -> None:
        if self._marking() and self._start is None and index not in self._marks:
            self._start = (index, *self._where(), len(self.tracker.log.events))
            self._saved = None
            self._saves = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            self._saves.__enter__()

    def _pack(self, tensor: Any) -> Any:
        self._saved = self._where()
        return tensor

    def _leave(self, index: int) -> None:
        if self._start is None or self._start[0] != index:
            return
        self._close()
        (_, before, first, event), saved = self._start, self._saved
        self._start = None
        if saved is None:  # the layer saved nothing: nothing to run again
            return
        after, last = saved
        calls = None if first is None or last is None else (first, last)
        self._marks[index] = (after - before, calls, (event, len(self.tracker.log.events)))

    def _close(self) -> None:
        if self._saves is not None:
            self._saves.__exit__(None, None, None)
            self._saves = None

    def __enter__(self) -> LayerSpans:
        for i, layer in enumerate(self._layers):
            self._handles += [
                layer.register_forward_pre_hook(lambda *_, i=i: self._enter(i)),
                layer.register_forward_hook(lambda *_, i=i: self._leave(i)),
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()  # a layer raised
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def complete(self) -> bool:
        """Whether every encoder layer was marked (else the marks are not reported)."""
        return bool(self._layers) and len(self._marks) == len(self._layers)

    def costs(self) -> list[StepCost]:
        """Each layer's recomputed kernels, in layer order (empty unless :meth:`complete`)."""
        if not self.complete():
            return []
        return [cost_of(self._marks[i][0]) for i in range(len(self._layers))]

    def events(self) -> list[tuple[int, int]]:
        """Each layer's first event and the event at its end (empty unless complete)."""
        return [self._marks[i][2] for i in range(len(self._layers))] if self.complete() else []

    def spans(self) -> list[Span]:
        """Each layer's :data:`Span` (empty unless complete and the counter kept its calls)."""
        marks = [self._marks[i] for i in range(len(self._layers))] if self.complete() else []
        if any(m[1] is None for m in marks):
            return []
        return [(*m[1], *m[2]) for m in marks]  # type: ignore[misc]


def left_live_bytes(log: Any, first: int, end: int, rounded: Any) -> int:
    """Bytes (each storage ``rounded``) allocated at ``log.events[first:end]`` and not freed
    before the next allocation from ``end`` on: what a layer's forward pass leaves live.

    Frees between two allocations come in an order a tape may sort
    (:class:`~asrfit.memory.tape.Tape`), so the end is taken at the next allocation, where
    every one of them has happened; counted from the same events, a trace and its tape agree.
    """
    events = log.events
    stop = next((i for i in range(end, len(events)) if events[i][1] > 0), len(events))
    live = {key for key, sign in events[first:end] if sign > 0}
    for key, sign in events[first:stop]:
        if sign < 0:
            live.discard(key)
    return sum(rounded(log.blocks[key].nbytes) for key in live)


def _unpack(tensor: Any) -> Any:
    return tensor
