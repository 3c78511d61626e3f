"""Large shadow values kept as the op that makes them, computed again when read.

The tracker (:mod:`asrfit.memory.trace.tracker`) follows the values of integer and boolean
tensors so that data-dependent ops see true lengths and masks. A value past the size it
holds whole (a frame mask repeated over a model's hidden size: 185 x 305 x 1280 booleans)
is kept as a :class:`LazyValue` instead: the op and its inputs' values, run again only when
a rule reads the value, and dropped after. What stays resident is the inputs' values, which
the trace holds anyway.

A recipe stands for the value its op had when it ran, so writes after it must not leak in:

- An input held as a real tensor is watched through the writes to its storage, which the
  tracker counts as it runs in-place ops on the shadows (:class:`Writes`).
- A recipe written in place through a fake tensor that holds it is marked written (and so is
  the recipe it is a view of, which the write reaches too).

A recipe that sees either no longer knows its value: reading it gives None, and the rules
for unknown values apply, as they did for every value of that size before. The tensor written
in place itself gets its written value computed and held whole, whatever its size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._pytree import tree_map

from asrfit.memory.trace.values import tensors_in

_CPU = torch.device("cpu")


def returns_alias(func: Any) -> bool:
    """Whether an op's output is a view of an input (``Tensor(a)`` returns: view, expand)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


class Writes:
    """Writes counted per real storage, made by the tracker's in-place shadow evaluations.

    They run inside a dispatch mode, below autograd: PyTorch neither counts them in version
    counters nor links the views they make to their bases, so the tracker counts them
    itself, per storage (which a view shares with its base).
    """

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}

    def count(self, t: torch.Tensor) -> int:
        """Writes to ``t``'s storage so far."""
        return self._counts.get(t.untyped_storage()._cdata, 0)

    def bump(self, t: torch.Tensor) -> None:
        """Count a write to ``t``'s storage."""
        key = t.untyped_storage()._cdata
        self._counts[key] = self._counts.get(key, 0) + 1


class LazyValue:
    """The value of output ``index`` of ``func(*args, **kwargs)``, computed when read.

    ``args`` and ``kwargs`` hold the inputs' values: real tensors, other :class:`LazyValue`,
    plain Python values. ``choice``: the tracker's record of the choice to follow this value
    (:attr:`asrfit.memory.trace.tracker.StorageTracker.shadow_sizes`), None when not kept.
    """

    __slots__ = (
        "_args",
        "_func",
        "_index",
        "_kwargs",
        "_watch",
        "_writes",
        "bases",
        "choice",
        "live",
        "written",
    )

    def __init__(
        self, func: Any, args: tuple, kwargs: dict, index: int, choice: int | None, writes: Writes
    ) -> None:
        self._func, self._args, self._kwargs, self._index = func, args, kwargs, index
        self.choice, self._writes = choice, writes
        self.written = False
        reals = tensors_in((args, kwargs))
        lazies = _lazy_leaves((args, kwargs))
        through = [t for x in lazies for t in x.live]
        if returns_alias(func):
            # a view: computed from its bases as they are when read, as a real view would
            # read them; a write through it reaches them (mark_written)
            self.bases: list[Any] = reals + lazies
            self.live = reals + through
            self._watch: list[tuple[torch.Tensor, int]] = []
        else:
            # a snapshot: the real tensors it reads, directly or through views, must not move
            self.bases, self.live = [], []
            self._watch = [(t, writes.count(t)) for t in reals + through]

    def value(self) -> torch.Tensor | None:
        """The value, computed now; None where a write since has made it unknowable."""
        if self.written or any(self._writes.count(t) != n for t, n in self._watch):
            return None
        known = True

        def real(x: Any) -> Any:
            nonlocal known
            if isinstance(x, LazyValue):
                v = x.value()
                if v is None:
                    known = False
                return v
            return x

        args, kwargs = tree_map(real, self._args), tree_map(real, self._kwargs)
        if not known:
            return None
        kwargs = {k: (_CPU if k == "device" else v) for k, v in kwargs.items()}
        with unset_fake_temporarily():
            try:
                out = self._func(*args, **kwargs)
            except Exception:  # as the tracker's own evaluation: best effort, never sizes
                return None
        return tensors_in(out)[self._index]

    def mark_written(self) -> None:
        """A write through this value: it and the recipes it is a view of are unknown from now
        on; the real tensors it views, which the write reached, count it (:class:`Writes`)."""
        lazy_bases = [b for b in self.bases if isinstance(b, LazyValue)]
        for base in self.bases:
            if not isinstance(base, LazyValue):
                self._writes.bump(base)
        for base in lazy_bases:
            base.mark_written()
        # a view of real tensors alone stays known: read again, it reads them as written
        self.written = self.written or bool(lazy_bases) or not self.bases


def _lazy_leaves(obj: Any) -> list[LazyValue]:
    found: list[LazyValue] = []

    def visit(x: Any) -> Any:
        if isinstance(x, LazyValue):
            found.append(x)
        return x

    tree_map(visit, obj)
    return found


__all__ = ["LazyValue", "Writes", "returns_alias"]
