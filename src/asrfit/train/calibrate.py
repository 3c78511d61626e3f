"""``asrfit calibrate``: measure in seconds what a trace cannot know about this machine.

Four measurements, each written to the :class:`~asrfit.profiles.calibration.Calibration`:

1. **Direct rates.** On a GPU: the host's cost per kernel by kind, per integer kernel, per
   optimizer kernel (:mod:`asrfit.profiles.host_kernels` on CUDA tensors) and per module
   call; matmul FLOP/s at fp32, bf16 and fp16, convolution FLOP/s and copy bandwidth at
   training-sized shapes. On the CPU: the planner's micro-benchmarks
   (:func:`asrfit.profiles.host.measure_host_rates`), which a plan then reuses.
2. **Real steps of a real model.** The model (``--model``, else the built-in
   ``conformer-ctc-small``) is simulated and then run for real at a small, host-bound batch
   and at a large batch; measured seconds are solved for one scale on the host's costs and
   one on the device's arithmetic (:func:`solve_scales`), so that what real model code costs
   beyond a micro-benchmark chain is carried into every plan for this machine.
3. **Memory above the trace (GPU).** At the large batch: ``max_memory_allocated`` over the
   second step against the traced peak plus cuBLAS's workspace (cuDNN's convolution and RNN
   workspaces and any other library buffer show here), and ``max_memory_reserved`` over
   ``max_memory_allocated`` against the allocator model's own ratio.
4. The machine's key (GPU, driver, CUDA, torch; or CPU, cores, threads, torch) and the date.

The large batch is sized from the data when a manifest is given (its longest utterance),
else from the model's window (or 16 s); on a GPU its batch fills about a third of the free
memory by prediction.
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from asrfit.errors import ConfigError
from asrfit.memory.real_step import build_model, make_step, real_inputs
from asrfit.memory.setup import Precision, Setup
from asrfit.memory.step import BatchShape
from asrfit.memory.steptime.roofline import step_seconds_parts
from asrfit.profiles.calibration import (
    SCALE_RANGE,
    Calibration,
    machine_key,
    write_calibration,
)
from asrfit.profiles.rates import DeviceRates
from asrfit.train.engines import configure_cuda_allocator

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "conformer-ctc-small"
GPU_FILL = 1 / 3  # share of free GPU memory the large calibration batch fills by prediction
CPU_LARGE_SECONDS = 4.0  # the CPU's large batch: 4 utterances of 4 s (a second or so a step)
MAX_BATCH = 64


@dataclass
class TimedShape:
    """One batch shape timed for real beside its prediction's parts."""

    batch: BatchShape
    measured_seconds: float
    fixed_seconds: float
    host_seconds: float
    arithmetic_seconds: float
    predicted_peak_bytes: int
    predicted_segment_bytes: int
    measured_peak_bytes: int | None = None
    measured_reserved_bytes: int | None = None


def solve_scales(small: TimedShape, large: TimedShape, gpu: bool) -> tuple[float, float]:
    """``(host_scale, device_scale)`` that make both shapes' predictions equal their
    measurements.

    A GPU step is predicted as ``fixed + host x h + arithmetic x d`` (the device's launch
    gaps, the host's per-kernel work, the roofline), a CPU step as ``host x h + arithmetic
    x d`` (on a CPU the per-op fixed cost is the host's). Two shapes, two unknowns: solved
    exactly when the system is well conditioned and both scales come out positive, else
    one after the other (``h`` from the small shape with ``d = 1``, then ``d`` from the
    large), each clamped to :data:`~asrfit.profiles.calibration.SCALE_RANGE`.
    """

    def parts(s: TimedShape) -> tuple[float, float, float]:
        host = s.host_seconds if gpu else s.fixed_seconds
        base = s.fixed_seconds if gpu else 0.0
        return s.measured_seconds - base, host, s.arithmetic_seconds

    (m1, h1, a1), (m2, h2, a2) = parts(small), parts(large)
    det = h1 * a2 - h2 * a1
    low, high = SCALE_RANGE
    if abs(det) > 1e-3 * abs(h1 * a2) and h1 > 0 and a2 > 0:
        h = (m1 * a2 - m2 * a1) / det
        d = (h1 * m2 - h2 * m1) / det
        if low <= h <= high and low <= d <= high:
            return h, d
    h = min(max((m1 - a1) / h1, low), high) if h1 > 0 else 1.0
    d = min(max((m2 - h2 * h) / a2, low), high) if a2 > 0 else 1.0
    return h, d


def median_seconds(run: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``run``, each between two ``sync()``."""
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _gpu_rates(device: str, spec: Any, say: Callable[[str], None]) -> tuple[DeviceRates, dict]:
    """The GPU's rates: the catalog's (when the GPU is in it) with every figure measured here
    replacing its own."""
    from asrfit.profiles import host_kernels as hk
    from asrfit.profiles.rates import (
        GPU_BANDWIDTH_EFFICIENCY,
        GPU_HOST_KERNEL_SECONDS,
        GPU_KERNEL_SECONDS,
        gpu_rates,
    )

    sync = torch.cuda.synchronize
    measured: dict[str, Any] = {}
    n = 4096
    matmul = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        seconds = min(median_seconds(lambda a=a, b=b: a @ b, sync, 5) for _ in range(2))
        matmul[name] = 2 * n**3 / seconds
        del a, b
    measured["matmul_flops_per_second"] = matmul
    conv = {}
    batch, channels, length, kernel = 32, 512, 2000, 5
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x = torch.randn(batch, channels, length, device=device, dtype=dtype)
        w = torch.randn(channels, channels, kernel, device=device, dtype=dtype)
        torch.nn.functional.conv1d(x, w, padding=kernel // 2)
        seconds = median_seconds(
            lambda x=x, w=w: torch.nn.functional.conv1d(x, w, padding=kernel // 2), sync, 5
        )
        conv[name] = 2 * batch * channels * channels * kernel * length / seconds
        del x, w
    measured["conv_flops_per_second"] = conv
    source = torch.empty(128 << 20, device=device)  # 512 MiB of fp32
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = median_seconds(lambda: target.copy_(source), sync, 5)
    measured["memory_bytes_per_second"] = 2 * source.numel() * 4 / seconds
    source = target = None  # freed before the host measurements
    say(
        f"device rates: matmul bf16 {matmul['bf16'] / 1e12:.0f} TFLOP/s, fp32 "
        f"{matmul['fp32'] / 1e12:.0f}; conv bf16 {conv['bf16'] / 1e12:.0f}; copy "
        f"{measured['memory_bytes_per_second'] / 1e9:.0f} GB/s"
    )
    by_kind = hk.kernel_seconds_by_kind(device)
    measured["kernel_seconds_by_kind"] = by_kind
    measured["int_kernel_seconds"] = hk.int_kernel_seconds(device)
    measured["optimizer_kernel_seconds"] = hk.optimizer_kernel_seconds(device)
    measured["module_seconds"] = hk.module_call_seconds() * hk.MODULE_FACTOR
    say(
        "host per kernel: "
        + ", ".join(f"{k} {v[0] * 1e6:.1f}/{v[1] * 1e6:.1f} us" for k, v in by_kind.items())
    )
    if spec is not None:
        rates = gpu_rates(spec).to_dict()
    else:
        rates = {
            "name": torch.cuda.get_device_name(),
            "matmul_flops_per_second": {},
            "conv_flops_per_second": {},
            "memory_bytes_per_second": 0.0,
            "kernel_seconds": GPU_HOST_KERNEL_SECONDS["elementwise"][1],
            "launch_seconds": GPU_KERNEL_SECONDS,
        }
    rates.update(
        {
            "matmul_flops_per_second": matmul,
            "conv_flops_per_second": conv,
            "memory_bytes_per_second": measured["memory_bytes_per_second"],
            "kernel_seconds_by_kind": by_kind,
            "kernel_seconds": by_kind["elementwise"][1],
            "forward_kernel_seconds": by_kind["elementwise"][0],
            "int_kernel_seconds": measured["int_kernel_seconds"],
            "optimizer_kernel_seconds": measured["optimizer_kernel_seconds"],
            "module_seconds": measured["module_seconds"],
            "sources": [
                f"measured on {torch.cuda.get_device_name()} by asrfit calibrate: matmul "
                f"{n}^3, conv1d {channels} ch k{kernel} x {batch} x {length}, copy of 512 MiB "
                f"(bandwidth used as measured, not x {GPU_BANDWIDTH_EFFICIENCY}), host cost per "
                "kernel by kind on CUDA tensors, per module call"
            ],
        }
    )
    return DeviceRates.from_dict(rates), measured


def _large_seconds(profile: Any, manifest: str | None) -> float:
    if profile.max_input_seconds:
        return float(profile.max_input_seconds)
    if manifest is not None:
        from asrfit.profiles.dataset import DatasetProfile

        data = DatasetProfile.from_source(manifest)
        return float(data.duration_max_seconds)
    return 16.0


def _time_shape(
    adapter: Any,
    batch: BatchShape,
    setup: Setup,
    device: str,
    rates: DeviceRates,
    repeats: int,
) -> TimedShape:
    from asrfit.memory.simulate import simulate_step

    gpu = device.startswith("cuda")
    sim = simulate_step(adapter, batch, setup, target="cuda" if gpu else "cpu")
    fixed, host, arithmetic = step_seconds_parts(sim.cost, rates)
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated() if gpu else 0
    torch.manual_seed(0)
    model = build_model(adapter, setup, device)
    step = make_step(adapter, model, setup, device)
    inputs = real_inputs(adapter, batch, setup, device)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    step(inputs)  # the first step creates the optimizer's state
    sync()
    peak = reserved = None
    if gpu:
        torch.cuda.reset_peak_memory_stats()
        step(inputs)
        sync()
        peak = torch.cuda.max_memory_allocated() - before
        reserved = torch.cuda.max_memory_reserved()
    else:
        step(inputs)
    seconds = median_seconds(lambda: step(inputs), sync, repeats)
    model = step = inputs = None  # freed before the next shape
    gc.collect()
    return TimedShape(
        batch=batch,
        measured_seconds=seconds,
        fixed_seconds=fixed,
        host_seconds=host or 0.0,
        arithmetic_seconds=arithmetic,
        predicted_peak_bytes=sim.peak_bytes,
        predicted_segment_bytes=sim.segment_bytes(True),
        measured_peak_bytes=peak,
        measured_reserved_bytes=reserved,
    )


def calibrate(
    device: str = "auto",
    model: str | None = None,
    manifest: str | None = None,
    *,
    out: Path | None = None,
    repeats: int = 5,
    say: Callable[[str], None] = logger.info,
) -> tuple[Calibration, Path]:
    """Measure this machine and write its calibration file.

    Args:
        device: "auto" (the GPU when there is one, else the CPU), "cuda" or "cpu".
        model: The model whose real steps are timed (Default: :data:`DEFAULT_MODEL`).
        manifest: A training manifest: the large batch takes its longest utterance.
        out: Where to write (Default: ``<cache>/calibration/<machine>.json``).
        repeats: Timed steps per shape (their median counts).
        say: Progress lines.

    Returns:
        ``(the calibration, the file written)``.

    Raises:
        ConfigError: For ``device="cuda"`` without a usable GPU, or scales out of range.
    """
    from asrfit.memory.cuda.allocator import predict_cuda
    from asrfit.memory.report import batch_for_seconds, resolve_adapter
    from asrfit.profiles.hardware import HardwareProfile
    from asrfit.profiles.host import measure_host_rates

    started = time.perf_counter()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device.startswith("cuda")
    if gpu:
        configure_cuda_allocator(True)  # as training runs; the reserved figure depends on it
    if gpu and not torch.cuda.is_available():
        raise ConfigError("--gpu cuda: torch sees no CUDA device here; use --gpu cpu or auto.")
    hardware = HardwareProfile.detect() if gpu else None
    if gpu:
        rates, measured = _gpu_rates(device, hardware.spec, say)
    else:
        rates = measure_host_rates()
        measured = {"host_rates": "asrfit.profiles.host.measure_host_rates, 2 passes"}
        say(f"host rates: {rates.name}, {time.perf_counter() - started:.1f} s")
    name = model or DEFAULT_MODEL
    adapter, profile = resolve_adapter(name)
    precision = Precision.BF16 if gpu and torch.cuda.is_bf16_supported() else Precision.FP32
    setup = Setup(precision=precision)
    seconds = _large_seconds(profile, manifest)
    small = _time_shape(
        adapter, batch_for_seconds(profile, 1, min(seconds, 1.0)), setup, device, rates, repeats
    )
    say(f"small batch: {small.measured_seconds * 1e3:.1f} ms measured")
    if gpu:
        from asrfit.memory.simulate import simulate_step

        one, two = (
            simulate_step(adapter, batch_for_seconds(profile, b, seconds), setup).peak_bytes
            for b in (1, 2)
        )
        free, _ = torch.cuda.mem_get_info()
        per_utterance = max(1, two - one)
        size = int((free * GPU_FILL - one) // per_utterance)
        large_batch = batch_for_seconds(profile, min(max(size, 2), MAX_BATCH), seconds)
    else:
        large_batch = batch_for_seconds(profile, 4, min(seconds, CPU_LARGE_SECONDS))
    large = _time_shape(adapter, large_batch, setup, device, rates, repeats)
    say(
        f"large batch {large_batch.batch_size} x {large_batch.input_length}: "
        f"{large.measured_seconds * 1e3:.1f} ms measured"
    )
    host_scale, device_scale = solve_scales(small, large, gpu)
    pinned = [
        f"{name} {value:.3g}"
        for name, value in (("host costs x", host_scale), ("device rates /", device_scale))
        if value in SCALE_RANGE
    ]
    if pinned:
        say(
            f"warning: {' and '.join(pinned)} sit at the end of the range "
            f"{SCALE_RANGE[0]}-{SCALE_RANGE[1]}: no scales in it explain both timed steps "
            f"({small.measured_seconds * 1e3:.1f} and {large.measured_seconds * 1e3:.1f} ms), "
            "so the machine was probably busy; run asrfit calibrate again on an idle machine."
        )
        measured["scales_at_range_end"] = pinned
    unmodelled = ratio = None
    modelled_ratio = 1.0
    if gpu and large.measured_peak_bytes is not None:
        arch = hardware.spec.architecture if hardware.spec is not None else None
        prediction = predict_cuda(
            large.predicted_peak_bytes, large.predicted_segment_bytes, architecture=arch
        )
        unmodelled = max(0, large.measured_peak_bytes - prediction.allocated_bytes)
        ratio = large.measured_reserved_bytes / max(1, large.measured_peak_bytes)
        modelled_ratio = prediction.reserved_bytes / prediction.allocated_bytes
        measured["memory"] = {
            "predicted_allocated_bytes": prediction.allocated_bytes,
            "predicted_reserved_bytes": prediction.reserved_bytes,
            "measured_allocated_bytes": large.measured_peak_bytes,
            "measured_reserved_bytes": large.measured_reserved_bytes,
        }
    measured["steps"] = [
        {
            "batch": s.batch.to_dict(),
            "measured_seconds": s.measured_seconds,
            "predicted_fixed_seconds": s.fixed_seconds,
            "predicted_host_seconds": s.host_seconds,
            "predicted_arithmetic_seconds": s.arithmetic_seconds,
            "predicted_peak_bytes": s.predicted_peak_bytes,
            "measured_peak_bytes": s.measured_peak_bytes,
        }
        for s in (small, large)
    ]
    calibration = Calibration(
        key=machine_key(device),
        written=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device="cuda" if gpu else "cpu",
        rates=rates.to_dict(),
        host_scale=host_scale,
        device_scale=device_scale,
        unmodelled_peak_bytes=unmodelled,
        reserved_over_allocated=ratio,
        fragmentation_modelled=modelled_ratio,
        model=name,
        measurements=measured,
        seconds=time.perf_counter() - started,
    )
    path = write_calibration(calibration, out)
    say(
        f"host costs x {host_scale:.2f}, device rates / {device_scale:.2f}"
        + ("" if unmodelled is None else f"; {unmodelled / 2**20:.0f} MiB above the traced peak")
        + ("" if ratio is None else f"; reserved / allocated {ratio:.3f}")
        + f"; {calibration.seconds:.1f} s; written to {path}"
    )
    return calibration, path
