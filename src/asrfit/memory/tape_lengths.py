"""A tape replayed at another batch of other lengths: the batch rule from two tapes at one
length, the sizes from one tape at the other.

:func:`asrfit.memory.tape.replay` needs two tapes at the lengths it replays: from them it reads
which storages and operands grow with the batch. That is a property of the step's code, not of
its lengths: a storage made by the same op at the same place in the same sequence is an
activation (one row per utterance) or not (a parameter, a positional table) at every length.
So two tapes of a setup at batches ``a < b`` of one input and label length, and one tape at
batch ``c`` of another, fix the step at any batch ``n`` of the other length:

- each storage: constant in the pair, its size at ``c``; proportional in the pair, its size at
  ``c`` times ``n / c``; a size that counts values (masked frames), per utterance at ``c``;
  a strided extent whose rows are padded (affine in the batch), its rows at ``n`` at the row
  stride read from the tape at ``c``; each dimension of its shape the same way;
- each stand-in storage (a TDT loss's sampled lattice holds one per storage a representative
  diagonal keeps and diagonal it stands for, as many as the lengths have diagonals:
  :mod:`asrfit.memory.trace.lattice`): the storage it repeats at ``n``, scaled as the tracker
  scaled it; the other storages are matched in order, stand-ins aside;
- each kernel: the bytes of each operand (distinct inputs, then outputs:
  :attr:`~asrfit.memory.tape.Tape.operands`) and its FLOPs by that rule, the bytes summed (an
  operand whose size counts values, per utterance at ``c``, as its storage).

The replay reports the assumptions of the tape at ``c`` and the calls each of its kernels
stands for (a transducer loss's sampled diagonals). Replay refuses (None, and the caller
traces) where the tape at ``c`` differs from the pair in anything but sizes and stand-ins
(another op sequence, other assumptions, numbers aside), where a size in the pair follows
none of the rules above, where a size at ``n`` would not be whole bytes, or where the tracker
would follow other values at ``n`` (:func:`asrfit.memory.tape._shadows_unlike`'s rule, each
size taken by the pair's rule from the tape at ``c``; where the pair itself chose otherwise
at its smaller batch, only at ``n >= c`` and where the tape at ``c`` chose as its larger
batch did). ``tests/test_trace_tape_lengths.py`` compares replays with fresh traces.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

from asrfit.memory.tape import (
    MIN_BATCH,
    Call,
    Shadow,
    Tape,
    _stand_in_bytes,
    _unlike,
    _values_unfollowed_at,
)
from asrfit.memory.trace.eventlog import Block, TraceLog

log = logging.getLogger("asrfit.memory.tape")
_DIGITS = re.compile(r"\d+")  # assumptions may count what depends on the lengths (diagonals)


def replay_across(first: Tape, second: Tape, other: Tape, batch_size: int) -> Tape | None:
    """``other``'s lengths at ``batch_size``, the batch rule read from ``first`` and
    ``second`` (two batches of one other length), or None (why: logged at debug level).

    Args:
        first: A tape at batch ``a``, at least :data:`~asrfit.memory.tape.MIN_BATCH`.
        second: The same lengths at another batch ``b``.
        other: A tape at other lengths, batch ``c``, at least ``MIN_BATCH``.
        batch_size: The batch to replay at, at least ``MIN_BATCH``.
    """
    tape = _across(first, second, other, batch_size)
    if isinstance(tape, str):
        log.debug(
            "no replay at batch %d of %s from batches %d and %d of %s: %s",
            batch_size,
            other.batch,
            first.batch.batch_size,
            second.batch.batch_size,
            first.batch,
            tape,
        )
        return None
    return tape


def _scaled(x: int, y: int, z: int, ab: tuple[int, int], cn: tuple[int, int]) -> int | None:
    """``z`` (a size at batch ``c``) at batch ``n`` by the rule of ``x`` and ``y`` (the same
    size at batches ``a`` and ``b`` of the pair): constant, or proportional; else None."""
    (a, b), (c, n) = ab, cn
    if x == y:
        return z
    if x * b == y * a and (z * n) % c == 0:
        return z * n // c
    return None


def _kept(tape: Tape) -> list[int]:
    """The tape's storages in creation order, stand-ins aside: a TDT loss's sampled lattice
    holds one per storage its representative diagonals keep and diagonal they stand for
    (:mod:`asrfit.memory.trace.lattice`), as many as the lengths have diagonals."""
    return [key for key in tape.log.blocks if key not in tape.log.stand_ins]


def _index(keys: list[int]) -> dict[int, int]:
    return {key: i for i, key in enumerate(keys)}


def _events(tape: Tape, index: dict[int, int]) -> list[tuple[int, int]]:
    """The tape's allocations and frees of the storages in ``index``, keyed by it."""
    return [(index[key], sign) for key, sign in tape.log.events if key in index]


def _merged(tape: Tape, index: dict[int, int]) -> dict[int, int]:
    return {index.get(k, -1): index.get(v, -1) for k, v in tape.log.merged.items()}


def _structure(pair: Tape, other: Tape) -> str | None:
    """What, other than sizes and lengths, differs between the pair and ``other``."""
    for name in ("steps", "traced_calls", "state_bytes", "layers"):
        if getattr(pair, name) != getattr(other, name):
            return f"the tapes' {name} differ"
    if [_DIGITS.sub("#", a) for a in pair.assumptions] != [
        _DIGITS.sub("#", a) for a in other.assumptions
    ]:
        return "the tapes' assumptions differ, numbers aside"
    kept, kept_other = _kept(pair), _kept(other)
    if len(kept) != len(kept_other):
        return f"{len(kept)} and {len(kept_other)} storages (stand-ins aside)"
    index, index_other = _index(kept), _index(kept_other)
    if _events(pair, index) != _events(other, index_other):
        return "allocations and frees differ"
    if _merged(pair, index) != _merged(other, index_other):
        return "other storages merged"
    if len(pair.calls) != len(other.calls):
        return f"{len(pair.calls)} and {len(other.calls)} kernel calls"
    if len(pair.operands) != len(pair.calls) or len(other.operands) != len(other.calls):
        return "no operand bytes kept"
    return None


def _across(first: Tape, second: Tape, other: Tape, n: int) -> Tape | str:
    """:func:`replay_across`'s tape, or why there is none."""
    a, b, c = first.batch.batch_size, second.batch.batch_size, other.batch.batch_size
    if min(a, b, c, n) < MIN_BATCH or a == b:
        return f"batches below {MIN_BATCH} or alike"
    lengths = (other.batch.input_length, other.batch.label_length)
    if lengths == (first.batch.input_length, first.batch.label_length):
        return "the tapes are of the same lengths"
    unlike = _unlike(first, second) or _structure(first, other)
    if unlike:
        return unlike
    ab, cn = (a, b), (c, n)
    unlike = _shadows_across(first.shadows, second.shadows, other.shadows, ab, cn)
    if unlike:
        return f"the tracker would follow other values ({unlike})"
    # each of ``other``'s storages is the pair's at the same place, stand-ins aside; a
    # stand-in is the storage it repeats, at ``n`` (below), scaled as the tracker scaled it
    blocks = {}
    for key, pair_key in zip(_kept(other), _kept(first), strict=True):
        x, y, z = first.log.blocks[pair_key], second.log.blocks[pair_key], other.log.blocks[key]
        made = (x.phase, x.step, x.tag, x.op, x.dtype, x.region, len(x.shape))
        if made != (y.phase, y.step, y.tag, y.op, y.dtype, y.region, len(y.shape)) or made != (
            z.phase,
            z.step,
            z.tag,
            z.op,
            z.dtype,
            z.region,
            len(z.shape),
        ):
            return f"storage {key} is made otherwise"
        nbytes = _scaled(x.nbytes, y.nbytes, z.nbytes, ab, cn)
        if nbytes is None and pair_key in first.counts_values:
            nbytes = -(-z.nbytes * n // c)  # it counts values: per utterance at c
        dims = [_scaled(i, j, k, ab, cn) for i, j, k in zip(x.shape, y.shape, z.shape, strict=True)]
        if nbytes is None and dims and None not in dims:
            nbytes = _padded_rows(x, y, z, dims)
        if nbytes is None:
            return f"storage {key} ({x.op}) is {x.nbytes} and {y.nbytes} bytes: not a rule"
        shape = tuple(k if d is None else d for k, d in zip(z.shape, dims, strict=True))
        blocks[key] = replace(z, nbytes=nbytes, shape=shape)
    for key, scale in other.log.stand_ins.items():
        blocks[key] = replace(other.log.blocks[key], nbytes=_stand_in_bytes(blocks, scale))
    blocks = {key: blocks[key] for key in other.log.blocks}  # in creation order
    calls: list[Call] = []
    pairs = zip(first.calls, second.calls, other.calls, strict=True)
    for i, ((step, x, weight), (_, y, _), (_, z, _)) in enumerate(pairs):
        call = _call(x, y, z, first.operands[i], second.operands[i], other.operands[i], ab, cn)
        if isinstance(call, str):
            return call
        if (step, weight) != second.calls[i][::2] or step != other.calls[i][0]:
            return f"other kernel calls ({x[:3]})"
        calls.append((step, call, other.calls[i][2]))  # calls it stands for, at its lengths
    flops = _scaled(first.flops, second.flops, other.flops, ab, cn)
    if flops is None:
        return "FLOPs neither constant nor proportional in the batch"
    return replace(
        other,
        batch=replace(other.batch, batch_size=n),
        log=TraceLog(
            blocks, list(other.log.events), dict(other.log.merged), dict(other.log.stand_ins)
        ),
        calls=calls,
        flops=flops,
        operands=[],  # not kept per operand (a replay is not replayed again)
    )


def _padded_rows(x: Block, y: Block, z: Block, shape: list[int]) -> int | None:
    """The bytes at ``shape`` (the replayed batch's) of a storage laid out as rows of its
    last dimension, each row padded to one stride, that ends at the last row's last element
    (the ``attn_bias`` gradient of the CUDA memory-efficient attention, ``T`` keys padded to
    a multiple of 16, as FakeTensorMode rebuilds it from its dispatch cache), where ``x``,
    ``y`` (the pair) and ``z`` (the tape at ``c``) are all that extent, the pair at one
    stride; else None (the kernel's own output, the whole padded buffer, is proportional).
    An extent is affine in the batch, its intercept set by the padding: at the other length
    one tape alone could not tell it."""
    import torch

    itemsize = getattr(torch, str(z.dtype).removeprefix("torch."), None)
    size = itemsize.itemsize if isinstance(itemsize, torch.dtype) else 0

    def stride(block: Block) -> int | None:
        rows, last = math.prod(block.shape[:-1]), block.shape[-1]
        if not size or rows < 2 or block.nbytes % size:
            return None
        elements, extra = divmod(block.nbytes // size - last, rows - 1)
        return elements if not extra and elements > last else None

    row, row_too, row_at_c = stride(x), stride(y), stride(z)
    if row is None or row != row_too or row_at_c is None:
        return None
    return ((math.prod(shape[:-1]) - 1) * row_at_c + shape[-1]) * size


def _call(
    x: tuple,
    y: tuple,
    z: tuple,
    px: tuple[int, ...],
    py: tuple[int, ...],
    pz: tuple[int, ...],
    ab: tuple[int, int],
    cn: tuple[int, int],
) -> tuple | str:
    """One kernel row at batch ``n`` (row keys ``x``, ``y`` of the pair, ``z`` at ``c``; ``p*``
    their operands' bytes), or why it cannot be replayed."""
    if (x[:3], x[5]) != (y[:3], y[5]) or (x[:3], x[5]) != (z[:3], z[5]):
        return f"other kernel calls ({x[:3]}, {z[:3]})"
    if not len(px) == len(py) == len(pz) or [sum(map(abs, p)) for p in (px, py, pz)] != [
        x[4],
        y[4],
        z[4],
    ]:
        return f"other operands ({x[:3]})"
    parts = [_operand(i, j, k, ab, cn) for i, j, k in zip(px, py, pz, strict=True)]
    flops = _scaled(x[3], y[3], z[3], ab, cn)
    if None in parts or flops is None:
        return f"a kernel's figures are neither constant nor proportional ({x[:3]})"
    shape = None
    if x[6] is not None:  # a CPU attention row's shape: batch x heads, then lengths
        if y[6] is None or z[6] is None or not len(x[6]) == len(y[6]) == len(z[6]):
            return f"other attention shapes ({x[6]}, {z[6]})"
        dims = [_scaled(i, j, k, ab, cn) for i, j, k in zip(x[6], y[6], z[6], strict=True)]
        if None in dims:
            return f"other attention shapes ({x[6]}, {z[6]})"
        shape = tuple(dims)
    elif y[6] is not None or z[6] is not None:
        return f"other attention shapes ({x[6]}, {z[6]})"
    return (*z[:3], flops, sum(parts), z[5], shape)  # type: ignore[arg-type]


def _operand(x: int, y: int, z: int, ab: tuple[int, int], cn: tuple[int, int]) -> int | None:
    """An operand's bytes at batch ``n`` (:attr:`~asrfit.memory.tape.Tape.operands`): one that
    counts values (negated in all three) per utterance at ``c``, as its storage is."""
    if min(x, y, z) < 0:
        c, n = cn
        return -(-abs(z) * n // c) if max(x, y, z) < 0 else None
    return _scaled(x, y, z, ab, cn)


def _shadows_across(
    first: list[Shadow],
    second: list[Shadow],
    other: list[Shadow],
    ab: tuple[int, int],
    cn: tuple[int, int],
) -> str | None:
    """The first choice to follow values that would not be made as at ``c`` at batch ``n``."""
    from asrfit.memory.trace.tracker import shadowable_size

    (a, b), (c, n) = ab, cn
    larger = second if b > a else first
    if len(first) != len(second) and len(larger) == len(other):
        # the pair followed other values at its smaller batch (a float tensor small enough
        # there only): its larger batch must have chosen as the tape at ``c``, and each of
        # those choices hold at ``n``, as a replay at one length requires above its pair
        return _choices_hold(larger, other, c, n)
    if not len(first) == len(second) == len(other):
        return f"{len(first)}, {len(second)} and {len(other)} choices to follow values"
    for (sx, hx, fx), (sy, hy, fy), (sz, hz, fz) in zip(first, second, other, strict=True):
        per_utterance = len(sx) * b == len(sy) * a and len(sz) * a == len(sx) * c
        alike = len(set(sx)) == len(set(sy)) == len(set(sz)) == 1
        if per_utterance and alike and len(sx) != len(sy):
            sx, sy, sz = sx[:1], sy[:1], sz[:1]  # one output per utterance (unbind), alike
        kinds = [i for _, i in sz]
        if not fx == fy == fz or not [i for _, i in sx] == [i for _, i in sy] == kinds:
            return f"values of {sx} and {sz} followed: {fx}, {fz}"
        sizes = zip(sx, sy, sz, strict=True)
        numels = [_scaled(i, j, k, ab, cn) for (i, _), (j, _), (k, _) in sizes]
        held = _scaled(hx, hy, hz, ab, cn)
        if None in numels or held is None:
            return f"values of {sx} and {sz} (inputs {hx} and {hz} bytes): not a rule"
        follows = all(shadowable_size(m, i, held) for m, i in zip(numels, kinds, strict=True))
        if follows != fz:
            return f"values of {numels} elements followed: {not fz}"
    return None


def _choices_hold(larger: list[Shadow], other: list[Shadow], c: int, n: int) -> str | None:
    """Whether the tape at batch ``c`` made ``larger``'s choices to follow values (each
    followed or not alike), and a trace at batch ``n >= c`` would make them too: each size
    followed stays small enough grown by ``n / c`` (:func:`~asrfit.memory.tape._values_unfollowed_at`),
    each size not followed stays too large not grown (its inputs grown): the most and least it can."""
    from asrfit.memory.trace.tracker import shadowable_size

    if n < c:
        return f"choices at batch {c} need not hold at {n}"
    if [followed for *_, followed in larger] != [followed for *_, followed in other]:
        return "the pair's larger batch followed other values than the tape at the other length"
    unfollowed = _values_unfollowed_at(other, c, n)
    if unfollowed:
        return unfollowed
    grow = n / c
    for sizes, held, followed in other:
        if not followed and all(shadowable_size(m, i, math.ceil(held * grow)) for m, i in sizes):
            return f"values of {sizes} elements not followed at batch {c}, followed at {n}"
    return None
