"""Measure memory per training step, compare it with the plan's prediction, act near the budget.

:class:`MemoryMonitor` is the logic behind both asrfit's trainer and the Hugging Face
:class:`~asrfit.train.callbacks.AdaptiveMemoryCallback`. Per step it records:

* on CUDA: ``torch.cuda.memory_allocated`` / ``memory_reserved`` at the end of the step and
  ``max_memory_allocated`` / ``max_memory_reserved`` over the step (the peak statistics are
  reset by :meth:`MemoryMonitor.start_step`). The budget check and the comparison with the
  prediction use the peak *reserved* bytes: the plan predicts ``max_memory_reserved``, and
  reserved memory is what runs into the device's limit.
* on CPU: the process's resident set size (RSS; ``psutil`` when importable, else
  ``/proc/self/statm``) at the end of the step as both "allocated" and "reserved", and the
  peak RSS *over the step*. On Linux the peak is the kernel's high-water mark ``VmHWM``, reset
  at :meth:`~MemoryMonitor.start_step` by writing ``5`` to ``/proc/self/clear_refs``; that reset
  also lowers what ``resource.getrusage`` reports as ``ru_maxrss`` (otherwise the
  process-lifetime maximum), so the monitor keeps the lifetime peak itself
  (``process_peak_rss_bytes`` in :meth:`~MemoryMonitor.summary`). The reset is used only where
  a once-per-monitor check shows the mark following a freed 40 MiB block (some sandboxes accept
  the write and do not keep the mark); elsewhere ``source`` is ``rss``. Pass
  ``reset_host_peak=False`` to leave ``VmHWM`` alone; the step peak is then the larger RSS of the step's start and end, a
  lower bound. Only this process is counted: data-loader workers are processes of their own.
  asrfit's trainer makes glibc keep freed memory on a CPU (:mod:`asrfit.train.host_allocator`),
  so there the RSS, like CUDA's reserved bytes, stays at the largest step's level once reached.

At ``warn_fraction`` (90 %) of the budget the monitor logs a warning; at ``free_fraction``
(95 %) it also calls ``torch.cuda.empty_cache()`` (a counted, logged no-op on CPU). Each step
is one JSON line in ``log_dir/memory.jsonl`` and, with ``tensorboard=True``, TensorBoard
scalars under ``memory/``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from asrfit.errors import ConfigError
from asrfit.train.probes import (
    GIB,
    CudaProbe,
    HostProbe,
    MemorySample,
    require_tensorboard,
)

logger = logging.getLogger(__name__)


@dataclass
class _BucketStats:
    steps: int = 0
    max_batch_size: int = 0
    predicted_bytes: int | None = None
    measured_bytes: int = 0
    measured_allocated_bytes: int = 0
    worst_step_ratio: float | None = None


class MemoryMonitor:
    """Per-step memory measurement, predicted-vs-measured bookkeeping and budget actions.

    Call :meth:`start_step` before a step's first forward and :meth:`end_step` after its
    optimizer step. Use it as a context manager, or call :meth:`close` at the end.

    Args:
        budget_bytes: Memory the run may use on ``device`` (a plan's ``usable_bytes``).
        device: The device to measure: a CUDA device, or the CPU (process RSS).
        log_dir: Folder for ``memory.jsonl`` (appended, one line per step) and TensorBoard
            events. None writes nothing. (Default: None)
        tensorboard: Also write TensorBoard scalars to ``log_dir``; needs the ``tensorboard``
            package. (Default: False)
        warn_fraction: Log a warning when a step's peak reaches this share of the budget.
            (Default: 0.90)
        free_fraction: Also empty the CUDA cache at this share of the budget. (Default: 0.95)
        measure: Replaces the device measurement (tests, other accelerators): called at the
            end of each step, returns a :class:`MemorySample`. (Default: None)
        reset_peak: Called at the start of each step with a custom ``measure``. (Default: None)
        reset_host_peak: On CPU under Linux, reset the kernel's ``VmHWM`` each step to measure
            the true step peak (see the module docstring). (Default: True)

    Raises:
        ConfigError: A non-positive budget, fractions out of order, ``tensorboard`` without a
            ``log_dir``, or a device that cannot be measured.
        ImportError: ``tensorboard=True`` and the ``tensorboard`` package is not installed.
    """

    def __init__(
        self,
        budget_bytes: int,
        *,
        device: torch.device | str,
        log_dir: Path | str | None = None,
        tensorboard: bool = False,
        warn_fraction: float = 0.90,
        free_fraction: float = 0.95,
        measure: Callable[[], MemorySample] | None = None,
        reset_peak: Callable[[], None] | None = None,
        reset_host_peak: bool = True,
    ) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise ConfigError(
                f"MemoryMonitor: budget_bytes={budget_bytes!r} must be a positive integer "
                "(a plan's usable_bytes, or the device memory x a safety margin)."
            )
        if not 0 < warn_fraction <= free_fraction:
            raise ConfigError(
                f"MemoryMonitor: need 0 < warn_fraction <= free_fraction, got "
                f"warn_fraction={warn_fraction}, free_fraction={free_fraction}."
            )
        if tensorboard and log_dir is None:
            raise ConfigError("MemoryMonitor: tensorboard=True needs a log_dir to write events to.")
        self.budget_bytes = budget_bytes
        self.device = torch.device(device)
        self.warn_fraction = warn_fraction
        self.free_fraction = free_fraction
        self._host_probe: HostProbe | None = None
        if measure is not None:
            self._measure, self._reset_peak = measure, reset_peak or (lambda: None)
            self.source = "custom"
        elif self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ConfigError(
                    f"MemoryMonitor: device={self.device} but torch.cuda.is_available() is False; "
                    "use device='cpu' or run on a machine with a CUDA GPU."
                )
            probe = CudaProbe(self.device)
            self._measure, self._reset_peak = probe.measure, probe.reset_peak
            self.source = probe.source
        elif self.device.type == "cpu":
            self._host_probe = HostProbe(reset_host_peak)
            self._measure, self._reset_peak = self._host_probe.measure, self._host_probe.reset_peak
            self.source = self._host_probe.source
        else:
            raise ConfigError(
                f"MemoryMonitor: cannot measure device type {self.device.type!r}; use a CUDA "
                "device or the CPU, or pass measure= a function returning a MemorySample."
            )

        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._jsonl: IO[str] | None = None
        self._writer: Any = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                self._writer = require_tensorboard()(log_dir=str(self.log_dir))
            self._jsonl = open(self.log_dir / "memory.jsonl", "a", encoding="utf-8")  # noqa: SIM115

        self.steps = 0
        self.warnings = 0
        self.cache_frees = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self._buckets: dict[int | None, _BucketStats] = {}
        self._step_started: float | None = None

    @property
    def jsonl_path(self) -> Path | None:
        """Where the per-step lines go (``log_dir/memory.jsonl``), or None without a log_dir."""
        return None if self.log_dir is None else self.log_dir / "memory.jsonl"

    def start_step(self) -> None:
        """Reset the peak statistics; call before the step's first forward."""
        self._reset_peak()
        self._step_started = time.perf_counter()

    def end_step(
        self,
        step: int,
        *,
        bucket: int | None,
        predicted_bytes: int | None,
        batch_size: int,
    ) -> dict[str, Any]:
        """Measure the step that just ran, compare with the prediction and the budget, log it.

        Args:
            step: The step number (written as is; the caller keeps it increasing).
            bucket: Index of the batch's bucket in ``plan.buckets``, or None when unknown.
            predicted_bytes: Predicted peak reserved bytes of this batch, or None.
            batch_size: Utterances in the micro-batch.

        Returns:
            The record written to ``memory.jsonl``: ``step``, ``step_seconds``, ``device``,
            ``source``, ``bucket``, ``batch_size``, ``allocated_bytes``, ``reserved_bytes``,
            ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``predicted_bytes``,
            ``measured_over_predicted``, ``budget_bytes``, ``budget_fraction``, ``warned``,
            ``freed_cache``, ``freed_bytes``.

        Raises:
            ConfigError: ``predicted_bytes`` or ``batch_size`` is negative.
        """
        if predicted_bytes is not None and predicted_bytes < 0:
            raise ConfigError(
                f"MemoryMonitor.end_step: predicted_bytes={predicted_bytes} is negative."
            )
        if batch_size < 0:
            raise ConfigError(f"MemoryMonitor.end_step: batch_size={batch_size} is negative.")
        sample = self._measure()
        step_seconds = (
            None if self._step_started is None else time.perf_counter() - self._step_started
        )
        self._step_started = None
        measured = sample.peak_reserved_bytes
        ratio = measured / predicted_bytes if predicted_bytes else None
        fraction = measured / self.budget_bytes
        warned = fraction >= self.warn_fraction
        freed = fraction >= self.free_fraction
        predicted = (
            "no prediction"
            if predicted_bytes is None
            else f"predicted {predicted_bytes / GIB:.2f} GiB"
        )
        context = f"bucket {bucket}, batch {batch_size}, {predicted}"
        freed_bytes = self._act_on_budget(step, measured, fraction, context)
        record: dict[str, Any] = {
            "step": step,
            "step_seconds": step_seconds,
            "device": str(self.device),
            "source": self.source,
            "bucket": bucket,
            "batch_size": batch_size,
            "allocated_bytes": sample.allocated_bytes,
            "reserved_bytes": sample.reserved_bytes,
            "peak_allocated_bytes": sample.peak_allocated_bytes,
            "peak_reserved_bytes": measured,
            "predicted_bytes": predicted_bytes,
            "measured_over_predicted": ratio,
            "budget_bytes": self.budget_bytes,
            "budget_fraction": fraction,
            "warned": warned,
            "freed_cache": freed,
            "freed_bytes": freed_bytes,
        }
        self._account(record)
        self._write(record)
        return record

    def _act_on_budget(self, step: int, peak_bytes: int, fraction: float, context: str) -> int:
        """Warn at ``warn_fraction``, empty the CUDA cache at ``free_fraction``; bytes released."""
        if fraction < self.warn_fraction:
            return 0
        self.warnings += 1
        message = (
            f"step {step}: peak {peak_bytes / GIB:.2f} GiB on {self.device} is {fraction:.0%} "
            f"of the {self.budget_bytes / GIB:.2f} GiB budget ({context})"
        )
        free_at = f"{self.free_fraction:.0%}"
        if fraction < self.free_fraction:
            logger.warning("%s; at %s the CUDA cache is emptied.", message, free_at)
            return 0
        self.cache_frees += 1
        if self.device.type != "cuda":
            logger.warning(
                "%s; at %s: %s has no allocator cache to free.", message, free_at, self.device
            )
            return 0
        before = torch.cuda.memory_reserved(self.device)
        torch.cuda.empty_cache()
        freed_bytes = max(0, before - torch.cuda.memory_reserved(self.device))
        logger.warning(
            "%s; at %s: called torch.cuda.empty_cache(), released %.2f GiB. If this repeats, "
            "lower the bucket's batch size or re-plan with a larger safety margin.",
            *(message, free_at, freed_bytes / GIB),
        )
        return freed_bytes

    def _account(self, record: dict[str, Any]) -> None:
        self.steps += 1
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, record["peak_reserved_bytes"])
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, record["peak_allocated_bytes"])
        stats = self._buckets.setdefault(record["bucket"], _BucketStats())
        stats.steps += 1
        stats.max_batch_size = max(stats.max_batch_size, record["batch_size"])
        stats.measured_bytes = max(stats.measured_bytes, record["peak_reserved_bytes"])
        stats.measured_allocated_bytes = max(
            stats.measured_allocated_bytes, record["peak_allocated_bytes"]
        )
        if record["predicted_bytes"] is not None:
            stats.predicted_bytes = max(stats.predicted_bytes or 0, record["predicted_bytes"])
        ratio = record["measured_over_predicted"]
        if ratio is not None:
            stats.worst_step_ratio = max(stats.worst_step_ratio or 0.0, ratio)

    def _write(self, record: dict[str, Any]) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._writer is not None:
            step = record["step"]
            scalars = {
                "memory/allocated_gib": record["allocated_bytes"] / GIB,
                "memory/reserved_gib": record["reserved_bytes"] / GIB,
                "memory/peak_gib": record["peak_allocated_bytes"] / GIB,
                "memory/peak_reserved_gib": record["peak_reserved_bytes"] / GIB,
                "memory/budget_fraction": record["budget_fraction"],
            }
            if record["predicted_bytes"] is not None:
                scalars["memory/predicted_gib"] = record["predicted_bytes"] / GIB
            for tag, value in scalars.items():
                self._writer.add_scalar(tag, value, step)

    def summary(self) -> dict[str, Any]:
        """Predicted versus measured per bucket, ready for a table.

        Returns:
            ``device``, ``source``, ``budget_bytes``, ``steps``, ``warnings`` (steps at or above
            ``warn_fraction``, including those that emptied the cache), ``cache_frees`` (steps at
            or above ``free_fraction``), ``peak_reserved_bytes``, ``peak_allocated_bytes``,
            ``process_peak_rss_bytes`` (CPU only, else None) and ``buckets``: one dict per
            bucket seen (None, for steps without a bucket, first) with ``bucket``, ``steps``,
            ``max_batch_size``, ``predicted_bytes`` (the largest prediction), ``measured_bytes``
            (the largest peak reserved), ``measured_allocated_bytes``, ``ratio``
            (measured / predicted, None without a prediction) and ``worst_step_ratio`` (the
            largest per-step measured / predicted).
        """
        rows = []
        for bucket in sorted(self._buckets, key=lambda b: -1 if b is None else b):
            stats = self._buckets[bucket]
            predicted = stats.predicted_bytes
            rows.append(
                {
                    "bucket": bucket,
                    "steps": stats.steps,
                    "max_batch_size": stats.max_batch_size,
                    "predicted_bytes": predicted,
                    "measured_bytes": stats.measured_bytes,
                    "measured_allocated_bytes": stats.measured_allocated_bytes,
                    "ratio": stats.measured_bytes / predicted if predicted else None,
                    "worst_step_ratio": stats.worst_step_ratio,
                }
            )
        host = self._host_probe
        return {
            "device": str(self.device),
            "source": self.source,
            "budget_bytes": self.budget_bytes,
            "steps": self.steps,
            "warnings": self.warnings,
            "cache_frees": self.cache_frees,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "process_peak_rss_bytes": None if host is None else host.process_peak_rss_bytes,
            "buckets": rows,
        }

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows of :meth:`summary` for a table."""
        summary = self.summary()
        rows = [
            ("Device", f"{summary['device']} ({summary['source']})"),
            ("Budget", f"{self.budget_bytes / GIB:.2f} GiB"),
            ("Steps", str(summary["steps"])),
            ("Peak reserved", f"{self.peak_reserved_bytes / GIB:.2f} GiB"),
            ("Warnings / cache frees", f"{self.warnings} / {self.cache_frees}"),
        ]
        for row in summary["buckets"]:
            label = "Bucket (none)" if row["bucket"] is None else f"Bucket {row['bucket']}"
            measured = f"measured {row['measured_bytes'] / GIB:.2f} GiB"
            if row["predicted_bytes"] is None:
                value = f"{measured}, no prediction ({row['steps']} steps)"
            else:
                value = (
                    f"{measured} vs predicted {row['predicted_bytes'] / GIB:.2f} GiB "
                    f"(x{row['ratio']:.2f}, {row['steps']} steps)"
                )
            rows.append((label, value))
        return rows

    def close(self) -> None:
        """Flush and close ``memory.jsonl`` and the TensorBoard writer. Safe to call twice."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MemoryMonitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
