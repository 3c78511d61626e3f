"""Companion traces (asrfit.plan.tapes.Tapes.companions): the coarse batch a length lacks for
its refinements to be replayed.

The tapes here stand in for traces (only their batch is read), and replay across lengths
(asrfit.memory.tape_lengths, compared with fresh traces in test_trace_tape_lengths.py) is
set to refuse, as it does for a transducer's lattice, or to succeed: which shapes are asked
for is what is checked, counted from the tapes kept.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import asrfit.plan.tapes as tapes_module
from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape
from asrfit.plan.tapes import Tapes

SETUP = Setup()
LENGTHS = {1: (16_000, 15), 2: (32_000, 30), 3: (64_000, 60), 4: (32_000, 7)}


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tapes_module, "replay_across", lambda *args: None)


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tapes_module, "replay_across", lambda *args: object())


def tapes_at(*shapes: tuple[int, int]) -> Tapes:
    """Tapes of ``SETUP``'s activation traces at ``(batch, length number)``."""
    tapes = Tapes("m", "cuda", (2, 4))
    for batch, length in shapes:
        tape = SimpleNamespace(batch=BatchShape(batch, *LENGTHS[length]))
        tapes.keep(SETUP, False, True, tape)  # type: ignore[arg-type]
    return tapes


def at(batch: int, length: int) -> BatchShape:
    return BatchShape(batch, *LENGTHS[length])


def test_a_length_with_one_tape_gets_the_other_coarse_batch(refused: None) -> None:
    tapes = tapes_at((2, 1), (2, 2), (4, 2), (4, 3))
    assert tapes.companions([at(32, 1)], SETUP) == [at(4, 1)]
    assert tapes.companions([at(32, 3)], SETUP) == [at(2, 3)]
    assert tapes.companions([at(32, 2)], SETUP) == []  # both coarse batches there already


def test_a_length_replayed_across_lengths_needs_no_companion(replayed: None) -> None:
    tapes = tapes_at((2, 1), (2, 2), (4, 2), (4, 3))
    assert tapes.companions([at(32, 1), at(9, 3)], SETUP) == []


def test_a_length_without_tapes_gets_the_largest_batch_once_replays_across_work(
    replayed: None,
) -> None:
    """The label pairs' shapes (the same input, fewer labels): no tape at their lengths. A
    batch of 4 there (the larger coarse batch, which chooses what values to follow as the
    pair's larger batch does) is replayed to theirs once replays across lengths have worked
    for the setup; before, tracing it would save nothing if they then refused."""
    tapes = tapes_at((2, 1), (2, 2), (4, 2))
    assert tapes.companions([at(32, 4)], SETUP) == []  # no replay across lengths yet
    assert tapes.companions([at(32, 1)], SETUP) == []  # replayed from length 2's pair
    assert tapes.companions([at(32, 4)], SETUP) == [at(4, 4)]
    assert tapes.companions([at(4, 4)], SETUP) == []  # the coarse batch itself is traced


def test_other_setups_tapes_are_not_counted(refused: None) -> None:
    tapes = tapes_at((2, 1), (4, 3))
    other = Setup(gradient_checkpointing=True)
    tapes.keep(other, False, True, SimpleNamespace(batch=at(4, 1)))  # type: ignore[arg-type]
    assert tapes.companions([at(32, 1)], SETUP) == [at(4, 1)]
    assert tapes.companions([at(32, 1)], other) == [at(2, 1)]


def test_a_reduced_models_tape_is_forgotten_once_the_setup_is_traced_whole(refused: None) -> None:
    """A setup's first trace may be a scaled step (tapes of its reduced models) that teaches
    the planner to trace it whole from then on (asrfit.memory.fit.depth.whole_cheaper). Its
    reduced tapes then replay nothing: at their lengths no companion is traced beside them
    (with one, the next whole trace would still lack a pair), and the whole model's tapes
    there are counted alone."""
    tapes = tapes_at((2, 2), (4, 2))
    row = (("encoder.layers:plain", 2),)
    tapes.keep(SETUP, False, True, SimpleNamespace(batch=at(2, 1)), row)  # type: ignore[arg-type]
    assert tapes.companions([at(32, 1)], SETUP) == [at(4, 1)]  # half a pair, as it looks
    tapes.forget_rows([(repr(Setup(gradient_checkpointing=True)), True, 9, 5)])
    assert tapes.companions([at(32, 1)], SETUP) == [at(4, 1)]  # another setup's lesson
    tapes.forget_rows([(repr(SETUP), True, 9, 5)])
    assert tapes.companions([at(32, 1)], SETUP) == []  # no tape left at length 1
    tapes.keep(SETUP, False, True, SimpleNamespace(batch=at(32, 1)))  # type: ignore[arg-type]
    assert tapes.batches(at(16, 1), SETUP) == [32]
    assert tapes.batches(at(16, 2), SETUP) == [2, 4]  # the whole model's tapes stay
