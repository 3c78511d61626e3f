"""Simulations side by side: a phase's uncached traces in forked worker processes.

A cold plan is a few dozen fake-tensor traces, each one core's Python for 0.3-3 s, and
within a phase they do not depend on each other: the coarse shapes of every setup and the
optimizer states (screening), a fit's refinement shapes, the label pairs. :func:`map_forked`
runs such a phase on several cores. The planner forks once its first trace has imported the
model's and the tracing code (a child shares them copy-on-write: no second import of torch
and transformers, which alone take 5-6 s on a 2-core host); every process, the parent
included, takes the next job from a queue, and each child writes each result as a JSON file
into a private temporary folder, which the parent reads at the end. A child that fails or
dies leaves no file: the job's result is ``None`` and the caller computes it itself, so any
error surfaces in the parent exactly as it would without workers.

Workers: ``$ASRFIT_TRACE_WORKERS`` if set (1: none), else the CPUs this process may run on,
at most :data:`MAX_TRACE_WORKERS` (each trace holds a model's fake tensors and the trace's
records: a few hundred MiB of host memory per worker). Only where ``os.fork`` exists and is
the platform's usual way to start a worker (Linux; not macOS, where forking a process that
loaded system frameworks is unsafe, nor Windows).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import struct
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from asrfit.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Default ceiling on trace workers (each one a process with its own trace in memory).
MAX_TRACE_WORKERS = 4

# Job numbers the queue holds: all are written before any reader starts, so they must fit in
# a pipe's buffer (64 KiB on Linux, 4 bytes each); a plan's phase has a few dozen.
_MAX_QUEUED = 16_000


def trace_workers() -> int:
    """Processes a phase of simulations may use (1: trace in this process only).

    Raises:
        ConfigError: When ``$ASRFIT_TRACE_WORKERS`` is not a positive integer.
    """
    value = os.environ.get("ASRFIT_TRACE_WORKERS", "").strip()
    if value:
        try:
            workers = int(value)
        except ValueError:
            workers = 0
        if workers < 1:
            raise ConfigError(
                f"ASRFIT_TRACE_WORKERS={value!r}: expected a positive integer (1: no worker "
                "processes)."
            )
    else:
        from asrfit.profiles.gpus.probe import cpu_count

        workers = min(cpu_count(), MAX_TRACE_WORKERS)
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return 1
    return workers


def map_forked(
    jobs: Sequence[Callable[[], T]],
    workers: int,
    save: Callable[[T, Path], Any],
    load: Callable[[Path], T],
) -> list[T | None]:
    """Each job's result, the jobs shared out among this process and ``workers - 1`` forked
    children.

    Every process takes the next job not yet taken (a queue of job numbers in a pipe, so
    that a long trace does not hold up a worker's other jobs) until none is left. A child's
    results come back through ``save`` / ``load`` (a file per job); a job whose child failed
    (the child then stops taking jobs), or whose file cannot be read, gives ``None``. An
    exception in one of this process's own jobs is raised after every child has been
    stopped and reaped.

    Args:
        jobs: Callables without arguments (closures over what the parent holds).
        workers: Processes, the parent included (at most one per job is used).
        save: Writes one result to a path (in the child).
        load: Reads one result from a path (in the parent).
    """
    workers = max(1, min(workers, len(jobs)))
    results: list[T | None] = [None] * len(jobs)
    if workers == 1 or len(jobs) > _MAX_QUEUED:
        return [job() for job in jobs]
    with tempfile.TemporaryDirectory(prefix="asrfit-traces-") as tmp:
        folder = Path(tmp)
        queue, feed = os.pipe()
        try:  # every job number, written before any fork: the queue only drains after this
            os.write(feed, b"".join(struct.pack("<I", i) for i in range(len(jobs))))
        finally:
            os.close(feed)  # no writer left: an empty queue reads as its end
        children: list[int] = []
        ran_here: list[int] = []
        try:
            for _ in range(1, workers):
                pid = os.fork()
                if pid == 0:  # the child: jobs from the queue, then leave without exit hooks
                    _run_child(jobs, queue, folder, save)
                children.append(pid)
            while (index := _next(queue)) is not None:
                results[index] = jobs[index]()
                ran_here.append(index)
        except BaseException:
            for pid in children:  # this process's own job failed (or was interrupted)
                _stop(pid)
            raise
        finally:
            os.close(queue)
        for pid in children:
            _reap(pid)
        for index in sorted(set(range(len(jobs))) - set(ran_here)):
            path = folder / f"{index}.json"
            if not path.is_file():
                continue  # its child failed (logged there) or stopped first: the caller computes it
            try:
                results[index] = load(path)
            except (OSError, ValueError, KeyError, TypeError, ConfigError) as err:
                logger.warning(
                    "trace worker's result %s unreadable (%s): traced here instead", path, err
                )
    return results


def _next(queue: int) -> int | None:
    """The next job number from the queue (None: no job left)."""
    data = os.read(queue, 4)  # whole 4-byte numbers: every read asks for one
    return struct.unpack("<I", data)[0] if len(data) == 4 else None


def _run_child(
    jobs: Sequence[Callable[[], Any]],
    queue: int,
    folder: Path,
    save: Callable[[Any, Path], Any],
) -> None:
    """A forked child's life: jobs from the queue, each result saved; never returns."""
    code = 0
    try:
        _die_with_parent()
        torch = sys.modules.get("torch")
        if torch is not None:
            # intra-op threads after fork: one, as PyTorch's DataLoader workers do (a thread
            # pool the parent started does not exist here); a fake trace runs no large kernel
            torch.set_num_threads(1)
        while (index := _next(queue)) is not None:
            result = jobs[index]()
            path = folder / f"{index}.json"
            partial = path.with_suffix(".part")
            save(result, partial)
            os.replace(partial, path)  # the parent reads whole files only
    except BaseException as err:  # noqa: BLE001 - the parent recomputes and raises it there
        logger.info(
            "trace worker %d stopped (%s: %s); the planning process traces that simulation itself",
            os.getpid(),
            type(err).__name__,
            err,
        )
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _die_with_parent() -> None:
    """Ask Linux to kill this child when the planning process dies (``PR_SET_PDEATHSIG``),
    so that no worker outlives a plan that was stopped."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
