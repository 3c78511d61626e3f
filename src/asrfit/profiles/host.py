"""This machine's CPU as a training target: rates measured by short micro-benchmarks.

Each figure is the **best** of several short repeats at the thread count the run will use
(``torch.get_num_threads()`` unless given), and the whole set is measured twice, seconds
apart, keeping the better of each figure (:func:`~asrfit.profiles.rates.best_of`), so that
a moment when other processes hold the cores does not lower it; the result is cached per
machine (CPU model, cores, threads, torch version) under ``$ASRFIT_CACHE_DIR/host`` (or
``~/.cache/asrfit/host``), so a plan made now and one made in a busy hour agree.

- matmul FLOP/s per dtype: ``F.linear`` of 1024 x 1024 matrices (fp32; bf16 512);
- convolution FLOP/s per dtype: a 1-D convolution of 128 channels, kernel 5;
- memory bandwidth: ``torch.add(a, b, out=c)`` over 4 Mi floats (three 16 MiB arrays,
  more than the last-level cache of most servers' share per core), bytes read + written;
  and the bandwidth that layer norm, softmax, GELU, dropout's mask and a transposing copy
  reach over the same size (a CPU computes them well below streaming speed);
- curves: ``F.linear`` and seven convolutions (forward + backward) at several shapes, as
  FLOPs per byte against FLOP/s, ``torch.add`` into arrays of 256 KiB to 256 MiB, and
  layer norm, softmax, GELU, ``bernoulli_`` and a transposing copy at 256 KiB to 16 MiB,
  as bytes moved against bytes/s (see :class:`~asrfit.profiles.rates.DeviceRates`);
- fused attention FLOP/s per dtype, forward + backward, and the seconds of one call,
  forward and backward, at a grid of lengths and head dims;
- fixed seconds per kernel by kind, per module call and per optimizer kernel:
  :mod:`asrfit.profiles.host_kernels`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asrfit.profiles.calibration import cpu_model
from asrfit.profiles.host_cache import cache_file, contended, other_runnable
from asrfit.profiles.host_kernels import (
    CHAIN,
    MODULE_FACTOR,
    OPTIMIZER_PARAMS,
    REPEATS,
    best_seconds,
    int_kernel_seconds,
    kernel_seconds_by_kind,
    module_call_seconds,
    optimizer_kernel_seconds,
)
from asrfit.profiles.rates import DeviceRates, best_of
from asrfit.utils.io import atomic_write_text

logger = logging.getLogger(__name__)

HOST_RATES_VERSION = 22  # bump when a micro-benchmark changes
_MATMUL_N = 1024
_BANDWIDTH_NUMEL = 4 << 20


def _matmul_rate(dtype: object) -> float:
    import torch

    # ``F.linear``, the call every model's projections make (on CPUs without native bf16,
    # ``torch.mm`` in bf16 takes a slow path that linear layers do not); bf16 smaller to
    # keep it short
    n = _MATMUL_N if dtype == torch.float32 else _MATMUL_N // 2
    a, w = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best_seconds(lambda: torch.nn.functional.linear(a, w))


def _conv_rate(dtype: object) -> float:
    import torch

    batch, channels, length, kernel = (
        (8, 128, 1000, 5) if dtype == torch.float32 else (1, 128, 500, 5)
    )
    x = torch.randn(batch, channels, length, dtype=dtype)
    w = torch.randn(channels, channels, kernel, dtype=dtype)
    flops = 2 * batch * channels * (length - kernel + 1) * channels * kernel
    return flops / best_seconds(lambda: torch.nn.functional.conv1d(x, w))


class _ArithmeticCount:
    """FLOPs and bytes of the ops with FLOPs (``torch.utils.flop_counter``'s table), bytes
    counted as :class:`asrfit.memory.steptime.runtime.OpCounter` counts them: each distinct input
    and output tensor once, at most its storage's size."""

    def __init__(self) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves
        from torch.utils.flop_counter import flop_registry

        counter = self

        def nbytes(t: torch.Tensor) -> int:
            return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                count = flop_registry.get(func._overloadpacket)
                if count is not None:
                    counter.flops += int(count(*args, **kwargs, out_val=out))
                    tensors = [
                        t for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)
                    ]
                    counter.nbytes += sum(nbytes(t) for t in {id(t): t for t in tensors}.values())
                return out

        self.flops = 0
        self.nbytes = 0
        self.mode = Mode()


def _rate_curve(cases: list[Callable[[], Callable[[], object]]]) -> list[list[float]]:
    """``[[FLOPs per byte, FLOP/s], ...]`` sorted: each case's matmul or convolution work
    (:class:`_ArithmeticCount`) over its best time. A GEMM or a convolution reaches a rate
    that depends on its shape: small or thin ones (a depthwise convolution, a 1-channel
    input) run far below the large dense case, and their bytes per FLOP tell them apart."""
    points = []
    for make in cases:
        run = make()
        count = _ArithmeticCount()
        with count.mode:
            run()
        if count.flops > 0 and count.nbytes > 0:
            points.append([count.flops / count.nbytes, count.flops / best_seconds(run)])
    return sorted(points)


def _matmul_curve(dtype: object) -> list[list[float]]:
    """``F.linear`` of square sizes 32 to 1024 (bf16 to 512)."""
    import torch
    import torch.nn.functional as F

    largest = _MATMUL_N if dtype == torch.float32 else _MATMUL_N // 2

    def case(n: int) -> Callable[[], Callable[[], object]]:
        def make() -> Callable[[], object]:
            a, w = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            return lambda: F.linear(a, w)

        return make

    sizes = [n for n in (32, 64, 128, 256, 512, 1024) if n <= largest]
    return _rate_curve([case(n) for n in sizes])


def _conv_curve(dtype: object) -> list[list[float]]:
    """Forward + backward of the convolutions speech models train: dense conv1d of 16 to
    256 channels, a depthwise conv1d (Conformer), and conv2d subsampling from 1 and from 32
    channels (dense and depthwise), batch 4."""
    import torch
    import torch.nn.functional as F

    def case(shape: tuple, weight: tuple, conv: Callable, **kw: object) -> Callable:
        def make() -> Callable[[], object]:
            x = torch.randn(*shape, dtype=dtype, requires_grad=True)
            w = torch.randn(*weight, dtype=dtype, requires_grad=True)
            out = conv(x, w, **kw)
            grad = torch.ones_like(out)

            def run() -> object:
                y = conv(x, w, **kw)
                return torch.autograd.grad(y, (x, w), grad)

            return run

        return make

    cases = [case((4, c, 500), (c, c, 5), F.conv1d, padding=2) for c in (16, 64, 256)] + [
        case((4, 256, 500), (256, 1, 15), F.conv1d, padding=7, groups=256),
        case((4, 1, 200, 80), (32, 1, 3, 3), F.conv2d, stride=2, padding=1),
        case((4, 32, 100, 40), (32, 32, 3, 3), F.conv2d, stride=2, padding=1),
        case((4, 32, 100, 40), (32, 1, 3, 3), F.conv2d, stride=2, padding=1, groups=32),
    ]
    return _rate_curve(cases)


def _attention_rate(dtype: object) -> float:
    """FLOP/s of a training step's fused attention (forward + backward) on this CPU.

    The CPU flash-attention kernels are not GEMMs: their bf16 backward, on a CPU with
    native bf16 matmuls, ran at a fraction of the bf16 GEMM rate. FLOPs as
    :mod:`asrfit.memory.steptime.runtime` counts them: ``4 B H L S D`` forward, 2.5x that backward.
    """
    import torch
    import torch.nn.functional as F

    b, h, length, d = 2, 4, 256, 64
    q, k, v = (torch.randn(b, h, length, d, dtype=dtype, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v)
    grad = torch.ones_like(out)
    forward = best_seconds(lambda: F.scaled_dot_product_attention(q, k, v))
    backward = best_seconds(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
    flops = 4 * b * h * length * length * d * 3.5
    return flops / (forward + backward)


_ATTENTION_LENGTHS = (16, 32, 64, 128, 256)
_ATTENTION_DIMS = (16, 64)


def _attention_table(dtype: object) -> dict[str, list[list[float]]]:
    """``{"forward" | "backward": [[length, head dim, seconds], ...]}`` of one fused
    attention call of :data:`~asrfit.profiles.rates.ATTENTION_HEADS` (2 x 4) heads, at a grid of
    lengths and head dims. The CPU flash-attention kernels work in blocks of the sequence:
    at short lengths they are far from any FLOP rate (docs/step_time.md: the bf16 backward
    on the development machine, 0.66 ms at length 16 and 3.98 ms at 128 with head dim 64),
    so a call is priced at its own shape
    (:meth:`~asrfit.profiles.rates.DeviceRates.attention_call_seconds`).
    """
    import torch
    import torch.nn.functional as F

    def call(length: int, dim: int) -> tuple[float, float]:
        q, k, v = (torch.randn(2, 4, length, dim, dtype=dtype, requires_grad=True) for _ in "qkv")
        out = F.scaled_dot_product_attention(q, k, v)
        grad = torch.ones_like(out)
        forward = best_seconds(lambda: F.scaled_dot_product_attention(q, k, v), 3, 0.003)
        backward = best_seconds(
            lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), 3, 0.003
        )
        return forward, backward

    table: dict[str, list[list[float]]] = {"forward": [], "backward": []}
    for dim in _ATTENTION_DIMS:
        for length in _ATTENTION_LENGTHS:
            forward, backward = call(length, dim)
            table["forward"].append([float(length), float(dim), forward])
            table["backward"].append([float(length), float(dim), backward])
    return table


def _kind_bandwidths() -> dict[str, float]:
    """Bytes/s of layer norm, softmax, GELU and dropout's mask over 4 Mi floats (read
    input, write output; the in-place ``bernoulli_`` reads and writes its tensor)."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(_BANDWIDTH_NUMEL // 256, 256)
    mask = torch.empty_like(x)
    nbytes = 2 * x.nbytes
    return {
        "norm": nbytes / best_seconds(lambda: F.layer_norm(x, (256,))),
        "softmax": nbytes / best_seconds(lambda: torch.softmax(x, -1)),
        "activation": nbytes / best_seconds(lambda: F.gelu(x)),
        "random": nbytes / best_seconds(lambda: mask.bernoulli_(0.9)),
        "layout": nbytes / best_seconds(lambda: _layout_copy(x, mask)),
    }


def _layout_copy(x: Any, out: Any) -> Any:
    """Copy ``x`` as (4, T, 64) into ``out`` as (4, 64, T), as a kernel's ``.contiguous()``
    of a transposed (batch, time, channels) tensor does: not a 2-D transpose, which PyTorch
    copies with a blocked kernel that 3-D tensors never reach (16 MiB arrays on a 2-core
    Intel Xeon: 8.8 GB/s for a 2-D transpose, 1.5 GB/s for this one)."""
    return out.view(4, 64, -1).copy_(x.reshape(4, -1, 64).transpose(1, 2))


_KIND_CURVE_NUMELS = (1 << 16, 1 << 19, 1 << 22)


def _kind_bandwidth_curves() -> dict[str, dict[str, list[list[float]]]]:
    """``{"bandwidth:<kind>": {"fp32": [[bytes moved, bytes/s], ...]}}`` of layer norm,
    softmax, GELU, dropout's mask and a transposing copy at 256 KiB to 16 MiB per array,
    less the time of the same op on 256 floats (its dispatch and set-up, which the
    per-kernel figures count).

    Unlike ``add``, these do not stream several times faster once their arrays fit in the
    caches: they are bound by their own arithmetic (``bernoulli_`` by its generator, at
    1.1-1.2 GB/s from 256 KiB to 16 MiB on the development machine, while ``add`` ran at 90
    GB/s at 256 KiB and 27 GB/s at 16 MiB: docs/step_time.md); scaling them by ``add``'s
    curve priced a dropout mask of a small step 4-5x too cheap. A transposing copy reads
    with a stride: 6-7 GB/s at 256 KiB and 2 MiB and 1.5 GB/s at 16 MiB on a 2-core
    Intel Xeon, where ``add`` streamed at 27-88 GB/s.
    """
    import torch
    import torch.nn.functional as F

    ops = {
        "norm": lambda x, m: F.layer_norm(x, (256,)),
        "softmax": lambda x, m: torch.softmax(x, -1),
        "activation": lambda x, m: F.gelu(x),
        "random": lambda x, m: m.bernoulli_(0.9),
        "layout": _layout_copy,
    }

    def seconds(op: Callable[[Any, Any], Any], numel: int) -> float:
        x = torch.randn(max(1, numel // 256), min(numel, 256))
        mask = torch.empty_like(x)
        return best_seconds(lambda: op(x, mask), min_seconds=0.01)

    curves: dict[str, dict[str, list[list[float]]]] = {}
    for kind, op in ops.items():
        floor = seconds(op, 256)
        points = []
        for numel in _KIND_CURVE_NUMELS:
            total = seconds(op, numel)
            nbytes = 2 * 4 * numel  # read the input, write the output (in place: the same)
            points.append([float(nbytes), nbytes / max(total - floor, total / 4)])
        curves[f"bandwidth:{kind}"] = {"fp32": points}
    return curves


def stream_bandwidth() -> float:
    """Bytes per second of ``torch.add`` of two large fp32 arrays into a third (DRAM streaming)."""
    import torch

    a, b, c = (torch.randn(_BANDWIDTH_NUMEL) for _ in range(3))
    return 3 * a.nbytes / best_seconds(lambda: torch.add(a, b, out=c))


def _bandwidth_curve() -> list[list[float]]:
    """``[[bytes moved, bytes/s], ...]`` of ``torch.add`` of two arrays of 256 KiB to
    256 MiB each into a third one used before. Arrays that stay in the caches stream faster
    than the ones that go to DRAM. The output is memory already mapped, as in a training
    step once glibc keeps freed memory (:mod:`asrfit.train.host_allocator`, what ``asrfit
    train`` does on a CPU); with glibc's defaults an output above its largest mmap
    threshold (32 MiB) is a fresh mapping whose pages the kernel faults in and zeroes on
    every step (on a 2-core AMD EPYC: 14 GB/s at 32 MiB and above against 53 GB/s into an
    existing array), which ``bench/host_allocator.py`` measures."""
    import torch

    def point(numel: int) -> list[float]:
        a, b, c = torch.randn(numel), torch.randn(numel), torch.randn(numel)
        return [3 * a.nbytes, 3 * a.nbytes / best_seconds(lambda: torch.add(a, b, out=c))]

    return [point(numel) for numel in (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)]


PASSES = 2  # measurements of the whole set, the better of each figure kept


def measure_host_rates(threads: int | None = None, passes: int = PASSES) -> DeviceRates:
    """Run the micro-benchmarks now (about 10 s a pass on 2 cores) at ``threads`` threads.

    Args:
        threads: Intra-op threads (Default: ``torch.get_num_threads()``).
        passes: Times the whole set is measured; each figure is the best of them.

    Returns:
        The measured rates.
    """
    rates = _measure_once(threads)
    for _ in range(passes - 1):
        rates = best_of(rates, _measure_once(threads))
    if passes > 1:
        rates.sources = [f"best of {passes} passes of: {rates.sources[0]}"]
    return rates


def _measure_once(threads: int | None) -> DeviceRates:
    """One pass of every micro-benchmark at ``threads`` threads."""
    import torch

    previous = torch.get_num_threads()
    threads = threads or previous
    torch.set_num_threads(threads)
    try:
        matmul = {"fp32": _matmul_rate(torch.float32), "bf16": _matmul_rate(torch.bfloat16)}
        conv = {"fp32": _conv_rate(torch.float32), "bf16": _conv_rate(torch.bfloat16)}
        attention = {
            "fp32": _attention_rate(torch.float32),
            "bf16": _attention_rate(torch.bfloat16),
        }
        attention_calls = {
            "fp32": _attention_table(torch.float32),
            "bf16": _attention_table(torch.bfloat16),
        }
        curves = {
            kind: {"fp32": make(torch.float32), "bf16": make(torch.bfloat16)}
            for kind, make in (("matmul", _matmul_curve), ("conv", _conv_curve))
        }
        curves["bandwidth"] = {"fp32": _bandwidth_curve()}
        curves.update(_kind_bandwidth_curves())
        bandwidth = stream_bandwidth()
        kinds = _kind_bandwidths()
        by_kind = kernel_seconds_by_kind()
        module = module_call_seconds()
        int_kernel = int_kernel_seconds()
        optimizer_kernel = optimizer_kernel_seconds()
    finally:
        torch.set_num_threads(previous)
    return DeviceRates(
        name=f"cpu: {threads} threads of {cpu_model()}",
        matmul_flops_per_second=matmul,
        conv_flops_per_second=conv,
        attention_flops_per_second=attention,
        rate_curves=curves,
        memory_bytes_per_second=bandwidth,
        kernel_seconds=by_kind["elementwise"][1],
        forward_kernel_seconds=by_kind["elementwise"][0],
        kernel_seconds_by_kind=by_kind,
        module_seconds=module * MODULE_FACTOR,
        threads=threads,
        kind_bytes_per_second=kinds,
        optimizer_kernel_seconds=optimizer_kernel,
        int_kernel_seconds=int_kernel,
        attention_seconds=attention_calls,
        sources=[
            f"measured on this machine ({platform.node()}), best of {REPEATS} repeats at "
            f"{threads} threads: linear {_MATMUL_N}^3 (bf16 {_MATMUL_N // 2}^3), conv1d 128ch k5, scaled_dot_product_attention 2x4x256x64 forward+backward and at lengths 16-256, head dims 16 and 64, F.linear at 32^2..1024^2 and 7 convolutions forward+backward by bytes per FLOP, add over 3 arrays of 256 KiB to 256 MiB and over 3 x 16 MiB, layer norm / softmax / GELU / bernoulli_ / transposing copy over 16 MiB and at 256 KiB to 16 MiB, "
            f"per kernel kind, forward and backward of a chain of {CHAIN} tiny ops; integer "
            "index arithmetic (sub, compare, and, any) on 24 elements; a module "
            f"call, {CHAIN} bare vs wrapped ops, x {MODULE_FACTOR} (fitted in "
            f"bench/step_time_accuracy.py); an AdamW step over {OPTIMIZER_PARAMS} small "
            "parameters per kernel (asrfit.profiles.host)"
        ],
    )


def _cache_file(threads: int) -> Path | None:
    import torch

    key = [HOST_RATES_VERSION, MODULE_FACTOR, cpu_model(), os.cpu_count(), threads]
    return cache_file([*key, torch.__version__])


@functools.lru_cache(maxsize=8)
def host_rates(threads: int | None = None, *, refresh: bool = False) -> DeviceRates:
    """This machine's rates at ``threads`` threads, measured once and cached on disk.

    Args:
        threads: Intra-op threads the run will use (Default: ``torch.get_num_threads()``).
        refresh: Measure again and overwrite the cache.

    Returns:
        The cached or newly measured rates.
    """
    import torch

    threads = threads or torch.get_num_threads()
    path = _cache_file(threads)
    if path is not None and path.exists() and not refresh:
        try:
            return DeviceRates.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError, KeyError) as err:
            logger.warning(
                "Ignoring unreadable host-rates cache %s (%s); measuring again.", path, err
            )
    before = other_runnable()
    rates = measure_host_rates(threads)
    others = min(before, other_runnable())
    if contended(others, threads):
        logger.warning(
            "Host rates measured while %d thread(s) of other processes were runnable on %d "
            "cores: this plan uses them, but they are not cached (slow rates would price every "
            "later plan's steps as slow); plan again on a quiet machine to cache them.",
            others,
            os.cpu_count() or 1,
        )
    elif path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(rates.to_dict(), indent=1))
        logger.info("Host rates measured and cached in %s.", path)
    return rates


def device_rates(hardware: object | None, threads: int | None = None) -> DeviceRates | None:
    """Rates for a ``HardwareProfile``: this machine's calibration when the profile is this
    machine and ``asrfit calibrate`` has run here (:mod:`asrfit.profiles.calibration`), else
    its catalog GPU's, or this CPU's measured rates for a cpu-only one.

    Returns:
        The rates, or None for a detected GPU that is not in the catalog (no known peaks).
    """
    from asrfit.profiles.calibration import calibration_for
    from asrfit.profiles.rates import gpu_rates

    found = calibration_for(hardware, threads) if hardware is not None else None
    if found is not None:  # this machine's calibration: measured figures, real-step scales
        calibration, path = found
        stamp = (str(path), path.stat().st_mtime_ns)
        if _last_gpu[0] != stamp:  # the planner asks once per bucket it sizes
            _last_gpu[:] = [stamp, calibration.apply()]
        return _last_gpu[1]
    if hardware is None or getattr(hardware, "num_gpus", 0) == 0:
        return host_rates(threads)
    spec = getattr(hardware, "spec", None)
    if spec is None:
        return None
    if _last_gpu[0] is not spec:
        _last_gpu[:] = [spec, gpu_rates(spec)]
    return _last_gpu[1]


_last_gpu: list = [None, None]  # the last catalog entry (or calibration file) and its rates
