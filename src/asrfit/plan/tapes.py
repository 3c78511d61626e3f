"""The tapes of a plan's traces, and the steps replayed from them instead of traced.

Traces of one setup at one input and label length differ only in sizes, each constant or
proportional to the batch: once two batches of a length are traced, any other batch there
is replayed from their tapes in milliseconds, exactly as a trace would report it
(:mod:`asrfit.memory.tape`); and so is any batch of another length with one tape, the batch
rule read from the two (:mod:`asrfit.memory.tape_lengths`). :class:`Tapes` keeps this run's
tapes (from its own traces and its trace workers'), replays what it can, and names the traces
that make a refinement replayable.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape, StepMemory
from asrfit.memory.tape import MIN_BATCH, Tape, replay, replayed_step
from asrfit.memory.tape_lengths import replay_across

_ACROSS_TRIES = 2  # other lengths with two tapes a replay across lengths tries, nearest first


class Tapes:
    """This run's tapes: ``(setup, lengths, phases) -> batch -> tape``.

    Args:
        model: The model's name (:attr:`StepMemory.model`).
        target: The traces' target ("cuda" or "cpu").
        coarse_batches: The batches the planner traces at each length first.
    """

    def __init__(self, model: str, target: str, coarse_batches: tuple[int, ...]) -> None:
        self.model, self.target, self.coarse_batches = model, target, coarse_batches
        self.enabled = True  # False: keep nothing, replay nothing
        self.replays = 0
        self._tapes: dict[tuple, dict[int, Tape]] = {}
        self._across_setups: set[str] = set()  # setups replayed across lengths at least once

    @staticmethod
    def _key(batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool):
        return (
            repr(setup),
            batch.input_length,
            batch.label_length,
            optimizer_step,
            forward_backward,
        )

    def keep(
        self,
        setup: Setup,
        optimizer_step: bool,
        forward_backward: bool,
        tape: Tape | None,
        row: Any = None,
    ) -> None:
        """Keep ``tape`` (a trace of ``setup``; None: the trace had none); ``row``: the
        reduced model it traced (:func:`asrfit.memory.fit.depth.scaled_step`), None: whole."""
        if tape is not None:
            key = self._key(tape.batch, setup, optimizer_step, forward_backward)
            self._store(key if row is None else (*key, row), tape)

    def forget_rows(self, traced_whole: list[tuple[str, bool, int, int]]) -> None:
        """Forget the reduced models' tapes of the setups now traced whole (the entries of
        :func:`asrfit.memory.fit.depth.whole_cheaper`): no step of theirs replays a reduced
        trace again, and beside a whole model's tape at the same lengths a reduced one would
        count as half a pair that replays nothing."""
        whole = {(setup, bool(forward_backward)) for setup, forward_backward, *_ in traced_whole}
        # a reduced model's key is :meth:`_key`'s five fields (setup first, forward_backward
        # last), then its row
        for key in [k for k in self._tapes if len(k) > 5 and (k[0], k[4]) in whole]:
            del self._tapes[key]

    def _store(self, key: tuple, tape: Tape) -> None:
        if self.enabled and tape.batch.batch_size >= MIN_BATCH:
            self._tapes.setdefault(key, {})[tape.batch.batch_size] = tape

    def batches(
        self,
        batch: BatchShape,
        setup: Setup,
        optimizer_step: bool = False,
        forward_backward: bool = True,
    ) -> list[int]:
        """Batches of ``batch``'s lengths with a tape (of the whole model, or of every reduced
        model of a scaled step), other than its own."""
        key = self._key(batch, setup, optimizer_step, forward_backward)
        return sorted(self._taped(key) - {batch.batch_size})

    def _taped(self, key: tuple) -> set[int]:
        """Batches with a tape under ``key`` (of every reduced model, for a scaled step)."""
        sets = [set(self._tapes[k]) for k in self._tapes if k[: len(key)] == key]
        return set.intersection(*sets) if sets else set()

    def replayable(
        self, batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool
    ) -> bool:
        """Whether ``batch`` has two tapes to be replayed from, or one and two at other
        lengths (replay may still refuse)."""
        others = self.batches(batch, setup, optimizer_step, forward_backward)
        key = self._key(batch, setup, optimizer_step, forward_backward)
        return (
            self.enabled
            and batch.batch_size >= MIN_BATCH
            and (len(others) >= 2 or (len(others) == 1 and bool(self._pairs(key))))
        )

    def replayed(
        self, batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool
    ) -> StepMemory | None:
        """``batch`` replayed from tapes of the whole model (two at its lengths, or one and
        two at other lengths: :mod:`asrfit.memory.tape_lengths`), or None."""
        key = self._key(batch, setup, optimizer_step, forward_backward)
        step = self._replayed(key, batch, setup)
        self.replays += step is not None
        return step

    def _replayed(
        self, key: tuple, batch: BatchShape, setup: Setup, detail: dict | None = None
    ) -> StepMemory | None:
        tapes = self._tapes.get(key, {})
        others = sorted(b for b in tapes if b != batch.batch_size)
        if not self.enabled or batch.batch_size < MIN_BATCH or not others:
            return None
        if len(others) >= 2:
            tape = replay(tapes[others[-2]], tapes[others[-1]], batch.batch_size)
        else:
            tape = self._across(key, tapes[others[0]], batch.batch_size)
        if tape is None:
            return None
        return replayed_step(tape, self.model, setup, self.target, detail)

    def _pairs(self, key: tuple) -> list[tuple]:
        """Keys of ``key``'s setup, phases and row at other lengths with two tapes or more,
        the nearest in input length first."""
        pairs = [
            k
            for k, tapes in self._tapes.items()
            if len(tapes) >= 2 and k[0] == key[0] and k[3:] == key[3:] and k[1:3] != key[1:3]
        ]
        return sorted(pairs, key=lambda k: (abs(k[1] - key[1]), abs(k[2] - key[2])))

    def _across(self, key: tuple, tape: Tape, batch_size: int) -> Tape | None:
        """``tape`` (the one at ``key``'s lengths) at ``batch_size``, the batch rule read
        from the nearest lengths with two tapes (:func:`replay_across`), or None."""
        for pair in self._pairs(key)[:_ACROSS_TRIES]:
            batches = sorted(self._tapes[pair])
            first, second = self._tapes[pair][batches[-2]], self._tapes[pair][batches[-1]]
            replayed = replay_across(first, second, tape, batch_size)
            if replayed is not None:
                self._across_setups.add(key[0])
                return replayed
        return None

    def _lacks(self, key: tuple, other: int) -> bool:
        """Whether the lengths of ``key`` (setup, lengths and phases, without a row) need
        their other coarse batch ``other`` traced for replays there: of the whole model or a
        reduced one, one tape there and no replay at ``other`` from it and tapes at other
        lengths."""
        keys = [k for k in self._tapes if k[: len(key)] == key]
        for k in keys:
            taped = self._tapes[k]
            if len(taped) == 1 and self._across(k, next(iter(taped.values())), other) is None:
                return True
        return not keys

    def rows(
        self, batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool
    ) -> Rows:
        """The reduced traces of a scaled step of ``batch``, replayed where they can be."""
        return Rows(self, batch, setup, self._key(batch, setup, optimizer_step, forward_backward))

    def companions(self, shapes: list[BatchShape], setup: Setup) -> list[BatchShape]:
        """Coarse shapes to trace first so that ``shapes`` (activation traces of ``setup``)
        can be replayed: at each of their lengths with exactly one tape, the other coarse
        batch, unless the step is replayed from it and tapes at other lengths
        (:mod:`asrfit.memory.tape_lengths`); with none, the largest coarse batch where such
        replays have worked for ``setup`` (else none: tracing two to replay the rest would
        save nothing)."""
        if not self.enabled:
            return []
        out: list[BatchShape] = []
        for s in shapes:
            companion = self._companion(s, setup)
            if companion is not None and companion != s and companion not in out:
                out.append(companion)
        return out

    def _companion(self, shape: BatchShape, setup: Setup) -> BatchShape | None:
        """:meth:`companions`' shape for ``shape``, or None."""
        taped = self.batches(shape, setup)
        largest = self.coarse_batches[-1]
        if not taped and shape.batch_size > largest and repr(setup) in self._across_setups:
            # lengths with no tape, where replays across lengths have worked for the setup:
            # its largest coarse batch, from which any larger batch there is replayed (where
            # a pair's smaller batch follows values its larger does not, as a TDT lattice's at
            # batch 2, a replay across lengths needs the larger's choices:
            # asrfit.memory.tape_lengths)
            return replace(shape, batch_size=largest)
        if shape.batch_size < MIN_BATCH or len(taped) != 1:
            return None
        if not self._lacks(self._key(shape, setup, False, True), shape.batch_size):
            return None  # replayed from tapes at other lengths
        other = next(b for b in self.coarse_batches if b not in taped)
        return replace(shape, batch_size=other)


class Rows:
    """The reduced traces of one scaled step, for :func:`asrfit.memory.fit.depth.scaled_step`:
    each replayed from its tapes where it can be, else traced and its tape kept.

    Attributes:
        kept: ``(row, tape)`` of each reduced trace traced here.
        replayed_rows: Reduced traces replayed.
    """

    def __init__(self, tapes: Tapes, batch: BatchShape, setup: Setup, key: tuple) -> None:
        self.tapes, self.batch, self.setup, self.key = tapes, batch, setup, key
        self.kept: list[tuple[Any, Tape]] = []
        self.replayed_rows = 0

    def replayed(self, row: Any, detail: dict) -> StepMemory | None:
        """The reduced trace ``row`` replayed (``detail`` filled as a trace fills it), or None."""
        step = self.tapes._replayed((*self.key, row), self.batch, self.setup, detail)
        self.replayed_rows += step is not None
        return step

    def keep(self, row: Any, tape: Tape) -> None:
        """Keep the tape of the reduced trace ``row``."""
        self.kept.append((row, tape))
        self.tapes._store((*self.key, row), tape)

    @property
    def all_replayed(self) -> bool:
        """Whether every reduced trace was replayed (the step is a replay, not a trace)."""
        return self.replayed_rows > 0 and not self.kept


#: What a trace worker hands back: the step, what it learned about tracing the setup whole
#: (:func:`asrfit.memory.fit.depth.whole_cheaper`), the trace's tapes, each with its row
#: (None: the whole model), and whether it replayed every reduced trace instead of tracing.
Traced = tuple[StepMemory, list, list[tuple[Any, Tape]], bool]


def save_traced(result: Traced, path: Path) -> None:
    """Write a trace worker's result as JSON (:func:`asrfit.plan.parallel.map_forked`)."""
    step, learned, tapes, replayed = result
    data = {
        "step": step.to_dict(),
        "whole_cheaper": learned,
        "tapes": [[row, tape.to_dict()] for row, tape in tapes],
        "replayed": replayed,
    }
    path.write_text(json.dumps(data), encoding="utf-8")


def load_traced(path: Path) -> Traced:
    """Read :func:`save_traced`'s file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    tapes = [(_row(row), Tape.from_dict(tape)) for row, tape in data["tapes"]]
    step = StepMemory.from_dict(data["step"], where=str(path))
    return step, data["whole_cheaper"], tapes, data["replayed"]


def _row(data: Any) -> Any:
    """A row read back from JSON: ``((stack, layers), ...), built at reduced depth``."""
    if data is None:
        return None
    counts, reduced = data
    return tuple((name, count) for name, count in counts), bool(reduced)
