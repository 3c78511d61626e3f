"""Replay across lengths (asrfit.memory.tape_lengths) against fresh traces of the same shape.

Two tapes at batches 2 and 4 of one length and one tape at batch 2 of another give the step
at batches 5 and 9 of the other length; the reference is
:func:`asrfit.memory.simulate.simulate_step` there, every memory figure equal and the kernel
rows' FLOPs and bytes as :func:`test_trace_tape._assert_same_step` compares them. Where a
trace at the other length would not be the single tape's log scaled, replay must refuse.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_depth_scaling import _adapter  # noqa: E402
from test_trace_tape import CASES, SETUPS, _assert_same_step, _masked, _trace  # noqa: E402

import asrfit.memory.trace.tracker as tracker_module  # noqa: E402
from asrfit.memory.setup import Setup  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.tape import Tape, replayed_step  # noqa: E402
from asrfit.memory.tape_lengths import replay_across  # noqa: E402
from asrfit.memory.trace.eventlog import Block  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _check(family: str, setup_name: str, pair_shape: tuple, other_shape: tuple) -> None:
    make, _, _ = CASES[family]
    adapter, setup = _adapter(make()), SETUPS[setup_name]
    _, two = _trace(adapter, BatchShape(2, *pair_shape), setup)
    _, four = _trace(adapter, BatchShape(4, *pair_shape), setup)
    _, other = _trace(adapter, BatchShape(2, *other_shape), setup)
    _assert_replays_as_traced(adapter, setup, (two, four), other, (5, 9), f"{family} {setup_name}")


def _assert_replays_as_traced(
    adapter: Any, setup: Setup, pair: tuple[Tape, Tape], other: Tape, batches: tuple, what: str
) -> None:
    """Each of ``batches`` at ``other``'s lengths, replayed from ``pair`` (at other lengths)
    and ``other``, is the step a fresh trace reports."""
    shape = (other.batch.input_length, other.batch.label_length)
    for batch in batches:
        traced, _ = _trace(adapter, BatchShape(batch, *shape), setup)
        tape = replay_across(*pair, other, batch)
        assert tape is not None, f"{what} at {batch} x {shape}: refused"
        _assert_same_step(replayed_step(tape, adapter.name, setup), traced)


# Parakeet-TDT among them: its sampled lattice holds a stand-in storage per anti-diagonal
# (asrfit.memory.trace.lattice), as many as the lengths have (test_a_transducer_lattice_...)
ACROSS = list(CASES)


@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize("family", ACROSS)
def test_a_longer_input_is_replayed_from_the_batch_rule_of_a_shorter_one(
    family: str, setup_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asrfit.memory.tape")
    _, length, labels = CASES[family]
    _check(family, setup_name, (length, labels), (2 * length, 2 * labels))


@pytest.mark.parametrize("family", ACROSS)
def test_a_shorter_input_and_fewer_labels_are_replayed_too(family: str) -> None:
    _, length, labels = CASES[family]
    _check(family, "fp16", (2 * length, 2 * labels), (length, max(1, labels // 2)))


@pytest.mark.parametrize("family", ["wav2vec2", "conformer_ctc"])
def test_fewer_labels_alone_are_replayed(family: str) -> None:
    """The planner's label pairs (asrfit.plan.label_buckets): the same input, a quarter of the
    labels."""
    _, length, labels = CASES[family]
    _check(family, "fp16", (length, labels), (length, max(1, labels // 4)))


def test_a_transducer_lattice_of_other_lengths_is_replayed() -> None:
    """The TDT loss's sampled lattice holds stand-in storages per anti-diagonal, as many as
    the lengths have: at twice the lengths, more of them than in the pair, and still replayed
    (each is the storage it repeats at the replayed batch, scaled by its diagonal's length over
    its representative's; compared with fresh traces in the tests above). The control: one
    stand-in counted as a storage of its own (its events then misalign) makes replay refuse."""
    two, four, other = _tapes("parakeet_tdt")
    assert len(other.log.stand_ins) > len(two.log.stand_ins) > 0
    assert replay_across(two, four, other, 5) is not None
    # as a trace worker hands it back (asrfit.plan.tapes.save_traced)
    back = Tape.from_dict(json.loads(json.dumps(other.to_dict())))
    assert back.log.stand_ins == other.log.stand_ins
    dropped = next(iter(other.log.stand_ins))
    stand_ins = {k: v for k, v in other.log.stand_ins.items() if k != dropped}
    odd = replace(other, log=replace(other.log, stand_ins=stand_ins))
    assert replay_across(two, four, odd, 5) is None


def _extent(batch: int, frames: int, dtype: torch.dtype = torch.bfloat16) -> Block:
    """A block holding the storage of a ``(batch, 8, frames, frames)`` tensor whose rows are
    padded to a multiple of 16 elements and that ends at its last row's last element: its
    bytes as PyTorch sizes that storage (``empty_strided``), independent of the rule."""
    padded = -(-frames // 16) * 16
    shape = (batch, 8, frames, frames)
    strides = (8 * frames * padded, frames * padded, padded, 1)
    nbytes = torch.empty_strided(shape, strides, dtype=dtype).untyped_storage().nbytes()
    op = "aten._scaled_dot_product_efficient_attention_backward.default"
    return Block(0, nbytes, "backward", 1, None, op, shape, str(dtype))


@pytest.mark.parametrize("frames", [(154, 307), (307, 154), (19, 37)])
def test_padded_rows_of_the_attention_bias_gradient_are_replayed(frames: tuple) -> None:
    """The memory-efficient attention's gradient for an attention bias (Parakeet's relative
    positions) pads each row of keys; FakeTensorMode may hold it as the strided extent that
    ends at the last row's last element (Parakeet-TDT-0.6B-v2 at 2,450 input frames: 3,143,654
    and 6,287,334 bytes at batches 2 and 4): affine in the batch, its intercept set by the
    padding. From the pair at one length and one batch at the other, each batch there is
    sized as PyTorch sizes that storage."""
    from asrfit.memory.tape_lengths import _padded_rows

    pair, other = frames
    x, y, z = _extent(2, pair), _extent(4, pair), _extent(2, other)
    for batch in (5, 9, 185):
        shape = [batch, 8, other, other]
        assert _padded_rows(x, y, z, shape) == _extent(batch, other).nbytes


def test_a_storage_of_unpadded_rows_or_another_layout_is_not_sized_by_the_padded_rule() -> None:
    """The control: where a storage is not that extent (the full padded buffer, one byte
    more, rows not padded), the rule answers None and replay refuses."""
    from asrfit.memory.tape_lengths import _padded_rows

    x, y, z = _extent(2, 154), _extent(4, 154), _extent(2, 307)
    full = replace(x, nbytes=2 * 8 * 154 * 160 * 2)
    assert _padded_rows(full, replace(y, nbytes=2 * full.nbytes), z, [5, 8, 307, 307]) is None
    assert _padded_rows(x, replace(y, nbytes=y.nbytes + 1), z, [5, 8, 307, 307]) is None
    assert _padded_rows(x, _extent(4, 160), z, [5, 8, 307, 307]) is None  # rows not padded


def test_a_pair_that_followed_other_values_at_its_smaller_batch_replays_above_it() -> None:
    """The TDT loss's lattice-sized float tensors (batch x frames x labels) are followed where
    at most 4,096 elements: here at batch 16 and not at 24 of the shorter lengths, so the
    pair's choices differ in number. Where the tape at the other length chose as the larger
    batch did (batch 8), batches from 8 up replay as fresh traces there (the reference);
    where it chose as the smaller did (batch 4), replay refuses."""
    make, length, labels = CASES["parakeet_tdt"]
    adapter, setup = _adapter(make()), SETUPS["fp16"]
    _, sixteen = _trace(adapter, BatchShape(16, length, labels), setup)
    _, twenty_four = _trace(adapter, BatchShape(24, length, labels), setup)
    assert len(sixteen.shadows) != len(twenty_four.shadows)
    longer = (2 * length, 2 * labels)
    _, eight = _trace(adapter, BatchShape(8, *longer), setup)
    _assert_replays_as_traced(
        adapter, setup, (sixteen, twenty_four), eight, (9, 40), "parakeet_tdt"
    )
    _, four = _trace(adapter, BatchShape(4, *longer), setup)
    assert replay_across(sixteen, twenty_four, four, 9) is None


def _tapes(family: str) -> tuple[Tape, Tape, Tape]:
    make, length, labels = CASES[family]
    adapter, setup = _adapter(make()), SETUPS["fp16"]
    return tuple(
        _trace(adapter, BatchShape(b, n * length, n * labels), setup)[1]
        for b, n in ((2, 1), (4, 1), (2, 2))
    )  # type: ignore[return-value]


def test_a_storage_neither_constant_nor_proportional_refuses() -> None:
    """The control: a storage whose size in the pair follows no rule (here: one byte more at
    batch 4) makes replay refuse, as it would make a trace at the other length differ."""
    two, four, other = _tapes("wav2vec2")
    assert replay_across(two, four, other, 9) is not None
    key, block = next(
        (k, b) for k, b in four.log.blocks.items() if b.nbytes > two.log.blocks[k].nbytes
    )
    blocks = {**four.log.blocks, key: replace(block, nbytes=block.nbytes + 1)}
    odd = replace(four, log=replace(four.log, blocks=blocks))
    assert replay_across(two, odd, other, 9) is None


def test_another_op_sequence_refuses() -> None:
    """The control: a tape at the other length whose allocations differ (one event dropped)
    is not replayed."""
    two, four, other = _tapes("whisper")
    events = other.log.events[:-1]
    assert (
        replay_across(two, four, replace(other, log=replace(other.log, events=events)), 9) is None
    )


def test_a_kernel_operand_neither_constant_nor_proportional_refuses() -> None:
    """The control: the operand bytes carry the batch rule of each kernel row; one that
    follows no rule makes replay refuse (the row's total alone could not tell)."""
    two, four, other = _tapes("conformer_ctc")
    assert replay_across(two, four, other, 9) is not None
    i = next(i for i, parts in enumerate(four.operands) if len(parts) >= 2 and parts[0])
    parts = list(four.operands[i])
    parts[0] += 1
    step, key, weight = four.calls[i]
    calls = list(four.calls)
    calls[i] = (step, (*key[:4], key[4] + 1, *key[5:]), weight)
    odd = replace(
        four, calls=calls, operands=[*four.operands[:i], tuple(parts), *four.operands[i + 1 :]]
    )
    assert replay_across(two, odd, other, 9) is None


def test_a_value_read_but_too_large_to_follow_at_the_other_length_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tracker follows a mask's values at both lengths' tapes, but past the size limit
    (2^27 booleans here) would not at the replayed batch of the longer one: a trace there
    takes the pessimistic rule, so replay refuses there and only there."""
    monkeypatch.setattr(tracker_module, "_MAX_LAZY_BYTES", 1 << 27)
    adapter = _masked(read=True)
    two, four, other = (
        _trace(adapter, BatchShape(b, length, 1), Setup())[1]
        for b, length in ((2, 12_000_000), (4, 12_000_000), (2, 24_000_000))
    )
    assert replay_across(two, four, other, 5) is not None  # 5 x 24 M booleans: followed
    assert replay_across(two, four, other, 6) is None  # 6 x 24 M: not
