"""Values past the size the tracker holds whole, kept as recipes: checked against real tensors.

The reference is the same code run on real tensors: boolean indexing's output size is the
mask's count of True, so a trace that reads a stale or invented value gets a size the real
run does not. Every test sets the size held whole to a few hundred bytes, so that masks of a
few kilobytes take the recipe path (:mod:`asrfit.memory.trace.lazy`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import asrfit.memory.trace.tracker as tracker_module
from asrfit.memory.trace.lazy import LazyValue
from asrfit.memory.trace.tracker import StorageTracker
from asrfit.memory.trace.values import fake_with_value

LENGTHS = [50, 31, 7, 0]
FRAMES, HIDDEN = 50, 16  # a repeated mask of 4 x 50 x 16 booleans: 3,200 bytes


@pytest.fixture
def small_held_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Masks of 200 booleans are held whole; the repeated masks (3,200) become recipes."""
    monkeypatch.setattr(tracker_module, "_MAX_SHADOW_BYTES", 1000)


def _frame_mask(lengths: torch.Tensor) -> torch.Tensor:
    return torch.arange(FRAMES)[None, :] < lengths[:, None]


def _run(step: Callable[[torch.Tensor], list[torch.Tensor]], fake: bool):
    """``step(lengths)``'s outputs' shapes, on real tensors or traced (then with the tracker)."""
    lengths = torch.tensor(LENGTHS)
    if not fake:
        return [tuple(t.shape) for t in step(lengths)], None
    tracker = StorageTracker()
    with FakeTensorMode(), tracker:
        outs = step(fake_with_value(tracker, lengths))
        return [tuple(t.shape) for t in outs], tracker


def _repeated_then_read(lengths: torch.Tensor) -> list[torch.Tensor]:
    """wav2vec2's encoder: the frame mask repeated over the hidden size picks frames."""
    mask = _frame_mask(lengths).unsqueeze(-1).repeat(1, 1, HIDDEN)
    x = torch.randn(len(LENGTHS), FRAMES, HIDDEN)
    return [x[mask], x[~mask]]


def test_a_mask_past_the_held_size_is_read_exactly(small_held_size: None) -> None:
    expected, _ = _run(_repeated_then_read, fake=False)
    traced, tracker = _run(_repeated_then_read, fake=True)
    assert traced == expected
    assert tracker.assumptions == []


def test_the_recipe_is_kept_not_its_value(small_held_size: None) -> None:
    tracker, lengths = StorageTracker(), torch.tensor(LENGTHS)
    with FakeTensorMode(), tracker:
        mask = _frame_mask(fake_with_value(tracker, lengths))
        repeated = mask.unsqueeze(-1).repeat(1, 1, HIDDEN)
        held, kept = tracker._values[mask], tracker._values[repeated]
    assert isinstance(held, torch.Tensor)  # 200 booleans
    assert isinstance(kept, LazyValue)  # 3,200 booleans
    real = _frame_mask(torch.tensor(LENGTHS)).unsqueeze(-1).repeat(1, 1, HIDDEN)
    assert torch.equal(kept.value(), real)


def test_past_the_limit_for_recipes_the_mask_is_unknown(
    small_held_size: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control: with recipes capped at the size held whole, the repeated mask is not
    followed, and indexing by it takes the pessimistic rule (every element selected)."""
    monkeypatch.setattr(tracker_module, "_MAX_LAZY_BYTES", 1000)
    traced, tracker = _run(_repeated_then_read, fake=True)
    assert traced == [(len(LENGTHS) * FRAMES * HIDDEN,)] * 2
    assert {a.op for a in tracker.assumptions} == {"boolean indexing"}


def _written_after(lengths: torch.Tensor) -> list[torch.Tensor]:
    """The mask written in place after the repeated mask was made from it."""
    mask = _frame_mask(lengths)
    repeated = mask.unsqueeze(-1).repeat(1, 1, HIDDEN)
    mask.logical_not_()
    x = torch.randn(len(LENGTHS), FRAMES, HIDDEN)
    return [x[repeated], x[mask]]


def test_a_write_after_the_recipe_does_not_leak_into_it(small_held_size: None) -> None:
    """The recipe stands for the mask before the write: it reads the real result, or, where it
    can no longer know it, the pessimistic rule; never the mask after the write."""
    expected, _ = _run(_written_after, fake=False)
    traced, tracker = _run(_written_after, fake=True)
    stale = sum(FRAMES - n for n in LENGTHS) * HIDDEN  # the repeated count after the write
    assert traced[0] != (stale,)
    assert traced[0] in (expected[0], (len(LENGTHS) * FRAMES * HIDDEN,))
    assert traced[1] == expected[1]  # the mask itself, held whole, is written in step


def _viewed_then_written(lengths: torch.Tensor) -> list[torch.Tensor]:
    """A view of a held mask (expanded over the hidden size: past the held size) read after
    the mask is written: a view reads its base as it is."""
    mask = _frame_mask(lengths)
    expanded = mask.unsqueeze(-1).expand(-1, -1, HIDDEN)
    mask.logical_not_()
    x = torch.randn(len(LENGTHS), FRAMES, HIDDEN)
    return [x[expanded]]


def test_a_view_reads_its_base_after_a_write(small_held_size: None) -> None:
    expected, _ = _run(_viewed_then_written, fake=False)
    traced, tracker = _run(_viewed_then_written, fake=True)
    assert traced == expected
    assert tracker.assumptions == []


def _written_through_a_view(lengths: torch.Tensor) -> list[torch.Tensor]:
    """A write into one utterance of a recipe's value: the base sees it as real tensors do."""
    repeated = _frame_mask(lengths).unsqueeze(-1).repeat(1, 1, HIDDEN)
    first = repeated[0]
    first.fill_(False)
    x = torch.randn(len(LENGTHS), FRAMES, HIDDEN)
    return [x[repeated], x[0][first]]


def test_a_write_through_a_view_reaches_the_recipe(small_held_size: None) -> None:
    expected, _ = _run(_written_through_a_view, fake=False)
    traced, _ = _run(_written_through_a_view, fake=True)
    stale = sum(LENGTHS) * HIDDEN  # the count before the write
    assert traced[0] != (stale,)
    assert traced[0] in (expected[0], (len(LENGTHS) * FRAMES * HIDDEN,))
    assert traced[1] == expected[1]
