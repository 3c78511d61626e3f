"""``HardwareProfile``: the GPUs a plan is made for, detected or taken from the catalog.

Three ways to get one:

- ``HardwareProfile.detect()`` reads every CUDA device through ``torch.cuda`` (name, total
  and free memory, compute capability), matches it to the GPU catalog by name, and notes
  memory other processes already hold. With no CUDA it returns a "cpu-only" profile.
- ``HardwareProfile.from_name("L4", num_gpus=2)`` plans for a GPU you do not have, from the
  catalog (:mod:`asrfit.profiles.gpus`); the host fields describe this machine.
- ``HardwareProfile.resolve(spec)`` does either: "auto" detects, anything else is a name.

The number a planner compares a predicted peak against is :attr:`HardwareProfile.usable_bytes`:
per-device memory that this process can have, times the safety margin (default 0.85). The
margin covers what a one-step simulation cannot see: allocator fragmentation across steps,
library workspaces, memory that grows late in training.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field

from asrfit.errors import ConfigError
from asrfit.profiles.gpus.catalog import (
    GPUSpec,
    find_gpu,
    list_gpus,
    match_detected_gpu,
    precision_key,
    resolve_gpu_name,
)
from asrfit.profiles.gpus.probe import (
    CUDA_CONTEXT_ALLOWANCE_BYTES,
    OTHER_PROCESSES_WARN_BYTES,
    GPUDevice,
    cpu_count,
    detect_devices,
    format_gib,
    host_memory_bytes,
    others_message,
)
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

DEFAULT_SAFETY_MARGIN = 0.85
MIN_SAFETY_MARGIN = 0.5
MAX_SAFETY_MARGIN = 0.98
SOURCES = ("detected", "catalog", "cpu-only")
AUTO = "auto"


@dataclass
class HardwareProfile(JsonDataclass):
    """The hardware a plan is made for.

    Attributes:
        source: "detected" (read from this machine's GPUs), "catalog" (from a GPU name)
            or "cpu-only" (no CUDA device).
        gpus: One entry per device; empty for "cpu-only".
        spec: The matched catalog entry, or None (cpu-only, or a detected GPU that is not
            in the catalog: then peak TFLOP/s and bandwidth are unknown).
        host_total_bytes: Host RAM (capped by a container's cgroup limit).
        host_available_bytes: Host RAM available when the profile was made.
        cpu_count: CPUs this process may run on (``os.sched_getaffinity``).
        safety_margin: Share of per-device memory a plan may fill, 0.5 to 0.98.
        requested_name: The name the profile was made from ("auto" when detected).
        notes: What a reader should know, e.g. memory other processes hold.
    """

    source: str
    gpus: list[GPUDevice]
    spec: GPUSpec | None
    host_total_bytes: int
    host_available_bytes: int
    cpu_count: int
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    requested_name: str = ""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        margin = self.safety_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or math.isnan(margin):
            raise ConfigError(
                f"safety_margin must be a number between {MIN_SAFETY_MARGIN} and "
                f"{MAX_SAFETY_MARGIN}, got {margin!r}."
            )
        if not MIN_SAFETY_MARGIN <= margin <= MAX_SAFETY_MARGIN:
            raise ConfigError(
                f"safety_margin={margin} is outside the allowed range {MIN_SAFETY_MARGIN} to "
                f"{MAX_SAFETY_MARGIN}; use e.g. 0.85 (the default), lower to leave more headroom."
            )
        self.safety_margin = float(margin)
        if self.source not in SOURCES:
            raise ConfigError(f"source={self.source!r} is not one of {', '.join(SOURCES)}.")
        if (self.source == "cpu-only") != (not self.gpus):
            raise ConfigError(
                f"source={self.source!r} with {len(self.gpus)} GPU(s): a cpu-only profile has "
                "no GPUs and any other has at least one."
            )
        if self.source == "catalog" and self.spec is None:
            raise ConfigError("source='catalog' needs the catalog entry in 'spec'.")
        if self.cpu_count < 1:
            raise ConfigError(f"cpu_count must be >= 1, got {self.cpu_count}.")
        if self.host_total_bytes < 0 or self.host_available_bytes < 0:
            raise ConfigError("host_total_bytes and host_available_bytes must be >= 0.")

    # ---------------------------------------------------------------- constructors

    @classmethod
    def from_name(
        cls, name: str, safety_margin: float = DEFAULT_SAFETY_MARGIN, num_gpus: int = 1
    ) -> HardwareProfile:
        """Plan for ``num_gpus`` catalog GPUs called ``name``; host fields describe this machine.

        Names match loosely ("t4", "a100 80gb", "A100_80GB", "rtx4090", "NVIDIA L4"). A bare
        family name resolves to its documented default with a warning: "A100" -> A100-40GB
        (the smaller memory, so the plan also fits the 80 GB card), "H100" -> H100-80GB
        (SXM5), "V100" -> V100-16GB.

        Args:
            name: A catalog name or alias.
            safety_margin: Share of per-device memory a plan may fill (0.5 to 0.98).
            num_gpus: How many such GPUs (data parallel).

        Returns:
            A "catalog" profile.

        Raises:
            UnknownGPUError: When the name matches nothing; the message lists close names.
            ConfigError: On a bad ``num_gpus`` or ``safety_margin``.
        """
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
            raise ConfigError(f"num_gpus must be an integer >= 1, got {num_gpus!r}.")
        spec, note = resolve_gpu_name(name)
        if note:
            warnings.warn(note, UserWarning, stacklevel=2)
        visible = spec.visible_memory_bytes
        gpus = [
            GPUDevice(
                index=i,
                name=spec.name,
                total_bytes=visible,
                free_bytes=visible,
                used_by_others_bytes=0,
                compute_capability=spec.compute_capability,
                supports_bf16=spec.supports_bf16,
            )
            for i in range(num_gpus)
        ]
        notes = [note] if note else []
        if spec.ecc_reserved_fraction:
            notes.append(
                f"{spec.name} ships with ECC on, which reserves {spec.ecc_reserved_fraction:.2%} "
                f"of its {format_gib(spec.memory_bytes)}; CUDA sees {format_gib(visible)}."
            )
        host_total, host_available = host_memory_bytes()
        return cls(
            source="catalog",
            gpus=gpus,
            spec=spec,
            host_total_bytes=host_total,
            host_available_bytes=host_available,
            cpu_count=cpu_count(),
            safety_margin=safety_margin,
            requested_name=name,
            notes=notes,
        )

    @classmethod
    def detect(
        cls, safety_margin: float = DEFAULT_SAFETY_MARGIN, num_gpus: int | None = None
    ) -> HardwareProfile:
        """Read this machine: every visible CUDA device, host RAM and CPUs.

        Each device is matched to the catalog by name (peak TFLOP/s, bandwidth). When other
        processes hold more than 256 MiB on a device, the amount is recorded in
        ``used_by_others_bytes``, noted, and warned about; :attr:`usable_bytes` is then based
        on what is left. With no CUDA device the profile is "cpu-only" and ``usable_bytes``
        is host RAM available times the margin.

        Args:
            safety_margin: Share of per-device memory a plan may fill (0.5 to 0.98).
            num_gpus: Use only the first ``num_gpus`` devices; None uses all of them.

        Returns:
            A "detected" or "cpu-only" profile.

        Raises:
            ConfigError: When more GPUs are asked for than are visible, or on a bad margin.
        """
        devices = detect_devices()
        if num_gpus is not None:
            if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
                raise ConfigError(f"num_gpus must be an integer >= 1, got {num_gpus!r}.")
            if num_gpus > len(devices):
                raise ConfigError(
                    f"num_gpus={num_gpus} but this machine shows {len(devices)} CUDA device(s); "
                    "ask for fewer, or plan for a GPU by name (e.g. --gpu A100-80GB)."
                )
            devices = devices[:num_gpus]
        host_total, host_available = host_memory_bytes()
        notes: list[str] = []
        spec: GPUSpec | None = None
        if not devices:
            notes.append("No CUDA device: usable memory refers to host RAM available.")
        else:
            matches = [match_detected_gpu(d.name, d.total_bytes) for d in devices]
            names = {m.name if m else None for m in matches}
            spec = matches[0] if len(names) == 1 else None
            if spec is None:
                what = "differ" if len(names) > 1 else "are not in the catalog"
                notes.append(f"Detected GPUs {what}: peak TFLOP/s and bandwidth are unknown.")
            for device in devices:
                if device.used_by_others_bytes > OTHER_PROCESSES_WARN_BYTES:
                    notes.append(others_message(device))
        return cls(
            source="detected" if devices else "cpu-only",
            gpus=devices,
            spec=spec,
            host_total_bytes=host_total,
            host_available_bytes=host_available,
            cpu_count=cpu_count(),
            safety_margin=safety_margin,
            requested_name=AUTO,
            notes=notes,
        )

    @classmethod
    def resolve(
        cls, spec: str, safety_margin: float = DEFAULT_SAFETY_MARGIN, num_gpus: int | None = None
    ) -> HardwareProfile:
        """``"auto"`` detects this machine; anything else is a catalog name.

        Args:
            spec: "auto" or a GPU name.
            safety_margin: Share of per-device memory a plan may fill (0.5 to 0.98).
            num_gpus: For a name, how many GPUs (None means 1); for "auto", how many of the
                detected devices to use (None means all).

        Raises:
            UnknownGPUError: For a name not in the catalog.
            ConfigError: On a bad margin or GPU count.
        """
        if isinstance(spec, str) and spec.strip().lower() == AUTO:
            return cls.detect(safety_margin=safety_margin, num_gpus=num_gpus)
        return cls.from_name(spec, safety_margin=safety_margin, num_gpus=num_gpus or 1)

    # ------------------------------------------------------------------ properties

    @property
    def num_gpus(self) -> int:
        """Number of GPUs (0 for cpu-only)."""
        return len(self.gpus)

    @property
    def gpu_memory_bytes(self) -> int:
        """Memory per device as CUDA reports it (the smallest device when they differ; 0 without GPUs)."""
        return min((d.total_bytes for d in self.gpus), default=0)

    @property
    def available_bytes(self) -> int:
        """What this process can have per device: total less other processes' memory.

        The smallest over devices; for cpu-only, host RAM available.
        """
        if not self.gpus:
            return self.host_available_bytes
        return min(d.available_bytes for d in self.gpus)

    @property
    def usable_bytes(self) -> int:
        """The per-device budget a plan may fill: :attr:`available_bytes` x ``safety_margin``.

        For a catalog GPU that is the memory CUDA would report times the margin; for a
        detected GPU it excludes memory other processes hold; for cpu-only it is host RAM
        available times the margin.
        """
        return round(self.available_bytes * self.safety_margin)

    @property
    def supports_bf16(self) -> bool:
        """True when every GPU computes in bf16 (compute capability >= 8.0); False for cpu-only."""
        return bool(self.gpus) and all(d.supports_bf16 for d in self.gpus)

    @property
    def memory_bandwidth_bytes_per_second(self) -> int | None:
        """Peak memory bandwidth per device from the catalog, or None when unknown."""
        return self.spec.memory_bandwidth_bytes_per_second if self.spec else None

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak TFLOP/s per device for "fp32", "tf32", "fp16" or "bf16".

        Returns:
            The catalog peak, or None when the GPU lacks the format (bf16 on a T4) or is
            not in the catalog (cpu-only, or an unknown detected GPU).

        Raises:
            ConfigError: When ``precision`` is not one of the four names.
        """
        key = precision_key(precision)
        return None if self.spec is None else self.spec.peak_tflops(key)

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for the CLI's table."""
        rows: list[tuple[str, str]] = []
        source = self.source
        if self.source == "catalog":
            source = f"catalog (from {self.requested_name!r})"
        rows.append(("Source", source))
        if self.gpus:
            names = sorted({d.name for d in self.gpus})
            rows.append(("GPUs", f"{self.num_gpus} x {', '.join(names)}"))
        if self.spec is not None:
            s = self.spec
            rows.append(
                ("Catalog entry", f"{s.name} ({s.architecture}, {s.form_factor}, {s.memory_type})")
            )
        if self.gpus:
            rows.append(("Memory per GPU", format_gib(self.gpu_memory_bytes)))
            others = max(d.used_by_others_bytes for d in self.gpus)
            if others:
                rows.append(
                    ("Held by other processes", f"{format_gib(others)} (excluded from usable)")
                )
        basis = "of host RAM available" if not self.gpus else "per GPU"
        rows.append(
            (
                "Usable memory",
                f"{format_gib(self.usable_bytes)} {basis} (x{self.safety_margin:g} margin)",
            )
        )
        if self.gpus:
            cc = sorted({d.compute_capability for d in self.gpus})
            bf16 = "yes" if self.supports_bf16 else "no"
            rows.append(("Compute capability", f"{', '.join(cc)} (bf16: {bf16})"))
        if self.spec is not None:
            peaks = " / ".join(
                _tflops(self.peak_tflops(p)) for p in ("bf16", "fp16", "tf32", "fp32")
            )
            rows.append(("Peak bf16 / fp16 / tf32 / fp32", f"{peaks} TFLOP/s (dense)"))
            bandwidth = self.spec.memory_bandwidth_bytes_per_second / 1e9
            rows.append(("Memory bandwidth", f"{bandwidth:g} GB/s"))
            rows.append(("Figures from", self.spec.source.title))
        rows.append(
            (
                "Host RAM",
                f"{format_gib(self.host_available_bytes)} available of {format_gib(self.host_total_bytes)}",
            )
        )
        rows.append(("CPUs", str(self.cpu_count)))
        rows.extend(("Note", note) for note in self.notes)
        return rows


# ---------------------------------------------------------------------- formatting


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


__all__ = [
    "CUDA_CONTEXT_ALLOWANCE_BYTES",
    "DEFAULT_SAFETY_MARGIN",
    "OTHER_PROCESSES_WARN_BYTES",
    "GPUDevice",
    "GPUSpec",
    "HardwareProfile",
    "cpu_count",
    "find_gpu",
    "host_memory_bytes",
    "list_gpus",
]
