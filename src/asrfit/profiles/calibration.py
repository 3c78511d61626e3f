"""Calibration files: what ``asrfit calibrate`` measured on this machine, and how plans use it.

A trace cannot know this machine's host cost per kernel in real model code, the rates its
device reaches at a plan's shapes, or the memory that libraries hold beyond the traced
tensors (cuDNN's convolution and RNN workspaces, the caching allocator's fragmentation at
full size). ``asrfit calibrate`` measures them (``asrfit.train.calibrate``) and writes one
:class:`Calibration` per machine, keyed by :func:`machine_key` (the GPU's name, driver,
CUDA and torch; for the CPU its model, cores, threads and torch), under
``<cache>/calibration/``.

Plans made for this machine (``--gpu auto``, or the CPU) then rest on it:

- step time: :meth:`Calibration.apply` scales the catalog's (or the micro-benchmarks') host
  costs and device rates by what real steps of a real model took (:attr:`host_scale`,
  :attr:`device_scale`), after replacing the figures it measured directly;
- memory: :meth:`Calibration.unmodelled_bytes` is kept free of every bucket: the bytes a real
  step held above its prediction at the calibration's largest shape, plus reserved memory
  beyond the allocator model's fragmentation allowance.

A plan for a GPU named from the catalog (``--gpu T4`` on a machine without one) has no
calibration and says so in ``rests_on``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError
from asrfit.profiles.rates import DeviceRates
from asrfit.utils.io import atomic_write_text
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

CALIBRATION_VERSION = 1
# A scale measured outside this range means the calibration step did not measure what it
# should (a machine busy with other work, a step that was not host- or device-bound):
# calibrate refuses to write it.
SCALE_RANGE = (0.05, 20.0)


@dataclass
class Calibration(JsonDataclass):
    """One machine's measured corrections to the catalog and micro-benchmark figures.

    Attributes:
        key: :func:`machine_key` of the machine it was measured on.
        written: When it was measured (ISO 8601, UTC).
        device: "cuda" or "cpu".
        rates: The device's :class:`DeviceRates` with the figures measured directly
            (host cost per kernel and per module call, matmul, convolution and bandwidth
            rates), before :attr:`host_scale` and :attr:`device_scale`.
        host_scale: Measured over predicted host time per kernel and module call in real
            model code (a real step at a small, host-bound batch).
        device_scale: Measured over predicted device (arithmetic) time at a large,
            device-bound batch.
        unmodelled_peak_bytes: Bytes a real step held above the traced prediction at the
            calibration's largest shape (cuDNN workspaces and other library buffers); None
            when not measured (no GPU, or no model step).
        reserved_over_allocated: ``max_memory_reserved / max_memory_allocated`` of those
            real steps; None when not measured.
        fragmentation_modelled: The allocator model's own allowance (reserved over
            allocated) that :attr:`reserved_over_allocated` is compared with.
        model: The model whose real steps were timed.
        measurements: The raw figures behind each field (shapes, seconds, bytes).
        seconds: How long the calibration took.
    """

    key: dict[str, Any]
    written: str
    device: str
    rates: dict[str, Any]
    host_scale: float = 1.0
    device_scale: float = 1.0
    unmodelled_peak_bytes: int | None = None
    reserved_over_allocated: float | None = None
    fragmentation_modelled: float = 1.0
    model: str = ""
    measurements: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    version: int = CALIBRATION_VERSION

    def __post_init__(self) -> None:
        for name in ("host_scale", "device_scale"):
            value = getattr(self, name)
            if not SCALE_RANGE[0] <= value <= SCALE_RANGE[1]:
                raise ConfigError(
                    f"calibration {name}={value:.3g} is outside {SCALE_RANGE[0]}-{SCALE_RANGE[1]}: "
                    "the timed steps did not measure this machine (was it busy?); run "
                    "asrfit calibrate again on an idle machine."
                )

    def apply(self) -> DeviceRates:
        """The calibrated rates: measured figures, host costs x :attr:`host_scale`, device
        rates / :attr:`device_scale`."""
        return scaled_rates(
            DeviceRates.from_dict(self.rates), self.host_scale, self.device_scale, self.where()
        )

    def unmodelled_bytes(self, usable_bytes: int) -> int:
        """Bytes of ``usable_bytes`` to keep free for what the trace does not model.

        The peak bytes measured above the prediction, plus the share of reserved memory
        beyond the modelled fragmentation allowance, applied to the usable memory.
        """
        extra = max(0, self.unmodelled_peak_bytes or 0)
        if self.reserved_over_allocated is not None:
            excess = max(0.0, self.reserved_over_allocated / self.fragmentation_modelled - 1.0)
            extra += int(usable_bytes * excess / (1.0 + excess))
        return min(extra, usable_bytes)

    def where(self) -> str:
        """One phrase naming the calibration, e.g. ``calibrated on NVIDIA L4 (<date>)``."""
        return f"calibrated on {self.key.get('device', self.device)} ({self.written[:10]})"


def scaled_rates(
    rates: DeviceRates, host_scale: float, device_scale: float, source: str
) -> DeviceRates:
    """``rates`` with every host (per-kernel, per-module) cost x ``host_scale`` and every
    device rate / ``device_scale`` (on a CPU both act on the same per-op figures: fixed
    costs are the host's, rates the arithmetic's)."""
    data = rates.to_dict()
    for name in ("kernel_seconds", "forward_kernel_seconds", "module_seconds"):
        data[name] = data[name] * host_scale
    for name in ("optimizer_kernel_seconds", "int_kernel_seconds"):
        if data.get(name) is not None:
            data[name] = data[name] * host_scale
    if data.get("kernel_seconds_by_kind"):
        data["kernel_seconds_by_kind"] = {
            k: [v * host_scale for v in pair] for k, pair in data["kernel_seconds_by_kind"].items()
        }
    for name in ("matmul_flops_per_second", "conv_flops_per_second", "attention_flops_per_second"):
        if data.get(name):
            data[name] = {k: v / device_scale for k, v in data[name].items()}
    data["memory_bytes_per_second"] = data["memory_bytes_per_second"] / device_scale
    if data.get("kind_bytes_per_second"):
        data["kind_bytes_per_second"] = {
            k: v / device_scale for k, v in data["kind_bytes_per_second"].items()
        }
    if data.get("rate_curves"):
        data["rate_curves"] = {
            kind: {
                dtype: [[x, y / device_scale] for x, y in points] for dtype, points in by.items()
            }
            for kind, by in data["rate_curves"].items()
        }
    if data.get("attention_seconds"):
        data["attention_seconds"] = {
            dtype: {
                way: [[n, d, s * device_scale] for n, d, s in points] for way, points in by.items()
            }
            for dtype, by in data["attention_seconds"].items()
        }
    data["sources"] = [
        *data.get("sources", []),
        f"{source}: host costs x {host_scale:.3g}, device rates / {device_scale:.3g}",
    ]
    return DeviceRates.from_dict(data)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the platform's); read once a process."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _torch_version() -> str:
    """torch's installed version, read once a process (the planner builds a machine key for
    every bucket it sizes: reading the package metadata each time took 2 s a plan)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return "unknown"


def machine_key(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """What a calibration is valid for.

    Args:
        device: "cpu", or "cuda" (the current CUDA device).
        threads: CPU threads (Default: ``torch.get_num_threads()``); CPU keys only.

    Returns:
        ``{"device", "driver", "cuda", "torch"}`` for a GPU, ``{"device", "cores",
        "threads", "torch"}`` for the CPU.
    """
    import torch

    if device.startswith("cuda"):
        index = torch.cuda.current_device()
        driver = "unknown"
        with contextlib.suppress(AttributeError, RuntimeError):
            driver = str(torch._C._cuda_getDriverVersion())  # the CUDA driver API version
        return {
            "device": torch.cuda.get_device_name(index),
            "driver": driver,
            "cuda": torch.version.cuda or "unknown",
            "torch": torch.__version__,
        }
    return {
        "device": f"cpu: {cpu_model()}",
        "cores": os.cpu_count(),
        "threads": threads or torch.get_num_threads(),
        "torch": _torch_version(),
    }


def calibration_dir() -> Path | None:
    """``<cache>/calibration`` (the cache folder of ``ASRFIT_CACHE_DIR``, default
    ``~/.cache/asrfit``), or None when ``ASRFIT_CACHE_DIR=off``."""
    value = os.environ.get("ASRFIT_CACHE_DIR", "")
    if value.lower() == "off":
        return None
    return (Path(value) if value else Path.home() / ".cache" / "asrfit") / "calibration"


def calibration_path(key: dict[str, Any]) -> Path | None:
    """The file a calibration of ``key`` is written to and read from."""
    folder = calibration_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in str(key["device"]).lower()).strip("-")
    return folder / f"{slug[:40]}-{digest}.json"


def write_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    """Write ``calibration`` atomically to ``path`` (Default: :func:`calibration_path`)."""
    path = path or calibration_path(calibration.key)
    if path is None:
        raise ConfigError("ASRFIT_CACHE_DIR=off: give calibrate an --out file to write to.")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(calibration.to_dict(), indent=1) + "\n")
    return path


def read_calibration(path: Path) -> Calibration:
    """Read a calibration file.

    Raises:
        ConfigError: When it is unreadable or not a calibration of this version.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        calibration = Calibration.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"{path}: not a readable asrfit calibration ({exc}); run asrfit calibrate again."
        ) from exc
    if calibration.version != CALIBRATION_VERSION:
        raise ConfigError(
            f"{path}: calibration format {calibration.version}, this asrfit reads "
            f"{CALIBRATION_VERSION}; run asrfit calibrate again."
        )
    return calibration


def find_calibration(
    device: str = "cpu", threads: int | None = None
) -> tuple[Calibration, Path] | None:
    """This machine's calibration for ``device``, or None when there is none (or it is
    unreadable: then a warning says so and the plan rests on uncalibrated figures)."""
    path = calibration_path(machine_key(device, threads))
    if path is None or not path.exists():
        return None
    try:
        return read_calibration(path), path
    except ConfigError as exc:
        logger.warning("%s Planning without it.", exc)
        return None


def calibration_for(hardware: Any, threads: int | None = None) -> tuple[Calibration, Path] | None:
    """The calibration a plan for ``hardware`` rests on: this machine's, when the plan is for
    this machine (a detected GPU, or the CPU); None for a GPU named from the catalog."""
    source = getattr(hardware, "source", None)
    if source == "cpu-only":
        return find_calibration("cpu", threads)
    if source == "detected":
        return find_calibration("cuda")
    return None


def rests_on_line(found: tuple[Calibration, Path] | None, hardware: Any) -> str:
    """The plan's ``rests_on`` sentence about calibration."""
    if found is None:
        if getattr(hardware, "source", None) == "catalog":
            return (
                "calibration: none (a GPU named from the catalog: step time on its catalog "
                "figures; run asrfit calibrate on that GPU to measure them)"
            )
        return (
            "calibration: none for this machine (step time on catalog and micro-benchmark "
            "figures; asrfit calibrate measures real steps here)"
        )
    calibration, path = found
    parts = [
        f"calibration: {path} ({calibration.where()}, model {calibration.model or '-'}): "
        f"host costs x {calibration.host_scale:.2f}, device rates / "
        f"{calibration.device_scale:.2f}"
    ]
    if calibration.unmodelled_peak_bytes is not None:
        parts.append(
            f"{calibration.unmodelled_peak_bytes / 2**20:.0f} MiB measured above the traced peak"
        )
    if calibration.reserved_over_allocated is not None:
        parts.append(f"reserved / allocated {calibration.reserved_over_allocated:.3f} measured")
    return "; ".join(parts)
