"""A traced step as a tape, replayed at another batch size without tracing.

At one input length and label length, a setup's step runs the same operators at every batch
size from 2 up (a batch of one takes other paths: ``bench/investigations/trace_tapes.py``):
the same storages are made and freed in the same order, and each storage's size either does
not depend on the batch (parameters, their casts, positional tables) or is proportional to
it (activations and their gradients). Each kernel's FLOPs and bytes are affine in the batch
(a weight read once, activations read per utterance). Two traces at batches ``a < b`` of one
shape fix all of it; the step at a third batch is then the same log with its sizes scaled,
analysed exactly as a trace is (:func:`replayed_step`, :mod:`asrfit.memory.peaks`).

The frees of one instant come in an order that hashing decides (autocast's cast cache,
cleared at the end of the forward pass, frees its copies in dict order). The tape keeps each
run of consecutive frees sorted, which changes no live sum at an allocation, where every
peak is read.

A storage whose size counts values (the frames a SpecAugment draw masks, gathered by a boolean
index) is a sample at any batch, traced or not: it is replayed at the larger size per
utterance of the two tapes, and so are the bytes of the kernels that touch it, affine in the
batch. Replay refuses (returns None, and the caller traces) when the two tapes differ in
anything but sizes, or when any other storage's size is neither constant nor proportional in
the batch (a kernel workspace of ``max(input + weight, output)`` is neither: it may switch
branch at a larger batch), unless it is a tensor with one dimension growing with the batch
(then its storage, a strided layout's extent that may end short of its last row's padding,
is affine in the batch), or a kernel's figures fall below zero on their line, or the tracker
would follow other values at that batch that a rule or kernel reads (those past its size
limit for followed values: the trace there would take other rules; a value nothing reads
changes nothing but what the tracker keeps). A value no larger than an input whose value is
followed is followed at any size (the padding mask's running sum, from which wav2vec2 and
XLS-R read their lengths), so only values an op expands beyond its inputs (the frame mask
repeated over the hidden size) meet the limit; an op with one output per utterance (unbind)
makes as many at the replayed batch. Why a replay is refused is logged at debug level.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape, StepMemory
from asrfit.memory.steptime.roofline import StepCost
from asrfit.memory.trace.eventlog import Block, TraceLog, stand_in_bytes

log = logging.getLogger(__name__)

#: Smallest batch a tape may be recorded or replayed at (a batch of one takes other paths).
MIN_BATCH = 2

Call = tuple[int, tuple, int]  # (step, OpCounter row key, weight)
Shadow = tuple[tuple[tuple[int, int], ...], int, bool]  # StorageTracker.shadow_sizes' entries


@dataclass
class Tape:
    """A traced step, kept for replay.

    Attributes:
        batch: The traced shape.
        steps: Steps traced (the last is the one reported).
        log: The tracker's log, blocks keyed by creation order (0, 1, ...), each run of
            consecutive frees sorted.
        calls: Every kernel and module call of the last step, in order
            (:attr:`asrfit.memory.steptime.runtime.OpCounter.calls`).
        flops: FLOPs of the last step.
        traced_calls: Kernel calls the trace of the last step made.
        state_bytes: Optimizer state live after the last step.
        assumptions: The trace's assumptions, as :class:`~asrfit.memory.step.StepMemory`
            reports them.
        shadows: Each choice the tracker made to follow an op's values or not by the size
            of its outputs (:attr:`asrfit.memory.trace.tracker.StorageTracker.shadow_sizes`):
            at another batch the same choices must hold, or the trace would take other rules.
        counts_values: The blocks made by an op whose output size depends on its inputs'
            values (PyTorch tags such ops ``dynamic_output_shape``: boolean-mask indexing,
            ``nonzero``, ``masked_select``).
        operands: Each call's bytes operand by operand (distinct inputs, then outputs), beside
            ``calls``, negated where the operand's size counts values (its storage made by an
            op such as boolean-mask indexing): what a replay at other lengths scales
            (:mod:`asrfit.memory.tape_lengths`).
        layers: Per encoder layer, ``(i, j, e, f)``: its forward pass's calls up to its last
            save, ``calls[i:j]``, and its events, ``log.events[e:f]``
            (:mod:`asrfit.memory.steptime.layer_span`); empty where not marked. A replay keeps
            calls and events in order, so the marks hold at every batch and length.

    The blocks' ops and dtypes are kept as their names, so that a tape is plain data
    (:meth:`to_dict`).
    """

    batch: BatchShape
    steps: int
    log: TraceLog
    calls: list[Call]
    flops: int
    traced_calls: int
    state_bytes: int
    assumptions: list[str]
    shadows: list[Shadow]
    counts_values: frozenset[int] = frozenset()
    operands: list[tuple[int, ...]] = field(default_factory=list)
    layers: list[tuple[int, int, int, int]] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        log: TraceLog,
        calls: list[Call],
        batch: BatchShape,
        steps: int,
        operands: list[tuple[int, ...]] | None = None,
        layers: list[tuple[int, int, int, int]] | None = None,
        **figures: Any,
    ):
        """The tape of a tracker's ``log`` and its counter's ``calls`` and their ``operands``
        (``figures``: the remaining attributes, ``shadows`` among them); ``layers``
        index ``calls`` and the log's events."""
        index = {key: i for i, key in enumerate(log.blocks)}
        blocks = {
            index[k]: replace(b, key=index[k], op=_name(b.op), dtype=_name(b.dtype))
            for k, b in log.blocks.items()
        }
        counts_values = frozenset(index[k] for k, b in log.blocks.items() if _counts_values(b.op))
        events: list[tuple[int, int]] = []
        frees: list[tuple[int, int]] = []
        for key, sign in log.events:
            if sign < 0:
                frees.append((index[key], sign))
                continue
            events += sorted(frees)
            frees = []
            events.append((index[key], sign))
        events += sorted(frees)
        merged = {index[k]: index[v] for k, v in log.merged.items()}
        stand_ins = {index[k]: (index[v], *scale) for k, (v, *scale) in log.stand_ins.items()}
        last = [i for i, c in enumerate(calls) if c[0] == steps]
        parts = [operands[i] for i in last] if operands and len(operands) == len(calls) else []
        log = TraceLog(blocks, events, merged, stand_ins)
        start = last[0] if last else 0  # calls of the last step only; events of every step
        marks = [(i - start, j - start, e, f) for i, j, e, f in layers or []]
        return cls(
            batch,
            steps,
            log,
            [calls[i] for i in last],
            counts_values=counts_values,
            operands=parts,
            layers=marks,
            **figures,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (:meth:`from_dict` reads it back)."""
        return {
            "batch": self.batch.to_dict(),
            "steps": self.steps,
            "blocks": [
                [b.nbytes, b.phase, b.step, b.tag, b.op, list(b.shape), b.dtype, b.region]
                for b in self.log.blocks.values()
            ],
            "events": self.log.events,
            "merged": sorted(self.log.merged.items()),
            "stand_ins": sorted([k, *v] for k, v in self.log.stand_ins.items()),
            "calls": [[step, list(key[:6]), key[6], weight] for step, key, weight in self.calls],
            "flops": self.flops,
            "traced_calls": self.traced_calls,
            "state_bytes": self.state_bytes,
            "assumptions": self.assumptions,
            "shadows": [
                [[list(x) for x in sizes], held, shadowed] for sizes, held, shadowed in self.shadows
            ],
            "counts_values": sorted(self.counts_values),
            "operands": [list(parts) for parts in self.operands],
            "layers": [list(mark) for mark in self.layers],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tape:
        """A tape from :meth:`to_dict`'s data."""
        blocks = {
            i: Block(i, n, phase, step, tag, op, tuple(shape), dtype, region)
            for i, (n, phase, step, tag, op, shape, dtype, region) in enumerate(data["blocks"])
        }
        log = TraceLog(
            blocks,
            [(k, sign) for k, sign in data["events"]],
            {k: v for k, v in data["merged"]},
            {
                k: (v, numerator, denominator)
                for k, v, numerator, denominator in data.get("stand_ins", [])
            },
        )
        calls = [
            (step, (*key, None if shape is None else tuple(shape)), weight)
            for step, key, shape, weight in data["calls"]
        ]
        shadows = [
            (tuple((n, int(integer_bytes)) for n, integer_bytes in sizes), held, shadowed)
            for sizes, held, shadowed in data["shadows"]
        ]
        return cls(
            BatchShape.from_dict(data["batch"]),
            data["steps"],
            log,
            calls,
            data["flops"],
            data["traced_calls"],
            data["state_bytes"],
            list(data["assumptions"]),
            shadows,
            frozenset(data["counts_values"]),
            [tuple(parts) for parts in data.get("operands", [])],
            [tuple(mark) for mark in data.get("layers", [])],
        )

    def cost(self, span: tuple[int, int] | None = None) -> StepCost:
        """The last step's kernels, as :meth:`OpCounter.cost` gives them (``span``: of
        ``calls[i:j]`` only)."""
        from asrfit.memory.steptime.runtime import cost_of

        counts: Counter = Counter()
        for _step, key, weight in self.calls if span is None else self.calls[slice(*span)]:
            counts[key] += weight
        return cost_of(counts)

    def layer_costs(self) -> list[StepCost]:
        """Each encoder layer's recomputed kernels (empty where not marked)."""
        return [self.cost((i, j)) for i, j, _, _ in self.layers]


def replay(first: Tape, second: Tape, batch_size: int) -> Tape | None:
    """``first`` and ``second`` (one shape at two batch sizes) at ``batch_size``, or None.

    Why a replay is refused is logged at debug level (logger ``asrfit.memory.tape``).

    Args:
        first: A tape at batch ``a``, at least :data:`MIN_BATCH`.
        second: The same input and label lengths at another batch ``b``.
        batch_size: The batch to replay at, at least :data:`MIN_BATCH`.
    """
    tape = _replayed(first, second, batch_size)
    if isinstance(tape, str):
        log.debug(
            "no replay at batch %d from batches %d and %d (%s): %s",
            batch_size,
            first.batch.batch_size,
            second.batch.batch_size,
            first.batch,
            tape,
        )
        return None
    return tape


def _stand_in_bytes(blocks: dict[int, Block], scale: tuple[int, int, int]) -> int:
    """A stand-in storage's bytes (:attr:`~asrfit.memory.trace.eventlog.TraceLog.stand_ins`):
    those of the storage it repeats, in ``blocks`` already at the replayed shape, scaled as
    the tracker scaled them (:func:`~asrfit.memory.trace.eventlog.stand_in_bytes`)."""
    source, numerator, denominator = scale
    return stand_in_bytes(blocks[source].nbytes, numerator, denominator)


def _unlike(first: Tape, second: Tape) -> str | None:
    """What, other than sizes, differs between two tapes; None where nothing does."""
    if (first.batch.input_length, first.batch.label_length) != (
        second.batch.input_length,
        second.batch.label_length,
    ):
        return "the tapes are of other lengths"
    for name in ("steps", "traced_calls", "state_bytes", "assumptions", "layers"):
        if getattr(first, name) != getattr(second, name):
            return f"the tapes' {name} differ"
    if len(first.log.blocks) != len(second.log.blocks):
        return f"{len(first.log.blocks)} and {len(second.log.blocks)} storages"
    if first.log.events != second.log.events:
        pairs = zip(first.log.events, second.log.events, strict=False)
        at, (x, _) = next((i, p) for i, p in enumerate(pairs) if p[0] != p[1])
        op = first.log.blocks[x[0]].op
        return f"allocations and frees differ from event {at} (storage {x[0]}, {op})"
    if first.log.merged != second.log.merged:
        return "other storages merged"
    if first.log.stand_ins != second.log.stand_ins:
        return "other stand-in storages"
    if len(first.calls) != len(second.calls):
        return f"{len(first.calls)} and {len(second.calls)} kernel calls"
    return None


def _replayed(first: Tape, second: Tape, batch_size: int) -> Tape | str:
    """:func:`replay`'s tape, or why there is none."""
    a, b = first.batch.batch_size, second.batch.batch_size
    if min(a, b, batch_size) < MIN_BATCH or a == b:
        return f"batches below {MIN_BATCH} or alike"
    unlike = _unlike(first, second)
    if unlike:
        return unlike
    unlike = _shadows_unlike(first.shadows, second.shadows, a, b, batch_size)
    if unlike:
        # the tapes followed other values (a float tensor shadowed at the smaller batch only):
        # only above the larger batch, where its choices must all still hold
        larger = max(first, second, key=lambda tape: tape.batch.batch_size)
        if batch_size < larger.batch.batch_size:
            return f"the tracker would follow other values ({unlike})"
        unfollowed = _values_unfollowed_at(larger.shadows, larger.batch.batch_size, batch_size)
        if unfollowed:
            return f"the tracker would follow other values ({unfollowed})"
    blocks: dict[int, Block] = {}
    for key, x in first.log.blocks.items():
        y = second.log.blocks[key]
        if (x.phase, x.step, x.tag, x.op, x.dtype, x.region, len(x.shape)) != (
            y.phase,
            y.step,
            y.tag,
            y.op,
            y.dtype,
            y.region,
            len(y.shape),
        ):
            return f"storage {key} is made otherwise"
        if key in first.log.stand_ins:  # the storage it repeats at the batch, scaled as traced
            blocks[key] = replace(x, nbytes=_stand_in_bytes(blocks, first.log.stand_ins[key]))
            continue
        dims = [_storage(i, j, a, b, batch_size) for i, j in zip(x.shape, y.shape, strict=True)]
        nbytes = _storage(x.nbytes, y.nbytes, a, b, batch_size)
        if (
            nbytes is None
            and x.shape
            and None not in dims
            and sum(i != j for i, j in zip(x.shape, y.shape, strict=True)) == 1
        ):
            # a strided layout's extent (a kernel's output with padded rows) along one
            # dimension that grows with the batch: affine in the batch, whole bytes per utterance
            slope, rest = divmod(y.nbytes - x.nbytes, b - a)
            nbytes = None if rest else x.nbytes + slope * (batch_size - a)
        if nbytes is None and key in first.counts_values:
            # its size counts values (masked frames: a random draw per utterance, a sample
            # at any batch): the larger size per utterance of the two
            nbytes = -(-max(x.nbytes * b, y.nbytes * a) * batch_size // (a * b))
        if nbytes is None or nbytes < 0:
            return f"storage {key} ({x.op}) is {x.nbytes} and {y.nbytes} bytes: not a rule"
        shape = tuple(i if d is None else d for i, d in zip(x.shape, dims, strict=True))
        blocks[key] = replace(x, nbytes=nbytes, shape=shape)
    calls: list[Call] = []
    for (step, x, weight), (step_y, y, weight_y) in zip(first.calls, second.calls, strict=True):
        if (step, weight, x[:3], x[5]) != (step_y, weight_y, y[:3], y[5]) or (x[6] is None) != (
            y[6] is None
        ):
            return f"other kernel calls ({x[:3]}, {y[:3]})"
        figures = [_affine(i, j, a, b, batch_size) for i, j in ((x[3], y[3]), (x[4], y[4]))]
        shape = None
        if x[6] is not None:  # a CPU attention row's shape: batch x heads, then lengths
            if len(x[6]) != len(y[6]) or x[6][1:] != y[6][1:]:
                return f"other attention shapes ({x[6]}, {y[6]})"
            shape = (_affine(x[6][0], y[6][0], a, b, batch_size), *x[6][1:])
        if None in figures or (shape is not None and shape[0] is None):
            return f"a kernel's figures fall below zero ({x[:3]})"
        calls.append((step, (*x[:3], *figures, x[5], shape), weight))
    flops = _affine(first.flops, second.flops, a, b, batch_size)
    if flops is None:
        return "FLOPs fall below zero"
    log = TraceLog(
        blocks, list(first.log.events), dict(first.log.merged), dict(first.log.stand_ins)
    )
    return replace(
        first,
        batch=replace(first.batch, batch_size=batch_size),
        log=log,
        calls=calls,
        flops=flops,
        operands=[],  # not kept per operand (a replay is not replayed again)
    )


def _shadows_unlike(
    first: list[Shadow], second: list[Shadow], a: int, b: int, batch: int
) -> str | None:
    """The first choice to shadow values that would not be made alike at ``batch``, or None."""
    from asrfit.memory.trace.tracker import shadowable_size

    if len(first) != len(second):
        return f"{len(first)} and {len(second)} choices to follow values"
    for (sizes, held, shadowed), (other, held_too, shadowed_too) in zip(first, second, strict=True):
        if len(sizes) * b == len(other) * a and len(set(sizes)) == len(set(other)) == 1:
            sizes, other = sizes[:1], other[:1]  # one output per utterance (unbind), all alike
        if shadowed != shadowed_too or [i for _, i in sizes] != [i for _, i in other]:
            return f"values of {sizes} and {other} followed: {shadowed}, {shadowed_too}"
        numels = [_storage(x, y, a, b, batch) for (x, _), (y, _) in zip(sizes, other, strict=True)]
        held_there = _storage(held, held_too, a, b, batch)
        if None in numels or held_there is None:
            return f"values of {sizes} and {other} (inputs {held} and {held_too} bytes): not a rule"
        kinds = [i for _, i in sizes]
        follows = all(shadowable_size(n, i, held_there) for n, i in zip(numels, kinds, strict=True))
        if follows != shadowed:
            return f"values of {numels} elements followed: {not shadowed}"
    return None


def _name(value: Any) -> str | None:
    return None if value is None else str(value)


def _values_unfollowed_at(shadows: list[Shadow], at: int, batch: int) -> str | None:
    """A value followed at batch ``at`` (one of a tape's ``shadows``) that would not be followed
    at a larger ``batch``, each size taken as growing with the batch (the most it can), or
    None: where there is one, a trace there takes other rules and a replay is refused."""
    from asrfit.memory.trace.tracker import shadowable_size

    scale = batch / at
    for sizes, held, shadowed in shadows:
        # the inputs taken as not growing (the least they can)
        if shadowed and not all(
            shadowable_size(math.ceil(n * scale), integer_bytes, held) for n, integer_bytes in sizes
        ):
            return f"values of {sizes} elements followed at batch {at}, not at {batch}"
    return None


def _counts_values(op: Any) -> bool:
    """Whether ``op``'s output size depends on its inputs' values (boolean-mask indexing,
    ``nonzero``, ``masked_select``): PyTorch tags such ops ``dynamic_output_shape``."""
    import torch

    return op is not None and torch.Tag.dynamic_output_shape in getattr(op, "tags", ())


def _storage(x: int, y: int, a: int, b: int, batch: int) -> int | None:
    """A storage's bytes at ``batch``: constant, or proportional to the batch; else None."""
    if x == y:
        return x
    if x * b == y * a and (x * batch) % a == 0:
        return x * batch // a
    return None


def _affine(x: int, y: int, a: int, b: int, batch: int) -> int | None:
    """A kernel figure at ``batch`` on the line through ``(a, x)`` and ``(b, y)`` (rounded);
    None where that line is negative there."""
    value = round(x + (y - x) * (batch - a) / (b - a))
    return value if value >= 0 else None


def replayed_step(
    tape: Tape, model: str, setup: Setup, target: str = "cuda", detail: dict | None = None
) -> StepMemory:
    """The :class:`StepMemory` of a replayed tape (:func:`replay`), exactly as
    :func:`asrfit.memory.simulate.simulate_step` reports a trace of that log (``detail``: as
    it fills its own)."""
    from asrfit.memory.peaks import step_memory

    started = time.perf_counter()
    return step_memory(
        tape.log,
        model,
        setup,
        target,
        tape.batch,
        tape.steps,
        detail,
        cost=tape.cost(),
        seconds=time.perf_counter() - started,
        flops=tape.flops,
        traced_calls=tape.traced_calls,
        state_bytes=tape.state_bytes,
        assumptions=list(tape.assumptions),
        layer_costs=tape.layer_costs(),
        layer_events=[(e, f) for _, _, e, f in tape.layers],
    )
