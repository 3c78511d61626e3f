"""The event log a traced step leaves (:class:`TraceLog`): each storage the tracker saw
(:class:`Block`) and its allocations and frees in order, beside the record of a pessimistic
rule taken where a value could not be known (:class:`Assumption`).
:mod:`asrfit.memory.trace.tracker` writes them; :mod:`asrfit.memory.peaks` and
:mod:`asrfit.memory.tape` read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The CUDA caching allocator hands out blocks in multiples of 512 bytes.
CUDA_BLOCK_BYTES = 512


def round_block(nbytes: int) -> int:
    """Round a request up to the caching allocator's 512-byte granularity (0 stays 0)."""
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


@dataclass
class Block:
    """One storage seen by the tracker."""

    key: int
    nbytes: int
    phase: str
    step: int
    tag: str | None = None  # set later: parameters, buffers, gradients, optimizer_state, inputs
    op: Any = None  # the aten op that made it
    shape: tuple[int, ...] = ()
    dtype: Any = None
    region: str = ""  # where in the model (set by asrfit.memory.fit.depth's hooks), else ""


@dataclass
class Assumption:
    """A place where a value could not be known and a pessimistic rule was used."""

    op: str
    rule: str
    where: str


@dataclass
class TraceLog:
    """Allocation events of a traced step, in order: ``(key, +1 alloc | -1 free)``."""

    blocks: dict[int, Block] = field(default_factory=dict)
    events: list[tuple[int, int]] = field(default_factory=list)
    # block -> the block whose storage it took over when an out-of-place op was rewritten as
    # in place (asrfit.memory.trace.engine): one storage, whose events the two blocks share
    merged: dict[int, int] = field(default_factory=dict)
    # stand-in block -> (the block it repeats, numerator, denominator): its bytes are the
    # block's times numerator // denominator (asrfit.memory.trace.lattice)
    stand_ins: dict[int, tuple[int, int, int]] = field(default_factory=dict)


def stand_in_bytes(source_bytes: int, numerator: int, denominator: int) -> int:
    """A stand-in storage's bytes (:attr:`TraceLog.stand_ins`): those of the storage it
    repeats, ``source_bytes``, times ``numerator // denominator``, as the tracker sizes it and
    a replay sizes it again at another shape."""
    return source_bytes * numerator // denominator


__all__ = ["CUDA_BLOCK_BYTES", "Assumption", "Block", "TraceLog", "round_block", "stand_in_bytes"]
