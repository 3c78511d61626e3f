"""Trace a transducer loss's loop over its lattice's anti-diagonals at a few of them.

transformers' TDT loss (``transformers.loss.loss_tdt.tdt_loss``) fills its ``(frames x
labels)`` lattice one anti-diagonal ``n = t + u`` at a time, in a Python loop of
``T + U - 2`` iterations that each run the same few dozen small ops on tensors of the
diagonal's length ``d_n``. On fake tensors every op costs the same whatever its size, so
a Parakeet-TDT trace spent about three quarters of its time in that loop and its backward.
What the loop leaves behind is simple:

- **memory**: each iteration keeps the tensors autograd saves for its backward (the stacked
  candidates, the log-sum-exp, the gather indices, the masks), every one of them ``d_n``
  elements long; they are freed when the backward pass reaches that iteration. The big
  lattice-sized tensors (log-probabilities, the ``log_alpha`` lattice, the gradients into
  them) are made outside the loop, or are transients of one backward op.
- **kernels**: each iteration runs the same op sequence, its bytes affine in ``d_n``.

:class:`LatticeSampler` therefore runs the loss's own code with its diagonal loop
(``range`` in that module) replaced by a few representative diagonals: the first
``max(durations) + 1`` diagonals (where arcs longer than ``n`` do not exist yet, so fewer ops
run) are traced one by one, the others split into :data:`GROUPS` consecutive groups, each
traced at the diagonal whose length is closest to the group's mean. Then

- every kernel the representative runs, in forward and in backward (found by the autograd
  node it runs in: its sequence number lies in the iteration's range; the engine's
  gradient accumulations count with the node just run), counts for the group's ``m``
  diagonals (:attr:`asrfit.memory.steptime.runtime.OpCounter.weight`);
- every storage the representative still holds when the loss returns (what autograd saved)
  is repeated for each other diagonal ``n`` of its group, scaled by ``d_n / d_rep``: stand-in
  blocks in the tracker's event log, allocated where the representative ended; in backward
  those of the later diagonals are freed when the pass reaches the representative, those of
  the earlier ones when it has left it.

So the saved bytes and their block sizes are those of the whole loop, the kernel rows those
of every diagonal (exact where a row's bytes are affine in ``d_n``), and the transients
those of one diagonal (every diagonal makes the same lattice-sized ones in backward). Only
the order of allocations and frees within one group differs. ``tests/test_lattice.py`` compares
the sampled trace with the full one. Where the loss's source no longer has the loop this
relies on, the loss is traced whole.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from asrfit.memory.trace.tracker import StorageTracker

GROUPS = 6  # representative diagonals per loss call
_LOOP = "for n in range(1, max_t + max_u - 1):"
_LOSS_MODULE = "transformers.loss.loss_tdt"


@dataclass
class _Group:
    first_seq: int  # autograd sequence numbers of the representative's nodes: [first, end)
    end_seq: int
    weight: int  # diagonals the group stands for
    earlier: list[int]  # d_n of the group's diagonals before the representative
    later: list[int]  # ... and after it
    rep_length: int
    events: tuple[int, int]  # the representative's slice of the tracker's event log
    # stand-in block keys of the diagonals after / before the representative: the backward
    # pass frees the first when it reaches the representative, the second when it leaves it
    later_keys: list[int] = field(default_factory=list)
    earlier_keys: list[int] = field(default_factory=list)


def diagonal_length(n: int, frames: int, labels: int) -> int:
    """Cells ``(t, u)`` with ``t + u = n`` in a ``frames x labels`` lattice."""
    return min(n + 1, labels) - max(0, n - frames + 1)


def _groups(frames: int, labels: int, groups: int, head: int) -> list[tuple[int, list[int]]]:
    """``(representative n, the group's diagonals)`` for the loop ``range(1, frames + labels - 1)``.

    The first ``head`` diagonals are their own groups: there some arcs (a duration longer
    than ``n``) do not exist yet, so their iterations run fewer ops than the others.
    """
    ns = list(builtins.range(1, frames + labels - 1))
    out = [(n, [n]) for n in ns[:head]]
    ns = ns[head:]
    size = -(-len(ns) // groups) if ns else 1
    for i in builtins.range(0, len(ns), size):
        group = ns[i : i + size]
        lengths = [diagonal_length(n, frames, labels) for n in group]
        mean = sum(lengths) / len(lengths)
        rep = min(group, key=lambda n: (abs(diagonal_length(n, frames, labels) - mean), n))
        out.append((rep, group))
    return out


def _loop_module() -> Any:
    """transformers' TDT loss module when its source has the loop this samples, else None."""
    module = sys.modules.get(_LOSS_MODULE)
    return module if module is not None and _has_loop(module) else None


@functools.lru_cache(maxsize=4)
def _has_loop(module: Any) -> bool:
    try:
        source = inspect.getsource(module.tdt_loss)
    except (AttributeError, OSError, TypeError):
        return False
    return source.count(_LOOP) == 1 and len(re.findall(r"(?<![\w.])range\(", source)) == 1


class LatticeSampler:
    """Sample the TDT loss's diagonal loop of one traced step (see the module docstring).

    Args:
        tracker: The simulator's tracker (stand-in blocks go into its event log).
        groups: Representative diagonals per loss call.
    """

    def __init__(self, tracker: StorageTracker, groups: int = GROUPS) -> None:
        self.tracker = tracker
        self.groups = groups
        self._forward_weight = 1
        self._seq: int | None = None  # the last autograd node seen in backward
        self._active: list[_Group] = []  # groups whose stand-ins are live
        self._ranges: list[_Group] = []  # every group traced (for backward weights)
        self.diagonals_traced = 0  # anti-diagonals of the last loss call traced ...
        self.diagonals_total = 0  # ... and in its lattice

    # -- the loop --------------------------------------------------------------
    def _diagonals(self, frames: int, labels: int, head: int, pending: list[_Group]) -> Callable:
        def sampled_range(*args: int) -> Iterator[int]:
            if args != (1, frames + labels - 1):  # not the loop this samples: run it whole
                yield from builtins.range(*args)
                return
            for rep, group in _groups(frames, labels, self.groups, head):
                first, start = torch._C._autograd._get_sequence_nr(), len(self.tracker.log.events)
                self._forward_weight = len(group)
                yield rep
                self._forward_weight = 1
                lengths = {n: diagonal_length(n, frames, labels) for n in group}
                pending.append(
                    _Group(
                        first,
                        torch._C._autograd._get_sequence_nr(),
                        len(group),
                        [lengths[n] for n in group if n < rep],
                        [lengths[n] for n in group if n > rep],
                        lengths[rep],
                        (start, len(self.tracker.log.events)),
                    )
                )
                self.diagonals_traced += 1
                self.diagonals_total += len(group)

        return sampled_range

    def loss(self, real: Callable) -> Callable:
        """``real`` (the model's ``loss_function``) with its diagonal loop sampled."""

        @functools.wraps(real)
        def sampled(*args: Any, **kwargs: Any) -> Any:
            module = _loop_module()
            logits = kwargs.get("token_logits", args[0] if args else None)
            if module is None or not isinstance(logits, torch.Tensor) or logits.dim() != 4:
                return real(*args, **kwargs)
            pending: list[_Group] = []
            self.diagonals_traced = self.diagonals_total = 0  # of this call
            head = max(kwargs.get("durations") or [0]) + 1
            module.range = self._diagonals(logits.shape[1], logits.shape[2], head, pending)
            try:
                out = real(*args, **kwargs)
            finally:
                del module.range
            # The loss has returned: what the representatives still hold was saved for
            # backward. Stand-ins go in where each representative ended (latest first, so
            # the earlier positions stay valid).
            for group in reversed(pending):
                self._stand_ins(group)
            self._active.extend(pending)
            self._ranges.extend(pending)
            return out

        return sampled

    def note(self) -> str | None:
        """What was sampled, for a step's ``assumptions`` (None when nothing was)."""
        if self.diagonals_total <= self.diagonals_traced:
            return None
        return (
            f"lattice: traced {self.diagonals_traced} of the TDT loss's "
            f"{self.diagonals_total} anti-diagonals, the others counted from them"
        )

    def _stand_ins(self, group: _Group) -> None:
        start, end = group.events
        events, blocks = self.tracker.log.events, self.tracker.log.blocks
        saved = {key for key, sign in events[start:end] if sign > 0}
        saved -= {key for key, sign in events[start:] if sign < 0}
        for lengths, keys in ((group.earlier, group.earlier_keys), (group.later, group.later_keys)):
            for d in lengths:
                for key in sorted(saved):
                    held = self.tracker.hold(blocks[key], (d, group.rep_length), at=end)
                    if held is not None:
                        keys.append(held)

    # -- the counter's weight ----------------------------------------------------
    def weight(self) -> int:
        """Diagonals the kernel now running stands for (1 outside the sampled iterations)."""
        if self._forward_weight != 1 or not self._ranges:
            return self._forward_weight
        node = torch._C._current_autograd_node()
        if node is not None:
            self._seq = node._sequence_nr()
        # no node: the engine adds a gradient into an input buffer after the node that made it
        seq = self._seq
        if seq is None:  # before the first node
            return 1
        for group in reversed(self._active):  # latest first, as the backward pass meets them
            if seq < group.end_seq:
                self._free(group.later_keys)  # those diagonals ran backward before this one
            if seq < group.first_seq:
                self._free(group.earlier_keys)
        while self._active and not (self._active[-1].later_keys or self._active[-1].earlier_keys):
            self._active.pop()
        for group in self._ranges:
            if group.first_seq <= seq < group.end_seq:
                return group.weight
        return 1

    def _free(self, keys: list[int]) -> None:
        for key in keys:
            self.tracker.drop(key)
        keys.clear()

    def release(self) -> None:
        """Free every stand-in still live (call when the backward pass is over)."""
        for group in self._active:
            self._free(group.later_keys)
            self._free(group.earlier_keys)
        self._active.clear()
        self._ranges.clear()
        self._seq = None


def sample_transducer_loop(
    model: torch.nn.Module, tracker: StorageTracker
) -> LatticeSampler | None:
    """Install a :class:`LatticeSampler` on a traced TDT model; None for other models."""
    module = _loop_module()
    if module is None:
        return None
    # the model's loss without reading ``loss_function`` (a property that warns when a
    # model has no loss type): an instance override, else the mapping entry of its type
    mapping = getattr(sys.modules.get("transformers.loss.loss_utils"), "LOSS_MAPPING", {})
    current = vars(model).get("_loss_function") or mapping.get(getattr(model, "loss_type", None))
    if current is None or current is not getattr(module, "ParakeetForTDTLoss", None):
        return None
    sampler = LatticeSampler(tracker)
    model.loss_function = sampler.loss(current)
    return sampler


__all__ = ["GROUPS", "LatticeSampler", "diagonal_length", "sample_transducer_loop"]
