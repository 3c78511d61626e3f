"""Replay across lengths (asrfit.memory.tape_lengths) against fresh traces of the same shape.

Two tapes at batches 2 and 4 of one length and one tape at batch 2 of another give the step
at batches 5 and 9 of the other length; the reference is
:func:`asrfit.memory.simulate.simulate_step` there, every memory figure equal and the kernel
rows' FLOPs and bytes as :func:`test_trace_tape._assert_same_step` compares them. Where a
trace at the other length would not be the single tape's log scaled, replay must refuse.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

transformers = pytest.importorskip("transformers")

from test_depth_scaling import _adapter  # noqa: E402
from test_trace_tape import CASES, SETUPS, _assert_same_step, _masked, _trace  # noqa: E402

import asrfit.memory.trace.tracker as tracker_module  # noqa: E402
from asrfit.memory.setup import Setup  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.tape import Tape, replayed_step  # noqa: E402
from asrfit.memory.tape_lengths import replay_across  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _check(family: str, setup_name: str, pair_shape: tuple, other_shape: tuple) -> None:
    make, _, _ = CASES[family]
    adapter, setup = _adapter(make()), SETUPS[setup_name]
    _, two = _trace(adapter, BatchShape(2, *pair_shape), setup)
    _, four = _trace(adapter, BatchShape(4, *pair_shape), setup)
    _, other = _trace(adapter, BatchShape(2, *other_shape), setup)
    for batch in (5, 9):
        traced, _ = _trace(adapter, BatchShape(batch, *other_shape), setup)
        tape = replay_across(two, four, other, batch)
        assert tape is not None, f"{family} {setup_name} at {batch} x {other_shape}: refused"
        _assert_same_step(replayed_step(tape, adapter.name, setup), traced)


# A TDT loss's lattice loop keeps storages per anti-diagonal (asrfit.memory.trace.lattice):
# another op sequence at other lengths, refused (test_a_transducer_lattice_refuses)
ACROSS = [family for family in CASES if family != "parakeet_tdt"]


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


def test_a_transducer_lattice_refuses(caplog: pytest.LogCaptureFixture) -> None:
    """The TDT loss's sampled lattice holds stand-in storages per anti-diagonal, as many as
    the lengths have: at other lengths another sequence of storages, so replay refuses."""
    caplog.set_level(logging.DEBUG, logger="asrfit.memory.tape")
    two, four, other = _tapes("parakeet_tdt")
    assert replay_across(two, four, other, 5) is None
    assert "storages" in caplog.records[-1].getMessage()


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
