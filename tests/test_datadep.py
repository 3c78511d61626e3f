"""Boolean indexing on fake tensors is sized by the mask's count, checked against real indexing.

The reference is the same indexing run on real tensors (``x[mask]`` and ``x[mask] = 0``);
masks are the kinds models build: padding masks from lengths (then repeated over the
hidden size, as wav2vec2's encoder does), all-False, a scattered pattern.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.trace import datadep
from asrfit.memory.trace.tracker import StorageTracker
from asrfit.memory.trace.values import fake_with_value
from tests.test_plan import _tiny_config


def _padding_mask(lengths: list[int], frames: int, hidden: int) -> torch.Tensor:
    mask = torch.arange(frames)[None, :] < torch.tensor(lengths)[:, None]
    return mask.unsqueeze(-1).repeat(1, 1, hidden)  # (B, F, D), as wav2vec2's encoder makes


MASKS = {
    "padding, small": _padding_mask([7, 5, 2], 8, 4),
    "padding, counted": _padding_mask([500, 420, 77, 1], 500, 48),  # 96,000 > 65,536 elements
    "padding inverted, counted": ~_padding_mask([500, 420, 77, 1], 500, 48),
    "all false, counted": torch.zeros(3, 300, 100, dtype=torch.bool),
    "scattered, counted": torch.arange(4 * 130 * 130).reshape(4, 130, 130) % 7 == 3,
    "one dim, counted": torch.arange(70_000) % 3 == 0,
}


def _traced(mask: torch.Tensor, known: bool) -> tuple[torch.Size, torch.Size, StorageTracker]:
    tracker = StorageTracker()
    with FakeTensorMode(), tracker:
        # unknown: a random draw, whose value the tracker never shadows
        fake_mask = fake_with_value(tracker, mask) if known else torch.rand(mask.shape) > 0.5
        x = torch.randn(*mask.shape, 3)
        read = x[fake_mask]
        x[fake_mask] = 0.0  # index_put_ with a boolean mask
        return read.shape, x.shape, tracker


@pytest.mark.parametrize("name", sorted(MASKS))
def test_known_mask_sizes_equal_real_indexing(name: str) -> None:
    mask = MASKS[name]
    real = torch.randn(*mask.shape, 3)
    expected = real[mask].shape
    real[mask] = 0.0
    read, written, tracker = _traced(mask, known=True)
    assert read == expected
    assert written == real.shape
    assert tracker.assumptions == []


def test_unknown_mask_selects_everything_and_says_so() -> None:
    mask = _padding_mask([500, 3], 500, 80)
    read, _, tracker = _traced(mask, known=False)
    assert read == torch.Size([mask.numel(), 3])
    assert {a.op for a in tracker.assumptions} == {"boolean indexing"}


def test_large_masks_are_counted_not_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No real ``nonzero`` on a counted or unknown mask (it cost seconds and GBs at batch 500)."""
    real_calls: list[tuple[int, ...]] = []
    original = torch.Tensor.nonzero

    def spy(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        real_calls.append(tuple(self.shape))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "nonzero", spy)
    _traced(MASKS["padding, counted"], known=True)
    _traced(MASKS["padding, counted"], known=False)
    assert real_calls == []
    _traced(MASKS["padding, small"], known=True)  # small known masks keep their positions
    assert real_calls == [tuple(MASKS["padding, small"].shape)] * 2  # the read and the write


def test_counted_masks_give_the_same_step_as_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole wav2vec2 step (its encoder zeroes padded frames through a (B, F, D) mask)."""
    cfg = _tiny_config()  # the planner tests' tiny wav2vec2-CTC
    shape = BatchShape(4, 32000, 40)  # mask (4, 1599, 64): 409,344 elements
    setup = Setup(optimizer="adamw")
    counted = simulate_step(hf_adapter(cfg), shape, setup, steps=1)
    monkeypatch.setattr(datadep, "_MAX_VALUED_MASK_NUMEL", 1 << 40)  # positions everywhere
    positions = simulate_step(hf_adapter(cfg), shape, setup, steps=1)
    assert counted.peak_bytes == positions.peak_bytes
    assert counted.breakdown_bytes == positions.breakdown_bytes
    assert counted.phase_peaks_bytes == positions.phase_peaks_bytes
    assert counted.assumptions == positions.assumptions


def test_mask_from_lengths_inside_the_trace_is_exact() -> None:
    """Lengths known, the mask built inside the trace (shadow values), then counted."""
    lengths = [300, 211, 5]
    tracker, real_lengths = StorageTracker(), torch.tensor(lengths)
    with FakeTensorMode(), tracker:
        fake_lengths = fake_with_value(tracker, real_lengths)
        mask = torch.arange(300)[None, :] < fake_lengths[:, None]
        mask = mask.unsqueeze(-1).repeat(1, 1, 96)  # 86,400 elements: counted
        read = torch.randn(3, 300, 96)[mask]
    assert read.shape == torch.Size([sum(lengths) * 96])
    assert tracker.assumptions == []


def _real_mask_alive_after_trace(monkeypatch: pytest.MonkeyPatch) -> bool:
    """Trace one step with the collector off, the fake input tensors kept alive as a
    reference cycle keeps them (autograd graph, module hooks); is the real padded input mask
    behind the fake one still alive?"""
    import gc
    import weakref

    from asrfit.memory.models import adapters

    made: list[weakref.ref] = []
    kept: list[torch.Tensor] = []
    real_mask, real_fake = adapters.padded_attention_mask, adapters.fake_with_value

    def recorded(batch: int, length: int) -> torch.Tensor:
        mask = real_mask(batch, length)
        made.append(weakref.ref(mask))
        return mask

    def keeping(tracker: StorageTracker, real: torch.Tensor) -> torch.Tensor:
        kept.append(real_fake(tracker, real))
        return kept[-1]

    monkeypatch.setattr(adapters, "padded_attention_mask", recorded)
    monkeypatch.setattr(adapters, "fake_with_value", keeping)
    gc.collect()
    gc.disable()
    try:
        simulate_step(hf_adapter(_tiny_config()), BatchShape(4, 32000, 40), Setup(), steps=1)
        return any(r() is not None for r in made)
    finally:
        kept.clear()
        gc.enable()
        gc.collect()


def test_real_shadow_values_are_freed_when_the_trace_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace's fake tensors sit in reference cycles that only the cyclic collector frees;
    the real values behind them (a planner trace's padded mask: 800 MB at 512 x 195,968
    samples) must not wait for it. Control: without the release, the mask outlives the trace."""
    assert not _real_mask_alive_after_trace(monkeypatch)
    monkeypatch.setattr(StorageTracker, "release_values", lambda self: None)
    assert _real_mask_alive_after_trace(monkeypatch)
