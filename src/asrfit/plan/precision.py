"""Which precision a GPU can train in, and why.

bf16 needs compute capability 8.0 or higher (Ampere, Ada, Hopper, Blackwell). A T4 (7.5) or
V100 (7.0) has no bf16 units: PyTorch emulates bf16 there at a fraction of the speed, so a
plan in bf16 for such a GPU would predict a throughput nobody gets. On those GPUs asrfit
trains in fp16 autocast with dynamic loss scaling (Accelerate's ``GradScaler``), the
standard recipe for Volta and Turing.
"""

from __future__ import annotations

from typing import Any

from asrfit.errors import ConfigError

#: Precisions that compute in bfloat16.
BF16_PRECISIONS = ("bf16", "pure_bf16")


def _gpu_words(gpu: Any) -> tuple[str, str | None, bool | None]:
    """``(name, compute capability, supports bf16)`` of a GPUSpec or HardwareProfile (or None)."""
    if gpu is None:
        return "", None, None
    spec = getattr(gpu, "spec", gpu)
    gpus = getattr(gpu, "gpus", None)
    if gpus is not None and not gpus:  # a HardwareProfile without GPUs (planning for the CPU)
        return "CPU", None, None
    name = getattr(spec, "name", None) or str(gpu)
    capability = getattr(spec, "compute_capability", None)
    supports = getattr(gpu, "supports_bf16", None)
    if supports is None:
        supports = getattr(spec, "supports_bf16", None)
    return name, capability, supports


def check_precision(precision: str | None, gpu: Any) -> None:
    """Refuse a bf16 precision on a GPU without bf16, saying why and what to use.

    Args:
        precision: The requested precision ("fp32", "bf16", "fp16", "pure_bf16"), or None.
        gpu: A ``GPUSpec`` or ``HardwareProfile`` (None: nothing to check).

    Raises:
        ConfigError: ``precision`` computes in bf16 and the GPU cannot.
    """
    name, capability, supports = _gpu_words(gpu)
    if precision is None or str(precision) not in BF16_PRECISIONS or supports is not False:
        return
    cc = f" (compute capability {capability})" if capability else ""
    raise ConfigError(
        f"precision {precision}: the {name}{cc} has no bf16 units (they start at compute "
        "capability 8.0, Ampere); bf16 would run emulated and slow. Use fp16 (autocast with "
        "loss scaling) or fp32, or leave the precision out to choose by GPU."
    )


def choose_precision(precision: str | None, gpu: Any) -> tuple[str, str]:
    """The precision to use and the reason, in words.

    Args:
        precision: What the user asked for, or None / "auto" to choose by GPU.
        gpu: A ``GPUSpec`` or ``HardwareProfile``, or None when no GPU was named.

    Returns:
        ``(precision, reason)``.

    Raises:
        ConfigError: An explicit bf16 precision on a GPU without bf16 (see :func:`check_precision`).
    """
    name, capability, supports = _gpu_words(gpu)
    cc = f" (compute capability {capability})" if capability else ""
    if precision not in (None, "auto"):
        check_precision(precision, gpu)
        return str(precision), "as asked"
    if name == "CPU":
        return "fp32", (
            "training on the CPU: fp32 (bf16 autocast, --precision bf16, pays only on a CPU with "
            "native bf16, and little there: docs/history.md, bf16 autocast on the CPU)"
        )
    if gpu is None:
        return (
            "bf16",
            "no GPU named: assumes one with bf16 (compute capability 8.0+); name the GPU for a T4 or V100",
        )
    if supports:
        return "bf16", f"the {name}{cc} computes in bf16 (same range as fp32, no loss scaling)"
    return "fp16", f"the {name}{cc} has no bf16: fp16 autocast with dynamic loss scaling"


def fit_words(memory: Any) -> str:
    """How close a fitted peak model is to its traced points, in bytes a reader can judge.

    The fit never predicts below a traced point, so it overestimates the smallest batches
    most; a relative residual of a 50 MiB batch (say 170 %) alarms without cause, while the
    bytes say how much memory the plan leaves unused.

    Args:
        memory: A ``PeakModel``.

    Returns:
        e.g. ``"memory model fitted to 5 traced batches, at most 34 MiB above any (never below)"``.
    """
    points = getattr(memory, "points", []) or []
    if not points:
        return "memory model without traced points"
    over = [memory.predict(b, t, u) - peak for b, t, u, peak in points]
    return (
        f"memory model fitted to {len(points)} traced batches, at most "
        f"{max(0.0, max(over)) / 2**20:.0f} MiB above any (never below)"
    )
