"""Memory probes: the process's RSS and its step peak on CPU, the CUDA allocator's counters.

Used by :class:`~asrfit.train.monitor.MemoryMonitor`; see its module docstring for what each
number means and how the CPU step peak (``VmHWM``, reset through ``/proc/self/clear_refs``)
is taken.
"""

from __future__ import annotations

import mmap
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

GIB = 2**30
_CLEAR_REFS = Path("/proc/self/clear_refs")
_PROC_STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class MemorySample:
    """One measurement at the end of a step.

    Attributes:
        allocated_bytes: Bytes held by live tensors (CUDA) or the process RSS (CPU), now.
        reserved_bytes: Bytes held by the caching allocator (CUDA) or the process RSS (CPU), now.
        peak_allocated_bytes: Largest ``allocated_bytes`` since the last peak reset.
        peak_reserved_bytes: Largest ``reserved_bytes`` since the last peak reset.
    """

    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int


def host_rss_bytes() -> int:
    """The resident set size of this process in bytes (``psutil``, else ``/proc/self/statm``).

    Returns:
        Current RSS in bytes.

    Raises:
        OSError: Neither ``psutil`` nor ``/proc/self/statm`` is available.
    """
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.Process().memory_info().rss)
    with open("/proc/self/statm", encoding="ascii") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def host_total_bytes() -> int:
    """Physical memory of this machine in bytes (``psutil``, else ``sysconf``)."""
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(psutil.virtual_memory().total)


def _lifetime_max_rss_bytes() -> int:
    """``ru_maxrss`` in bytes (the kernel reports KiB on Linux, bytes on macOS)."""
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(max_rss) if sys.platform == "darwin" else int(max_rss) * 1024


def _read_vmhwm_bytes() -> int | None:
    """The kernel's peak-RSS mark ``VmHWM`` of this process, or None where there is none."""
    try:
        text = _PROC_STATUS.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


class HostProbe:
    """Process RSS and its peak over a step (see the module docstring)."""

    def __init__(self, reset_peak: bool) -> None:
        self.process_peak_rss_bytes = _lifetime_max_rss_bytes()
        self._use_hwm = (
            reset_peak
            and _read_vmhwm_bytes() is not None
            and self._clear_hwm()
            and self._hwm_follows_a_freed_block()
        )
        self.source = "rss+vmhwm" if self._use_hwm else "rss"
        self._start_rss_bytes = 0

    @classmethod
    def _hwm_follows_a_freed_block(cls) -> bool:
        """Whether a reset ``VmHWM`` records a block that was touched and freed since the reset.

        Some kernels and sandboxes (gVisor among them) accept the write to ``clear_refs`` but do
        not keep the mark between resets; trusting it there would report each step's peak as its
        end-of-step RSS. A 40 MiB anonymous mapping (its own pages, whatever malloc keeps) is
        written and unmapped once; the mark must have risen by most of it.
        """
        block_bytes = 40 * 2**20
        cls._clear_hwm()
        start = host_rss_bytes()
        with mmap.mmap(-1, block_bytes) as block:  # every page written, so every page resident
            for offset in range(0, block_bytes, mmap.PAGESIZE):
                block[offset] = 1
        hwm = _read_vmhwm_bytes() or 0
        cls._clear_hwm()
        return hwm - start >= block_bytes * 3 // 4

    @staticmethod
    def _clear_hwm() -> bool:
        try:
            with open(_CLEAR_REFS, "w", encoding="ascii") as handle:
                handle.write("5")
        except OSError:
            return False
        return True

    def reset_peak(self) -> None:
        if self._use_hwm:
            hwm = _read_vmhwm_bytes() or 0
            self.process_peak_rss_bytes = max(self.process_peak_rss_bytes, hwm)
            self._clear_hwm()
        self._start_rss_bytes = host_rss_bytes()

    def measure(self) -> MemorySample:
        rss = host_rss_bytes()
        peak = max(rss, self._start_rss_bytes)
        if self._use_hwm:
            peak = max(peak, _read_vmhwm_bytes() or 0)
        self.process_peak_rss_bytes = max(self.process_peak_rss_bytes, peak)
        return MemorySample(rss, rss, peak, peak)


class CudaProbe:
    """``torch.cuda`` memory statistics of one device."""

    source = "torch.cuda"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def measure(self) -> MemorySample:
        return MemorySample(
            allocated_bytes=torch.cuda.memory_allocated(self.device),
            reserved_bytes=torch.cuda.memory_reserved(self.device),
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
        )


def require_tensorboard() -> type:
    """TensorBoard's ``SummaryWriter`` class, or a clear error when ``tensorboard`` is missing.

    Raises:
        ImportError: The ``tensorboard`` package is not installed; says how to install it.
    """
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(
            "tensorboard=True needs the `tensorboard` package, which is not installed: install "
            "it via `pip install asrfit[tensorboard]`, or pass tensorboard=False (memory.jsonl "
            "is written either way)."
        ) from exc
    return SummaryWriter
