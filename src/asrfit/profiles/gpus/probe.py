"""Probe this machine: its CUDA devices (through ``torch.cuda``), host RAM and CPUs.

Used by ``HardwareProfile.detect``; nothing here knows about plans. ``torch`` is imported
only when devices are probed.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

MiB = 1024**2
GiB = 1024**3

# What a fresh PyTorch process's own CUDA context takes on a device (driver state, module
# images; about 300-600 MiB depending on GPU and CUDA version). ``mem_get_info`` counts it
# as used, but it is ours, not another process's, and the memory model accounts for it
# separately; so when NVML cannot tell us our own usage, this much is assumed to be ours.
CUDA_CONTEXT_ALLOWANCE_BYTES = 512 * MiB
# Memory held by other processes above this is recorded and warned about.
OTHER_PROCESSES_WARN_BYTES = 256 * MiB
_CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class GPUDevice(JsonDataclass):
    """One GPU: as detected, or as the catalog describes it.

    Attributes:
        index: CUDA device index.
        name: What ``torch.cuda`` reports (e.g. "NVIDIA L4"), or the catalog name.
        total_bytes: Memory CUDA reports for the device (for a catalog device, the
            catalog's memory less its ECC reserve).
        free_bytes: Memory free when the profile was made (``total_bytes`` for a catalog device).
        used_by_others_bytes: Memory other processes held at detection (0 for a catalog device).
        compute_capability: e.g. "8.9".
        supports_bf16: True when the compute capability is 8.0 or higher.
    """

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_by_others_bytes: int
    compute_capability: str
    supports_bf16: bool

    def __post_init__(self) -> None:
        where = f"GPU {self.index} ({self.name})"
        if self.total_bytes <= 0:
            raise ConfigError(f"{where}: total_bytes must be > 0, got {self.total_bytes}.")
        if not 0 <= self.free_bytes <= self.total_bytes:
            raise ConfigError(
                f"{where}: free_bytes={self.free_bytes} must lie in [0, total_bytes]."
            )
        if not 0 <= self.used_by_others_bytes <= self.total_bytes:
            raise ConfigError(
                f"{where}: used_by_others_bytes={self.used_by_others_bytes} must lie in [0, total_bytes]."
            )

    @property
    def available_bytes(self) -> int:
        """Memory this process can have: total less what other processes hold."""
        return self.total_bytes - self.used_by_others_bytes


def detect_devices() -> list[GPUDevice]:
    """Every visible CUDA device, or [] without CUDA.

    Other processes' memory on a device is ``total - free - ours``, where ours is what NVML
    reports for this process or, failing that, what our caching allocator has reserved plus
    :data:`CUDA_CONTEXT_ALLOWANCE_BYTES`. Above :data:`OTHER_PROCESSES_WARN_BYTES` it warns.
    """
    import torch

    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free_bytes, total_bytes = (int(x) for x in torch.cuda.mem_get_info(index))
        reserved_bytes = int(torch.cuda.memory_reserved(index))
        own_bytes = _own_process_gpu_bytes(props)
        if own_bytes is None:
            own_bytes = reserved_bytes + CUDA_CONTEXT_ALLOWANCE_BYTES
        others = min(total_bytes, max(0, total_bytes - free_bytes - max(own_bytes, reserved_bytes)))
        device = GPUDevice(
            index=index,
            name=str(props.name),
            total_bytes=total_bytes,
            free_bytes=min(free_bytes, total_bytes),
            used_by_others_bytes=others,
            compute_capability=f"{props.major}.{props.minor}",
            supports_bf16=props.major >= 8,
        )
        if others > OTHER_PROCESSES_WARN_BYTES:
            warnings.warn(others_message(device), UserWarning, stacklevel=3)
        devices.append(device)
    return devices


def others_message(device: GPUDevice) -> str:
    """The sentence that reports memory other processes hold on ``device``."""
    return (
        f"GPU {device.index} ({device.name}): {format_gib(device.used_by_others_bytes)} of "
        f"{format_gib(device.total_bytes)} is held by other processes; plans use the "
        f"{format_gib(device.available_bytes)} left. Free it (see nvidia-smi) or plan for less."
    )


def _own_process_gpu_bytes(props: Any) -> int | None:
    """This process's memory on the device according to NVML, or None when NVML can't say.

    NVML is optional (``pynvml``); inside containers it often lists host PIDs that do not
    match ours, and then this returns None and the caller assumes a typical context size.
    """
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    try:
        pynvml.nvmlInit()
        try:
            text = str(uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(
                text if text.startswith("GPU-") else f"GPU-{text}"
            )
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVML errors are many and version-specific; detection goes on.
        logger.debug("NVML could not report this process's GPU memory: %s", exc)
    return None


def host_memory_bytes(cgroup_root: Path = _CGROUP_ROOT) -> tuple[int, int]:
    """Host RAM (total, available) in bytes, capped by a container's cgroup memory limit.

    Uses psutil when it is installed, else ``/proc/meminfo``, else ``os.sysconf``.

    Args:
        cgroup_root: Where the cgroup file system is mounted (a parameter for tests).
    """
    total, available = _system_memory_bytes()
    limit, usage = _cgroup_memory_bytes(cgroup_root)
    if limit is not None and 0 < limit < total:
        total = limit
        available = min(available, max(0, limit - (usage or 0)))
    return total, min(available, total)


def _system_memory_bytes() -> tuple[int, int]:
    # Linux: /proc/meminfo, what psutil reads there too, without importing it (a plan's
    # budget: 0.07 s of a warm plan)
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024  # values are in KiB
        total = fields["MemTotal"]
        return total, fields.get("MemAvailable", fields.get("MemFree", total))
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except ImportError:
        pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _cgroup_memory_bytes(root: Path) -> tuple[int | None, int | None]:
    """(limit, usage less reclaimable file cache) from cgroup v2 or v1, or (None, None)."""
    for limit_file, usage_file, stat_file, cache_key in (
        ("memory.max", "memory.current", "memory.stat", "inactive_file"),
        (
            "memory/memory.limit_in_bytes",
            "memory/memory.usage_in_bytes",
            "memory/memory.stat",
            "total_inactive_file",
        ),
    ):
        try:
            raw = (root / limit_file).read_text().strip()
        except OSError:
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= 2**60:
            return None, None
        try:
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            return int(raw), None
        try:
            for line in (root / stat_file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == cache_key:
                    usage -= int(value)
                    break
        except (OSError, ValueError):
            pass
        return int(raw), max(0, usage)
    return None, None


def cpu_count() -> int:
    """CPUs this process may run on: its affinity set where the OS has one, else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def format_gib(n_bytes: int) -> str:
    """``n_bytes`` as "12.34 GiB"."""
    return f"{n_bytes / GiB:.2f} GiB"


__all__ = [
    "CUDA_CONTEXT_ALLOWANCE_BYTES",
    "OTHER_PROCESSES_WARN_BYTES",
    "GPUDevice",
    "cpu_count",
    "detect_devices",
    "format_gib",
    "host_memory_bytes",
    "others_message",
]
