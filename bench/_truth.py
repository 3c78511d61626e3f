"""Ground truth for the memory simulator: a PLAIN real CPU training step, counted at the allocator.

Shared by ``bench/memory_accuracy.py``, ``bench/_grid.py`` and the tests.

:func:`measure_plain_step` runs ``steps`` real training steps (inputs, forward, loss,
backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``) with **no
TorchDispatchMode active**: autograd then makes its ordinary choices (stealing a fresh
gradient, accumulating in place when nothing else references a buffer), which a dispatch
mode changes (every tensor gets a Python wrapper that holds a reference). The bytes come
from the CPU allocator itself: ``torch.profiler.profile(profile_memory=True)`` records one
``[memory]`` event per allocation and free of the c10 CPU allocator, with a signed byte
count; the parameters and buffers are first copied to fresh storages inside the profile
(:func:`reallocate_state`: the allocator reports no free of a block it saw allocated before
profiling, so a buffer a module replaces in forward would otherwise stay counted), and
replaying the events in time order gives the bytes live at every instant. The harness
holds no reference to the model's tensors, so a replaced buffer is freed as in a plain run.
The profiler uses RecordFunction callbacks, not the dispatcher, so it changes no kernel
or autograd decision. Optimizer state appears in step 1; the steady-state peak is the
last step's (``record_function`` ranges mark the steps).

``tests/test_memory_truth.py`` checks this counter on closed-form steps.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd import DeviceType

STEP_MARK = "asrfit_bench_step_{}"


@dataclass
class PlainStep:
    """A real CPU step's allocator-level memory.

    Attributes:
        peak_bytes: Peak bytes live during the last step.
        step_peaks_bytes: Peak bytes live during each step.
        start_bytes: Bytes live when the last step starts.
        model_state_bytes: Parameters, buffers and optimizer state before the last step,
            summed by storage.
        seconds: Wall time of the steps (profiler on).
    """

    peak_bytes: int
    step_peaks_bytes: list[int]
    start_bytes: int
    model_state_bytes: int
    seconds: float

    @property
    def leftover_bytes(self) -> int:
        """Bytes live at the last step's start beyond the model states (caches, leaks)."""
        return self.start_bytes - self.model_state_bytes


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Sum of the storages' bytes behind ``tensors``, each storage counted once."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[(str(t.device), st.data_ptr() or id(st))] = st.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer, device: str = "cpu") -> list[torch.Tensor]:
    """Optimizer state tensors on ``device``."""
    return [
        v
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.device.type == device
    ]


def reallocate_state(model: nn.Module) -> list[torch.UntypedStorage]:
    """Move every parameter and buffer of ``model`` to a fresh copy of its storage, in place.

    Called inside the profile: the c10 CPU allocator reports the free of a block only if it
    saw the block's allocation while profiling (``ProfiledCPUMemoryReporter``), so a buffer
    allocated before the profile and replaced during it (wav2vec2-conformer's relative
    position table, cast to the autocast dtype on the first step) would stay counted in a
    replay that starts from the bytes live before the profile. After this call every byte of
    model state is allocated under the profiler and its free is reported. Storages shared by
    several tensors stay shared; the tensors' objects (and the optimizer's references to the
    parameters) are kept.

    Returns the old storages: free them after the profile. The allocator's size table keeps
    stale entries of blocks allocated in an earlier profile and freed outside one; a block
    allocated before this profile at such an address would be reported with the stale size
    if it were freed inside it.
    """
    copies: dict[int, torch.UntypedStorage] = {}
    old: list[torch.UntypedStorage] = []
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            storage = t.untyped_storage()
            key = storage.data_ptr() or id(storage)
            if key not in copies:
                copies[key] = storage.clone()
                old.append(storage)
            fresh = torch.empty(0, dtype=t.dtype, device=t.device)
            fresh.set_(copies[key], t.storage_offset(), t.size(), t.stride())
            t.data = fresh
    return old


def replay_cpu_profile(prof: Any, base_bytes: int, steps: int) -> tuple[list[int], int]:
    """(peak bytes live in each step, bytes live at the last step's start) from ``[memory]`` events."""
    events = list(prof.profiler.kineto_results.events())
    ranges = []
    for step in range(1, steps + 1):
        mark = STEP_MARK.format(step)
        found = [e for e in events if e.name() == mark]
        if len(found) != 1:
            raise RuntimeError(f"expected one {mark!r} range in the profile, found {len(found)}.")
        ranges.append((found[0].start_ns(), found[0].end_ns()))
    memory = sorted(
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(events)
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    )
    live = base_bytes
    peaks = [0] * steps
    last_start, at_start = ranges[-1][0], None
    for t_ns, _, nbytes in memory:
        if t_ns >= last_start and at_start is None:
            at_start = live
        live += nbytes
        for k, (a, b) in enumerate(ranges):
            if a <= t_ns <= b:
                peaks[k] = max(peaks[k], live)
    return peaks, base_bytes if at_start is None else at_start


def measure_plain_step(
    model: nn.Module,
    make_inputs: Callable[[], Any],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    autocast_dtype: torch.dtype | None = None,
    steps: int = 2,
) -> PlainStep:
    """Run ``steps`` plain CPU training steps and count their bytes at the allocator.

    Args:
        model: A real model on the CPU, in the mode to train in.
        make_inputs: Makes one batch (called inside each step, so the batch is counted).
        loss_fn: ``(model, batch) -> scalar loss``.
        optimizer: The optimizer over the model's trainable parameters.
        autocast_dtype: ``torch.autocast("cpu", dtype)`` around forward and loss, or None.
        steps: Steps to run (Default: 2; the last is measured).

    Returns:
        The allocator-level peaks.
    """
    gc.collect()
    model_state_bytes = storage_bytes([*model.parameters(), *model.buffers()])
    started = time.perf_counter()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        # Every byte of model state is allocated inside the profile, so its free is counted
        # too (a module may replace a buffer in forward); the replay then starts from 0.
        old_storages = reallocate_state(model)
        base_bytes = 0
        for step in range(1, steps + 1):
            if step == steps:
                model_state_bytes = storage_bytes(
                    [*model.parameters(), *model.buffers(), *optimizer_tensors(optimizer)]
                )
            with torch.profiler.record_function(STEP_MARK.format(step)):
                inputs = make_inputs()
                cast = (
                    torch.autocast("cpu", dtype=autocast_dtype)
                    if autocast_dtype is not None
                    else contextlib.nullcontext()
                )
                with cast:
                    loss = loss_fn(model, inputs)
                loss.backward()
                del loss, inputs
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    del old_storages  # freed after the profile: no event, as they had no allocation event
    seconds = time.perf_counter() - started
    peaks, start = replay_cpu_profile(prof, base_bytes, steps)
    return PlainStep(peaks[-1], peaks, start, model_state_bytes, seconds)


def real_inputs_from_adapter(adapter: Any, batch: Any, dtype: torch.dtype = torch.float32) -> dict:
    """Real tensors of the batch the simulator's adapter makes: same shapes and integer values.

    The adapter's integer inputs (labels, masks, decoder inputs) carry real values in the
    simulation; those values are reused, and float inputs (audio, features) become seeded
    standard normal noise of the same shape. The *measurement* stays independent of the
    simulator: only the batch definition is shared.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    from asrfit.memory.trace.tracker import StorageTracker

    tracker = StorageTracker()
    with FakeTensorMode():
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            fake = adapter.make_inputs(batch, tracker)
        finally:
            torch.set_default_dtype(previous)
        gen = torch.Generator().manual_seed(0)
        real: dict[str, Any] = {}
        with unset_fake_temporarily():
            for k, v in fake.items():
                value = tracker.value_of(v) if isinstance(v, torch.Tensor) else v
                if value is not None and isinstance(v, torch.Tensor):
                    real[k] = value.clone()
                elif isinstance(v, torch.Tensor):
                    real[k] = torch.randn(tuple(v.shape), generator=gen).to(v.dtype)
                else:
                    real[k] = v
    return real


def measure_adapter_step(
    adapter: Any, batch: Any, setup: Any, *, steps: int = 2, threads: int | None = None
) -> PlainStep:
    """Build ``adapter``'s model for real (seeded) and measure its plain CPU step under ``setup``.

    The model is built as the simulator builds it (same ``build``, default dtype, activation
    checkpointing, train mode), with the optimizer of
    :func:`asrfit.memory.trace.optimizers.make_optimizer`, except 8-bit AdamW, which is the real
    ``bitsandbytes.optim.AdamW8bit`` (the simulator models its state).
    """
    from asrfit.memory.real_step import build_model, float_dtype
    from asrfit.memory.setup import OptimizerKind, Precision
    from asrfit.memory.trace.optimizers import make_optimizer

    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = float_dtype(setup)
    model = build_model(adapter, setup)
    params = [p for p in model.parameters() if p.requires_grad]
    if setup.optimizer is OptimizerKind.ADAMW_8BIT:
        # the real bitsandbytes optimizer, not the simulator's model of its state
        import bitsandbytes

        optimizer = bitsandbytes.optim.AdamW8bit(params, lr=1e-4)
    else:
        optimizer = make_optimizer(setup, params)
    inputs = real_inputs_from_adapter(adapter, batch, dtype)
    autocast = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(setup.precision)
    if setup.precision is Precision.FP16:
        raise ValueError("fp16 needs a GradScaler step; measure bf16 or fp32 on the CPU.")

    def make() -> dict:
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def loss_fn(m: nn.Module, batch_inputs: dict) -> torch.Tensor:
        return adapter.loss(m, batch_inputs)

    return measure_plain_step(model, make, loss_fn, optimizer, autocast_dtype=autocast, steps=steps)
