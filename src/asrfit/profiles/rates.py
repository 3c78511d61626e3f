"""What one device can do per second: the figures the step-time model divides by.

A :class:`DeviceRates` holds a device's dense matmul rate per dtype, its convolution rate,
its memory bandwidth and the fixed cost of one kernel (launch on a GPU; dispatch,
autograd bookkeeping and thread wake-up on a CPU). GPU figures come from the catalog
(:mod:`asrfit.profiles.gpus`: NVIDIA's published peaks, each entry with its source) times
the share of the peak that well-shaped training kernels reach; CPU figures are measured on
this machine by :mod:`asrfit.profiles.host`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from asrfit.errors import ConfigError
from asrfit.utils.serialization import JsonDataclass

# Share of the datasheet peak that large cuBLAS/cuDNN GEMMs reach in training (dense
# tensor-core GEMMs of the sizes ASR encoders use run at 60-80 % of peak on A100/H100/L4),
# and of the datasheet bandwidth that streaming elementwise kernels reach (80-90 %).
# Stated assumptions: the GPU runs in docs/benchmarks.md time whole steps, which check neither
# figure alone; `asrfit calibrate` measures both on the user's GPU.
GPU_MATMUL_EFFICIENCY = 0.7
GPU_BANDWIDTH_EFFICIENCY = 0.85
# A GPU kernel's smallest duration plus the gap between launches (~5 us), on the device.
GPU_KERNEL_SECONDS = 5e-6
# The host's cost per kernel of an eager CUDA step (Python, dispatcher, autograd, the
# caching allocator and the launch), ``{kind: [forward, backward]}``, per integer-index
# kernel and per optimizer kernel: asrfit.profiles.host_kernels' micro-benchmarks run on
# CUDA tensors (``bench/gpu_host.py``, the better of two passes) on the host of a lent
# H200 (16 cores of an "Intel Xeon Processor", torch 2.11.0+cu130). The same
# host ran the CPU versions at 3.7 / 5.5 us per elementwise kernel: a CUDA kernel costs
# the host about twice a CPU one. Every catalog GPU is priced with these figures: they are
# a host's, and the planning machine's own are not measured (a GPU's host may be slower).
GPU_HOST_KERNEL_SECONDS = {
    "elementwise": [7.2e-6, 11.9e-6],
    "matmul": [16.7e-6, 20.4e-6],
    "conv": [12.7e-6, 18.5e-6],
    "norm": [10.6e-6, 12.9e-6],
    "softmax": [6.8e-6, 17.3e-6],
    "activation": [6.5e-6, 11.6e-6],
    "attention": [23.4e-6, 20.7e-6],
}
GPU_HOST_INT_KERNEL_SECONDS = 7.0e-6
GPU_HOST_OPTIMIZER_KERNEL_SECONDS = 3.7e-6
# An nn.Module call's host cost on that machine: 1.46 us for a bare module, times the
# model factor asrfit.profiles.host_kernels.MODULE_FACTOR (51, fitted on CPU steps), as
# asrfit.profiles.host computes it for a CPU.
GPU_HOST_MODULE_SECONDS = 1.46e-6 * 51.0
DTYPES = ("fp32", "bf16", "fp16")
# bytes moved by the micro-benchmarks behind ``memory_bytes_per_second`` and
# ``kind_bytes_per_second`` (asrfit.profiles.host: 3 arrays of 4 Mi floats)
BANDWIDTH_BYTES = 3 * 4 * (4 << 20)
# batch x heads of the attention calls behind ``DeviceRates.attention_seconds``
ATTENTION_HEADS = 8
# aten ops that allocate or relabel without running a kernel
NO_KERNEL_OPS = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "detach", "lift_fresh", "alias",
     "_unsafe_view", "set_", "resize_", "_reshape_alias", "sym_size", "sym_stride",
     "sym_numel", "sym_storage_offset", "is_same_size"}
)  # fmt: skip


# Namespaces of ops that query or mark and never compute: ``prim::device`` (what a tensor
# subclass such as FakeTensor answers for every ``.device`` access: thousands per traced
# step, none in the real one) and the profiler's ``record_function`` ranges.
NO_KERNEL_NAMESPACES = frozenset({"prim", "profiler"})


def runs_kernel(func: Any) -> bool:
    """False for ops that run no kernel: views (every output aliases an input without
    writing it: ``view``, ``transpose``, ``expand``, ``slice``), bare allocations, and the
    queries and markers of :data:`NO_KERNEL_NAMESPACES`."""
    if getattr(func, "namespace", "aten") in NO_KERNEL_NAMESPACES:
        return False
    if func._overloadpacket.__name__ in NO_KERNEL_OPS:
        return False
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.returns:
        return True
    return not all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


@dataclass
class DeviceRates(JsonDataclass):
    """Per-second figures of one device for the roofline step-time model.

    Attributes:
        name: The device ("L4", "cpu: 2 threads of AMD EPYC ...").
        matmul_flops_per_second: Dense matmul FLOP/s by dtype ("fp32", "bf16", "fp16").
        conv_flops_per_second: Convolution FLOP/s by dtype (a CPU runs convolutions well
            below its GEMM rate; on a GPU it is the GEMM rate).
        memory_bytes_per_second: Bandwidth an elementwise kernel reaches (read + write).
        kernel_seconds: Fixed cost of one kernel run from C++ (backward, optimizer loops):
            dispatch on a CPU, the host's cost per backward kernel on a GPU.
        forward_kernel_seconds: Host cost of one forward kernel called from Python (module
            call, dispatcher, autograd recording). On a CPU it adds to the step; on a GPU it
            adds too (:func:`asrfit.memory.steptime.roofline.step_seconds`: host + device time).
        threads: CPU threads the figures were measured with (0 for a GPU).
        sources: Where each figure comes from.
        kind_bytes_per_second: Bandwidth reached by kernels of an op kind that do more than
            stream ("norm", "softmax", "activation": a CPU runs layer norm, softmax and GELU
            well below its ``add`` bandwidth); kinds not here use ``memory_bytes_per_second``.
        optimizer_kernel_seconds: Fixed cost of one kernel of the optimizer step and
            ``zero_grad`` (a per-parameter loop without autograd or modules: on a CPU a few
            times cheaper than a model's kernel). None: ``kernel_seconds``.
        int_kernel_seconds: Fixed cost of one forward kernel on integer or bool tensors only
            (index arithmetic, masks, ``any``: a transducer loss runs thousands). Integer
            tensors never require grad, so autograd records nothing for them: cheaper than a
            float kernel of the same kind. None: the kind's figure.
        module_seconds: Host cost of one ``nn.Module`` call beyond its kernels: the Python a
            model runs in ``forward`` (shape logic, masks, hooks) and the autograd nodes it
            records.
        kernel_seconds_by_kind: ``{kind: [forward, backward]}`` fixed seconds per kernel of
            that kind (a CPU's oneDNN convolution sets up far longer than an elementwise
            op); kinds not here use ``forward_kernel_seconds`` / ``kernel_seconds``.
        attention_flops_per_second: Fused attention FLOP/s by dtype, forward and backward
            together (a CPU's flash-attention kernels run far from its GEMM rate); a dtype
            not here uses :meth:`matmul_rate`.
        rate_curves: ``{"matmul" | "conv": {dtype: [[FLOPs per byte, FLOP/s], ...]}}`` and
            ``{"bandwidth" | "bandwidth:<kind>": {"fp32": [[bytes moved, bytes/s], ...]}}``
            measured at several shapes (a CPU's small or thin GEMMs and depthwise
            convolutions run far below its large-GEMM rate); an op's rate is read off the
            curve at its own FLOPs per byte (log-log interpolation, flat beyond the ends).
            Absent: the single figures above.
        attention_seconds: ``{dtype: {"forward" | "backward": [[length, head dim, seconds],
            ...]}}``: one fused attention call of :data:`ATTENTION_HEADS` (batch x heads)
            measured at a grid of lengths and head dims (a CPU's flash-attention kernels
            are far from a FLOP rate at short lengths: its bf16 backward took 0.7 ms at
            length 16 and 1.5 ms at 64); see :meth:`attention_call_seconds`.
        launch_seconds: A GPU's own fixed time per kernel (the smallest kernel and the gap
            between launches), while the per-kernel figures above are the host's. None:
            ``kernel_seconds`` (a CPU, where the two are one).
    """

    name: str
    matmul_flops_per_second: dict[str, float]
    conv_flops_per_second: dict[str, float]
    memory_bytes_per_second: float
    kernel_seconds: float
    forward_kernel_seconds: float
    threads: int = 0
    sources: list[str] = field(default_factory=list)
    kind_bytes_per_second: dict[str, float] = field(default_factory=dict)
    optimizer_kernel_seconds: float | None = None
    module_seconds: float = 0.0
    kernel_seconds_by_kind: dict[str, list[float]] = field(default_factory=dict)
    attention_flops_per_second: dict[str, float] = field(default_factory=dict)
    rate_curves: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    int_kernel_seconds: float | None = None
    attention_seconds: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    launch_seconds: float | None = None

    def __post_init__(self) -> None:
        for label, table in (
            ("matmul_flops_per_second", self.matmul_flops_per_second),
            ("conv_flops_per_second", self.conv_flops_per_second),
        ):
            if "fp32" not in table:
                raise ConfigError(f"DeviceRates {self.name!r}: {label} needs an 'fp32' entry.")
            bad = {k: v for k, v in table.items() if k not in DTYPES or not v > 0}
            if bad:
                raise ConfigError(
                    f"DeviceRates {self.name!r}: {label} has invalid entries {bad}; "
                    f"use dtypes {DTYPES} with positive rates."
                )
        if not self.memory_bytes_per_second > 0 or not self.kernel_seconds >= 0:
            raise ConfigError(
                f"DeviceRates {self.name!r}: memory_bytes_per_second must be > 0 and "
                f"kernel_seconds >= 0 (got {self.memory_bytes_per_second}, {self.kernel_seconds})."
            )

    def fixed_seconds(self, phase: str, kind: str = "elementwise", dtype: str = "fp32") -> float:
        """Fixed cost of one kernel of ``kind`` on ``dtype`` run in ``phase`` (see the attributes)."""
        if phase in ("optimizer", "zero_grad"):
            if self.optimizer_kernel_seconds is not None:
                return self.optimizer_kernel_seconds
            return self.kernel_seconds
        forward = phase == "forward"
        if dtype == "int" and forward and self.int_kernel_seconds is not None:
            return self.int_kernel_seconds
        if kind in self.kernel_seconds_by_kind:
            return self.kernel_seconds_by_kind[kind][0 if forward else 1]
        return self.forward_kernel_seconds if forward else self.kernel_seconds

    @property
    def device_kernel_seconds(self) -> float:
        """The device's fixed time per kernel (:attr:`launch_seconds`, else ``kernel_seconds``)."""
        return self.kernel_seconds if self.launch_seconds is None else self.launch_seconds

    @property
    def asynchronous(self) -> bool:
        """True for a GPU: the host queues kernels while the device runs earlier ones."""
        return self.threads == 0

    def bandwidth(self, kind: str, nbytes: float | None = None) -> float:
        """Bytes per second that kernels of ``kind`` move. With ``nbytes``: read off the
        kind's own curve where one was measured (``rate_curves["bandwidth:<kind>"]``: norm,
        softmax, activation, random and layout on a CPU), else the kind's figure scaled by
        how the streaming (``add``) bandwidth at ``nbytes`` compares with the one at the
        size the figures were measured at (:data:`BANDWIDTH_BYTES`)."""
        own = self.rate_curves.get(f"bandwidth:{kind}", {}).get("fp32")
        if own and nbytes is not None and nbytes > 0:  # the kind's own curve, where measured
            return _interpolate(own, nbytes)
        base = self.kind_bytes_per_second.get(kind, self.memory_bytes_per_second)
        curve = self._curve("bandwidth", "fp32")
        if not curve or nbytes is None or nbytes <= 0:
            return base
        return base * _interpolate(curve, nbytes) / _interpolate(curve, BANDWIDTH_BYTES)

    def matmul_rate(self, dtype: str, intensity: float | None = None) -> float:
        """Matmul FLOP/s for ``dtype`` (at ``intensity`` FLOPs per byte where a curve was
        measured); a dtype without its own figure runs at the fp32 rate."""
        curve = self._curve("matmul", dtype)
        if curve and intensity is not None:
            return _interpolate(curve, intensity)
        return self.matmul_flops_per_second.get(dtype, self.matmul_flops_per_second["fp32"])

    def _curve(self, kind: str, dtype: str) -> list[list[float]]:
        curves = self.rate_curves.get(kind, {})
        return curves.get(dtype) or curves.get("fp32") or []

    def attention_rate(self, dtype: str) -> float:
        """Fused attention FLOP/s for ``dtype`` (the matmul rate when not measured)."""
        if dtype in self.attention_flops_per_second:
            return self.attention_flops_per_second[dtype]
        return self.matmul_rate(dtype)

    def attention_call_seconds(
        self, dtype: str, shape: list[int] | tuple[int, ...]
    ) -> float | None:
        """Seconds of one fused attention call of ``shape`` (batch x heads, query length,
        key length, head dim, 1 for the backward kernel else 0) from
        :attr:`attention_seconds`, or None where not measured.

        The measured call is scaled by batch x heads over :data:`ATTENTION_HEADS` and read
        at the geometric mean of the two lengths (a cross-attention's work grows with
        their product)."""
        table = self.attention_seconds.get(dtype, {})
        heads, length, keys, dim, backward = shape
        points = table.get("backward" if backward else "forward")
        if not points:
            return None
        seconds = _attention_at(points, math.sqrt(length * keys), dim)
        return seconds * heads / ATTENTION_HEADS

    def conv_rate(self, dtype: str, intensity: float | None = None) -> float:
        """Convolution FLOP/s for ``dtype`` (at ``intensity`` FLOPs per byte where a curve
        was measured; fp32's when the dtype has no figure)."""
        curve = self._curve("conv", dtype)
        if curve and intensity is not None:
            return _interpolate(curve, intensity)
        return self.conv_flops_per_second.get(dtype, self.conv_flops_per_second["fp32"])


def _attention_at(points: list[list[float]], length: float, dim: float) -> float:
    """Seconds at ``length`` (log-log between measured lengths, flat below the shortest,
    quadratic beyond the longest) and ``dim`` (log-log between the measured head dims,
    flat below, proportional above)."""
    dims = sorted({p[1] for p in points})

    def at_dim(d: float) -> float:
        curve = sorted([p[0], p[2]] for p in points if p[1] == d)
        longest, seconds = curve[-1]
        if length > longest:
            return seconds * (length / longest) ** 2
        return _interpolate(curve, length)

    if dim >= dims[-1]:
        return at_dim(dims[-1]) * dim / dims[-1]
    return _interpolate([[d, at_dim(d)] for d in dims], dim)


def _interpolate(curve: list[list[float]], x: float) -> float:
    """``y`` at ``x`` on a ``[[x, y], ...]`` curve sorted by ``x``: log-log linear, flat
    beyond its ends."""
    if x <= curve[0][0]:
        return curve[0][1]
    if x >= curve[-1][0]:
        return curve[-1][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= x <= x1:
            if x1 == x0:
                return max(y0, y1)
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))
    return curve[-1][1]


def gpu_rates(spec: object) -> DeviceRates:
    """Rates of a catalog GPU (:class:`asrfit.profiles.gpus.catalog.GPUSpec`).

    fp32 matmuls run at the CUDA-core fp32 peak, as PyTorch runs them by default
    (``torch.backends.cuda.matmul.allow_tf32`` is False: on an H200 a wav2vec2-base step of
    32 x 8 s took 224-229 ms, 108 ms with it on), fp32 convolutions at the tf32 tensor-core
    peak where the GPU has one (``torch.backends.cudnn.allow_tf32`` is True by default).
    Every peak is multiplied by :data:`GPU_MATMUL_EFFICIENCY`. The per-kernel host costs are
    the measured :data:`GPU_HOST_KERNEL_SECONDS`.
    """
    peaks = {"fp32": spec.fp32_tflops, "fp16": spec.fp16_tflops, "bf16": spec.bf16_tflops}
    rates = {k: v * 1e12 * GPU_MATMUL_EFFICIENCY for k, v in peaks.items() if v}
    conv = {**rates, "fp32": (spec.tf32_tflops or spec.fp32_tflops) * 1e12 * GPU_MATMUL_EFFICIENCY}
    source = getattr(spec, "source", None)
    where = f"{source.title} ({source.url})" if source is not None else "the GPU catalog"
    return DeviceRates(
        name=spec.name,
        matmul_flops_per_second=rates,
        conv_flops_per_second=conv,
        memory_bytes_per_second=spec.memory_bandwidth_bytes_per_second * GPU_BANDWIDTH_EFFICIENCY,
        kernel_seconds=GPU_HOST_KERNEL_SECONDS["elementwise"][1],
        forward_kernel_seconds=GPU_HOST_KERNEL_SECONDS["elementwise"][0],
        kernel_seconds_by_kind={k: list(v) for k, v in GPU_HOST_KERNEL_SECONDS.items()},
        int_kernel_seconds=GPU_HOST_INT_KERNEL_SECONDS,
        optimizer_kernel_seconds=GPU_HOST_OPTIMIZER_KERNEL_SECONDS,
        module_seconds=GPU_HOST_MODULE_SECONDS,
        launch_seconds=GPU_KERNEL_SECONDS,
        sources=[
            f"peaks and bandwidth: {where}",
            f"x {GPU_MATMUL_EFFICIENCY} of peak FLOP/s and x {GPU_BANDWIDTH_EFFICIENCY} of "
            f"bandwidth reached by training kernels, {GPU_KERNEL_SECONDS * 1e6:g} us per kernel "
            "on the device (stated assumptions); the host's cost per kernel and per module "
            "call measured on an H200's host (bench/gpu_host.py, docs/benchmarks.md)",
        ],
    )


def best_of(a: DeviceRates, b: DeviceRates) -> DeviceRates:
    """Figure by figure the better of two measurements of one machine: the higher of each
    rate (``*_per_second``, ``rate_curves``), the lower of each fixed or per-call time
    (``*seconds*``). A pass of micro-benchmarks that met a busy moment (another process on
    the core for a few seconds: every figure of one pass 1.3-1.5x slower on a
    shared 2-core host) loses where it was slow. Everything else comes from ``a``."""
    first, second = a.to_dict(), b.to_dict()
    merged = {}
    for key, value in first.items():
        points = key in _POINT_FIELDS
        merged[key] = _better(value, second.get(key), _direction(key), points)
    return DeviceRates.from_dict(merged)


# fields whose innermost lists are points ``[where..., figure]``: only the figure is merged
_POINT_FIELDS = ("rate_curves", "attention_seconds")


def _direction(field_name: str) -> int:
    """+1 where a higher figure is better (a rate), -1 where lower is (seconds), 0 else."""
    if "per_second" in field_name or field_name == "rate_curves":
        return 1
    return -1 if "seconds" in field_name else 0


def _better(x: Any, y: Any, direction: int, points: bool) -> Any:
    number = (int, float)
    if direction == 0 or y is None or type(x) is bool:
        return x
    if isinstance(x, number) and isinstance(y, number):
        return max(x, y) if direction > 0 else min(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return {k: _better(v, y.get(k), direction, points) for k, v in x.items()}
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        if points and x and all(isinstance(v, number) for v in x):  # [where..., figure]
            return [*x[:-1], _better(x[-1], y[-1], direction, False)] if x[:-1] == y[:-1] else x
        return [_better(u, v, direction, points) for u, v in zip(x, y, strict=True)]
    return x
