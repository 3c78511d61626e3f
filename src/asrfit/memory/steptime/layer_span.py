"""The first encoder layer's forward pass, marked in a traced step's kernels.

Checkpointing the first ``k`` encoder layers (:mod:`asrfit.models.checkpointing`) runs each
one's forward pass again in backward, at the same shapes, up to the last op that saves a
tensor for backward: ``torch.utils.checkpoint`` (non-reentrant) stops the recompute as soon as
every tensor the layer saved is there again, before the op that saves the last of them runs
when it saves its inputs, after it when it saves its outputs (a pre-norm layer's last linear
and residual add are not run again). So the first layer's forward pass up to its last save, as
a trace without checkpointing sees it, is what any checkpointing (one layer, or every layer)
adds to a step at least; the planner bounds what checkpointing could gain with it
(:func:`asrfit.plan.checkpointing.recompute_bound`) instead of tracing it.

:class:`FirstLayerSpan` hooks the layer (its pre-hook runs inside the counter's module hook)
and, during its forward pass of the last step, autograd's saved-tensor hooks, which pass each
tensor through unchanged; it keeps the calls counted from the layer's start to its last save:
a :class:`~collections.Counter` of row keys, and, where the counter keeps every call in order,
their indexes (:attr:`asrfit.memory.tape.Tape.first_layer`).
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


class FirstLayerSpan:
    """Marks the first encoder layer's forward calls of step ``steps`` (a context manager).

    Args:
        model: The traced model; a model without an encoder layer stack marks nothing.
        counter: The trace's kernel counter.
        tracker: The trace's tracker (its ``phase`` and ``step``).
        steps: The step whose forward pass is marked (the last traced).
        enabled: False marks nothing: for a step that checkpoints layers, whose own
            saved-tensor hooks the marking's would replace inside the layer.
    """

    def __init__(
        self, model: nn.Module, counter: OpCounter, tracker: Any, steps: int, enabled: bool = True
    ) -> None:
        self.counter, self.tracker, self.steps = counter, tracker, steps
        self.counts: Counter | None = None
        self.calls: tuple[int, int] | None = None
        self._start: tuple[Counter, int | None] | None = None
        self._saved: tuple[Counter, int | None] | None = None  # where the last save was
        self._saves: Any = None  # autograd's saved-tensor hooks while the layer runs
        self._handles: list[Any] = []
        self._layer: nn.Module | None = None
        if enabled:
            with contextlib.suppress(ConfigError):  # no encoder layer stack: nothing marked
                self._layer = encoder_layers(model)[1][0]

    def _marking(self) -> bool:
        tracker = self.tracker
        return tracker.phase == "forward" and tracker.step == self.steps and self.counts is None

    def _where(self) -> tuple[Counter, int | None]:
        counts = Counter(self.counter.counts.get(self.steps, Counter()))
        calls = self.counter.calls
        return counts, None if calls is None else len(calls)

    def _enter(self, *_: Any) -> None:
        if self._marking() and self._start is None:
            self._start = self._where()
            self._saves = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            self._saves.__enter__()

    def _pack(self, tensor: Any) -> Any:
        self._saved = self._where()
        return tensor

    def _leave(self, *_: Any) -> None:
        if self._saves is not None:
            self._saves.__exit__(None, None, None)
            self._saves = None
        if self._marking() and self._start is not None and self._saved is not None:
            (before, first), (after, last) = self._start, self._saved
            self.counts = after - before
            self.calls = None if first is None or last is None else (first, last)

    def __enter__(self) -> FirstLayerSpan:
        if self._layer is not None:
            self._handles = [
                self._layer.register_forward_pre_hook(self._enter),
                self._layer.register_forward_hook(self._leave),
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saves is not None:  # the layer raised
            self._saves.__exit__(None, None, None)
            self._saves = None
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def cost(self) -> StepCost:
        """The marked calls' kernels (empty where nothing was marked)."""
        return StepCost() if self.counts is None else cost_of(self.counts)


def _unpack(tensor: Any) -> Any:
    return tensor
