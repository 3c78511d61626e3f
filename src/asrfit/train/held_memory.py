"""The bytes a real pass holds above what was live before it, on the CPU or on CUDA.

The pre-flight (:mod:`asrfit.train.preflight`) compares this with the plan's prediction of
the same pass.

- CUDA: ``torch.cuda.max_memory_reserved`` over the pass minus ``memory_reserved`` before
  it, after cached blocks were returned (``empty_cache``), so a block cached by an earlier
  pass is not reused unseen.
- CPU: the c10 CPU allocator's own allocation and free events
  (``torch.profiler.profile(profile_memory=True)``, one signed ``[memory]`` event each),
  replayed in time order; the largest running sum is the peak. The profiler hooks record
  functions, not the dispatcher, so it changes no kernel or autograd decision (a
  ``TorchDispatchMode`` would: every tensor gets a wrapper that holds a reference).

Known limitations: on the CPU, the allocator reports the free of a block only when it saw the
block's allocation while profiling, so a block allocated before the pass and freed inside it
is not subtracted (the measure can only be high by such blocks, never low); what a library
allocates outside the c10 allocator (oneDNN's own scratch buffers) is not seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def held_bytes(fn: Callable[[], T], device: torch.device) -> tuple[T, int | None]:
    """Run ``fn`` and measure the peak bytes it held above what was live when it started.

    Args:
        fn: The pass to measure (e.g. one forward and backward).
        device: Where it runs: ``cuda`` and ``cpu`` are measured; others are not.

    Returns:
        ``(fn's result, held bytes)``; held bytes is None on other devices, and on the CPU
        while a ``torch.profiler`` profile is already running.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        before = int(torch.cuda.memory_reserved(device))
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, max(0, int(torch.cuda.max_memory_reserved(device)) - before)
    if device.type != "cpu" or torch.autograd.profiler._is_profiler_enabled:
        return fn(), None  # another device, or a profile already running (they do not nest)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        out = fn()
    return out, peak_of_memory_events(prof)


def peak_of_memory_events(prof: Any) -> int:
    """The largest running sum of a CPU profile's allocator events (0 when it has none)."""
    from torch.autograd import DeviceType

    events = list(prof.profiler.kineto_results.events())
    deltas = sorted(
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(events)
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    )
    live = peak = 0
    for _, _, nbytes in deltas:
        live += nbytes
        peak = max(peak, live)
    return peak


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of the storages behind the model's gradients, each storage counted once."""
    seen: dict[tuple[str, int], int] = {}
    for p in model.parameters():
        if p.grad is not None:
            storage = p.grad.untyped_storage()
            seen[(str(p.grad.device), storage.data_ptr() or id(storage))] = storage.nbytes()
    return sum(seen.values())


__all__ = ["gradient_bytes", "held_bytes", "peak_of_memory_events"]
