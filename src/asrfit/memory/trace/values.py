"""Shadow values: fake tensors whose real values the tracker knows, and where a trace stands.

Shared by :mod:`asrfit.memory.trace.tracker` (which keeps the values), :mod:`asrfit.memory.trace.datadep`
(which reads them in data-dependent ops) and :mod:`asrfit.memory.models.adapters` (which declares
the batch's lengths, masks and labels). It imports nothing else of asrfit, so those three
never import each other in a circle. Also what every dispatch mode of a trace needs first:
the tensors in an op's arguments, and the answer to a fake tensor's device query.
"""

from __future__ import annotations

import traceback
from typing import Any, Protocol

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

_LEAVES = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.layout)


class ValueTracker(Protocol):
    """What the data-dependent handlers need of :class:`~asrfit.memory.trace.tracker.StorageTracker`."""

    def set_value(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Declare the real value of a fake tensor."""

    def value_of(self, t: Any) -> Any:
        """The real value behind a fake tensor, ``None`` when unknown."""

    def assume(self, op: str, rule: str) -> None:
        """Record a pessimistic assumption."""

    def transient(self, nbytes: int, label: str) -> None:
        """Account a kernel-internal buffer that lives only during one op."""


def fake_with_value(tracker: ValueTracker, real: torch.Tensor) -> torch.Tensor:
    """A fake copy of ``real`` (made by the active ``FakeTensorMode``) whose value the tracker knows."""
    fake_mode = next(m for m in _get_current_dispatch_mode_stack() if isinstance(m, FakeTensorMode))
    fake = fake_mode.from_tensor(real)
    tracker.set_value(fake, real)
    return fake


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors in ``obj`` in ``tree_flatten`` order, without pytree's cost on plain containers.

    Tuples, lists and dicts (insertion order, as pytree flattens them) are walked here; any
    other container (named tuples, registered pytree nodes) goes through ``tree_flatten``.
    Called for every op of a trace (:mod:`asrfit.memory.trace.tracker`, :mod:`asrfit.memory.steptime.runtime`).
    """
    out: list[torch.Tensor] = []
    _collect(obj, out)
    return out


def _collect(obj: Any, out: list[torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return
    kind = type(obj)
    if kind is tuple or kind is list:
        for x in obj:
            _collect(x, out)
    elif kind is dict:
        for x in obj.values():
            _collect(x, out)
    elif not isinstance(obj, _LEAVES):
        out.extend(t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor))


PRIM_DEVICE = torch.ops.prim.device.default
# Answer ``prim.device`` in the outermost of asrfit's dispatch modes (False: pass it down the
# mode stack like any op, for tests that compare the two)
shortcut_device_queries = True


def device_query(func: Any, args: Any) -> torch.device | None:
    """A fake tensor's device, as ``FakeTensor`` answers ``prim.device``; None for other ops.

    Every ``tensor.device`` of a fake tensor is a ``prim.device`` op that travels through every
    dispatch mode of a trace, about 70 % of the ops a trace dispatches (wav2vec2-base: 5,316
    of 7,538), and none of them allocates or runs a kernel. Each of asrfit's modes answers
    it first, the way ``FakeTensor.__torch_dispatch__`` does, and the modes below are not
    asked.
    """
    if func is not PRIM_DEVICE or not shortcut_device_queries:
        return None
    t = args[0] if len(args) == 1 else None
    if not isinstance(t, FakeTensor):
        return None
    return torch.device("meta") if t.fake_mode.in_kernel_invocation else t.fake_device


def user_frame() -> str:
    """The innermost stack frame outside torch and asrfit, for error messages."""
    for frame in reversed(traceback.extract_stack(limit=40)):
        name = frame.filename
        if "/torch/" not in name and "/asrfit/memory/" not in name:
            return f"{name}:{frame.lineno} ({(frame.line or '').strip()})"
    return "<unknown>"


__all__ = ["ValueTracker", "device_query", "fake_with_value", "tensors_in", "user_frame"]
