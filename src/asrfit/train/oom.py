"""Out-of-memory recovery: split the failing micro-batch in halves, inside the same step.

The trainer normalises every micro-batch's loss by the units of the whole accumulation
window (see :mod:`asrfit.train.trainer`), so running a micro-batch as two halves adds the
same gradient as running it whole. :func:`run_with_recovery` drives one window:

- an OOM in the *forward* pass leaves the gradients untouched: the piece is replaced by
  its two halves and the window goes on;
- an OOM in the *backward* pass may have accumulated part of the piece's gradient: the
  gradients are zeroed and the window restarts from its first piece, with the failing
  piece split (earlier pieces run again; their data is still in memory);
- a piece of one utterance that runs out of memory cannot be split:
  :class:`BatchTooLargeError` names the batch's shape and the knobs to turn.

After each OOM the failing frame's tensors are released (the exception and its traceback
are dropped first), ``gc.collect()`` runs and, on CUDA, ``torch.cuda.empty_cache()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

from asrfit.errors import AsrfitError
from asrfit.models.losses import batch_size_of

if TYPE_CHECKING:
    from asrfit.plan.plan import Plan

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What to try when even one utterance does not fit (shared with the pre-flight check).
KNOBS = (
    "lower the bucket's batch limit (re-plan with a smaller safety margin, or edit "
    "buckets[i].batch_size in the plan), turn on gradient checkpointing, use an 8-bit "
    "optimizer (adamw8bit), or chunk/filter utterances above a shorter max_seconds"
)


class BatchTooLargeError(AsrfitError, RuntimeError):
    """A batch runs out of memory and cannot be split further (or failed the pre-flight)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of the device.

    Args:
        exc: Any exception.

    Returns:
        True for ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``), for what
        accelerate's ``should_reduce_batch_size`` recognises (CUDA, XPU, MPS and HPU
        out-of-memory messages, the CPU allocator's "can't allocate memory", cuDNN's
        ``CUDNN_STATUS_NOT_SUPPORTED``) and for any ``RuntimeError`` whose message says
        "out of memory"; False for :class:`BatchTooLargeError`, which is final.
    """
    if isinstance(exc, BatchTooLargeError):
        return False
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    from accelerate.utils.memory import should_reduce_batch_size

    if should_reduce_batch_size(exc):  # CUDA/XPU/MPS/HPU messages, the CPU allocator, cuDNN
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def free_memory() -> None:
    """Collect garbage and, when CUDA is initialised, return cached blocks to the driver."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def split_batch(batch: Any, sizes: Sequence[int]) -> list[Any]:
    """Cut a collated batch along its first dimension into consecutive parts.

    Tensors whose first dimension is the batch size, and lists of that length, are cut;
    everything else (scalars, strings, tensors of another length) is shared by every part.
    Padding is kept: a part stays padded to the longest utterance of the whole batch.

    Args:
        batch: A tensor, or a dict/list/tuple (nested) of tensors and per-utterance lists.
        sizes: Sizes of the parts, summing to the batch size.

    Returns:
        One batch per size, of the same structure.

    Raises:
        ValueError: When ``sizes`` do not sum to the batch size.
    """
    total = batch_size_of(batch)
    if sum(sizes) != total or any(s < 1 for s in sizes):
        raise ValueError(f"split sizes {list(sizes)} do not add up to the batch size {total}")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [_slice(batch, start, start + n, total) for start, n in zip(starts, sizes, strict=True)]


def _slice(value: Any, start: int, stop: int, total: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value[start:stop] if value.dim() and value.shape[0] == total else value
    if isinstance(value, Mapping):
        return type(value)({k: _slice(v, start, stop, total) for k, v in value.items()})
    if isinstance(value, tuple):
        parts = [_slice(v, start, stop, total) for v in value]
        return type(value)(*parts) if hasattr(value, "_fields") else tuple(parts)
    if isinstance(value, list):
        if len(value) == total and not any(isinstance(v, torch.Tensor) for v in value):
            return value[start:stop]
        return [_slice(v, start, stop, total) for v in value]
    return value


def halves(size: int) -> tuple[int, int]:
    """The two part sizes of a split: the first half gets the odd one (5 -> 3, 2)."""
    first = (size + 1) // 2
    return first, size - first


def describe_batch(batch: Any) -> str:
    """Shapes of a batch's tensors, e.g. ``input_values (8, 160000), labels (8, 150)``."""
    if isinstance(batch, torch.Tensor):
        return f"tensor {tuple(batch.shape)}"
    if isinstance(batch, Mapping):
        items = batch.items()
    elif isinstance(batch, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(batch))
    else:
        return type(batch).__name__
    parts = [f"{k} {tuple(v.shape)}" for k, v in items if isinstance(v, torch.Tensor)]
    return ", ".join(parts) or type(batch).__name__


@dataclass
class OOMEvent:
    """One recovered out-of-memory error.

    Attributes:
        step: Optimizer step (1-based) the OOM happened in.
        bucket: Bucket index of the micro-batch, or None when unknown.
        batch_size: Utterances in the piece that ran out of memory.
        phase: "forward" or "backward".
        split_sizes: The two halves it was replaced by.
    """

    step: int
    bucket: int | None
    batch_size: int
    phase: str
    split_sizes: tuple[int, int]


@dataclass
class WindowRun(Generic[T]):
    """What :func:`run_with_recovery` did with one accumulation window.

    Attributes:
        results: Return values of the pieces that completed, in order (after the last restart).
        pieces: The pieces that completed, in order.
        attempted_sizes: Size of every piece started, in order, including those that failed.
        events: ``(piece size, phase, halves)`` of every OOM.
        restarts: Times the window restarted after an OOM in a backward pass.
    """

    results: list[Any] = field(default_factory=list)
    pieces: list[T] = field(default_factory=list)
    attempted_sizes: list[int] = field(default_factory=list)
    events: list[tuple[T, int, str, tuple[int, int]]] = field(default_factory=list)
    restarts: int = 0


def run_with_recovery(
    pieces: Sequence[T],
    run: Callable[[T, bool], Any],
    *,
    size_of: Callable[[T], int],
    split: Callable[[T, tuple[int, int]], tuple[T, T]],
    restart: Callable[[], None],
    describe: Callable[[T], str] = lambda piece: repr(piece),
) -> WindowRun[T]:
    """Run a window's micro-batches, splitting any that runs out of memory.

    Args:
        pieces: The window's micro-batches, in order.
        run: ``run(piece, sync)`` does the piece's forward and backward; ``sync`` is True for
            the window's last piece (gradients synchronise across processes there). An OOM it
            raises counts as a backward OOM when the exception has ``asrfit_phase ==
            "backward"`` (set by the caller around its backward call), else a forward OOM.
        size_of: Utterances in a piece.
        split: ``split(piece, (n1, n2))`` returns the two halves.
        restart: Zeroes the gradients before a restart after a backward OOM.
        describe: Text naming a piece's shape, for the error message.

    Returns:
        A :class:`WindowRun`.

    Raises:
        BatchTooLargeError: A piece of one utterance ran out of memory.
        Exception: Anything ``run`` raises that is not an OOM, unchanged.
    """
    todo = list(pieces)
    report: WindowRun[T] = WindowRun()
    i = 0
    while i < len(todo):
        piece = todo[i]
        size = size_of(piece)
        report.attempted_sizes.append(size)
        phase = None
        try:
            report.results.append(run(piece, i == len(todo) - 1))
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
            phase = getattr(exc, "asrfit_phase", "forward")
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            del exc  # drop the traceback (and the tensors its frames hold) before freeing
        if phase is None:
            report.pieces.append(piece)
            i += 1
            continue
        free_memory()
        if size <= 1:
            raise BatchTooLargeError(
                f"out of memory on a single utterance ({describe(piece)}) in the {phase} pass "
                f"({message}); it cannot be split further. To fit it: {KNOBS}."
            )
        sizes = halves(size)
        logger.warning(
            "out of memory in the %s pass of a micro-batch of %d (%s); running it as %d + %d "
            "in the same optimizer step.",
            phase,
            size,
            describe(piece),
            *sizes,
        )
        report.events.append((piece, size, phase, sizes))
        todo[i : i + 1] = list(split(piece, sizes))
        if phase == "backward":
            restart()
            report.restarts += 1
            report.results.clear()
            report.pieces.clear()
            i = 0
    return report


def mark_backward(exc: BaseException) -> None:
    """Tag an exception raised by a backward pass (see :func:`run_with_recovery`)."""
    with contextlib.suppress(AttributeError):  # exceptions with __slots__
        exc.asrfit_phase = "backward"  # type: ignore[attr-defined]


@dataclass
class BucketOOMCounter:
    """Counts OOMs per bucket and decides when a bucket's limit comes down.

    Each OOM is recorded with ``ok_size``: the largest piece of the failing micro-batch that
    then ran. The new limit is the smallest ``ok_size`` seen since the bucket's last lowering
    (a size that is known to run), and always below the current limit.

    Args:
        oom_limit: OOMs in one bucket (since its last lowering) that lower its limit.
            (Default: 2)
    """

    oom_limit: int = 2
    counts: dict[int, int] = field(default_factory=dict)
    ok_sizes: dict[int, int] = field(default_factory=dict)

    def record(self, bucket: int | None, ok_size: int) -> bool:
        """Count one OOM of ``bucket`` whose pieces then ran at ``ok_size``; True at the limit."""
        if bucket is None:
            return False
        self.counts[bucket] = self.counts.get(bucket, 0) + 1
        self.ok_sizes[bucket] = min(self.ok_sizes.get(bucket, ok_size), ok_size)
        return self.counts[bucket] >= self.oom_limit

    def new_limit(self, bucket: int, current_limit: int) -> int | None:
        """The lowered limit, or None to keep the current one; the bucket's count restarts."""
        ok = self.ok_sizes.get(bucket)
        self.counts.pop(bucket, None)
        self.ok_sizes.pop(bucket, None)
        if ok is None:
            return None
        new = max(1, min(current_limit - 1, ok))
        return new if new < current_limit else None


def lower_bucket_limit(
    plan: Plan,
    bucket: int,
    new_limit: int,
    *,
    sampler: Any = None,
    out_dir: Path | None = None,
    oom_count: int = 0,
) -> Plan:
    """Lower a bucket's batch limit after repeated OOMs: in a copy of the plan and the sampler.

    Args:
        plan: The current plan (left unchanged).
        bucket: Index into ``plan.buckets``.
        new_limit: The new batch limit.
        sampler: Gets ``lower_limit(bucket, new_limit)`` when it has that method.
        out_dir: Where the adjusted plan is written (``plan.adjusted.json``, atomically).
        oom_count: OOMs that led to this, for the log line.

    Returns:
        The adjusted plan.
    """
    from asrfit.plan.plan import Plan

    adjusted = Plan.from_dict(plan.to_dict())
    old = adjusted.buckets[bucket]
    adjusted.buckets[bucket] = dataclasses.replace(old, batch_size=new_limit)
    lower = getattr(sampler, "lower_limit", None)
    if callable(lower):
        lower(bucket, new_limit)
    where = ""
    if out_dir is not None:
        path = adjusted.save(Path(out_dir) / "plan.adjusted.json")
        where = f"; adjusted plan written to {path}"
    logger.warning(
        "bucket %d (%.1f-%.1f s) ran out of memory %d times: its batch limit goes from %d to %d%s.",
        bucket,
        old.min_seconds,
        old.max_seconds,
        oom_count,
        old.batch_size,
        new_limit,
        where,
    )
    return adjusted
