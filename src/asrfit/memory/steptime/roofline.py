"""The roofline time model: seconds of a traced step's kernels on a device's rates.

A simulation records the kernels of a step as a :class:`StepCost` (one row per distinct
op cost: phase, kind, dtype, FLOPs, bytes moved, tensors touched, calls; counted by
:class:`asrfit.memory.steptime.runtime.OpCounter`). This module turns rows into seconds and needs no
torch: a plan whose simulations are all cached reads costs and times them without it.

:func:`step_seconds` turns those counts into seconds for a :class:`DeviceRates`: each op
takes ``kernels x kernel_seconds + max(FLOPs / rate(kind, dtype), bytes / bandwidth)``,
the roofline, where the rate is the device's matmul rate for matmuls and attention, its
convolution rate for convolutions, and every other op is memory-bound at the bandwidth its
kind reaches (:meth:`DeviceRates.bandwidth`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from asrfit.profiles.rates import DeviceRates
from asrfit.utils.serialization import JsonDataclass

KINDS = (
    "matmul",
    "activation",
    "attention",
    "conv",
    "norm",
    "softmax",
    "loss",
    "reduction",
    "copy",
    "layout",
    "elementwise",
    "optimizer",
    "random",
    "module",
)
RUNTIME_VERSION = 9  # bump when the counts of OpCounter change (simulation cache key)
STEP_PHASES = ("forward", "backward", "optimizer", "zero_grad")
GPU_FOREACH_TENSORS_PER_LAUNCH = 48


@dataclass
class StepCost(JsonDataclass):
    """The kernels of one traced training step, device-independent.

    Attributes:
        rows: One row per distinct op cost: ``[phase, kind, dtype, flops, bytes, tensors,
            count]``: the phase it ran in, its kind (:data:`KINDS`), compute dtype ("fp32",
            "bf16", "fp16"), FLOPs and bytes moved by one call, tensors touched (kernels on a
            CPU), and how many calls had exactly these figures. A row of kind "module"
            counts ``nn.Module`` calls (0 FLOPs, 0 bytes, 0 tensors: no kernel). A CPU
            flash-attention row has an eighth entry, its shape ``[batch x heads, query
            length, key length, head dim, 1 if backward else 0]``, priced by
            :meth:`~asrfit.profiles.rates.DeviceRates.attention_call_seconds`.
    """

    rows: list[list] = field(default_factory=list)

    @property
    def flops(self) -> int:
        """FLOPs of all rows."""
        return sum(r[3] * r[6] for r in self.rows)

    @property
    def bytes_moved(self) -> int:
        """Bytes read + written by all rows."""
        return sum(r[4] * r[6] for r in self.rows)

    @property
    def calls(self) -> int:
        """Op calls (kernels on a GPU, before foreach splitting); module calls not included."""
        return sum(r[6] for r in self.rows if r[1] != "module")

    @property
    def module_calls(self) -> int:
        """``nn.Module`` calls (rows of kind "module")."""
        return sum(r[6] for r in self.rows if r[1] == "module")

    def select(self, phases: tuple[str, ...]) -> StepCost:
        """The rows of ``phases`` only (e.g. forward + backward, or the optimizer step)."""
        return StepCost([list(r) for r in self.rows if r[0] in phases])


def _kernels(tensors: int, rates: DeviceRates) -> float:
    if tensors == 0:  # a module call: Python around kernels, no kernel of its own
        return 0.0
    if not rates.asynchronous:  # CPU: a foreach op loops over its tensors, one dispatch each
        return float(tensors)
    return float(math.ceil(tensors / GPU_FOREACH_TENSORS_PER_LAUNCH)) if tensors > 1 else 1.0


def _device_seconds(row: list, rates: DeviceRates) -> float:
    """Roofline seconds of the arithmetic and memory traffic of one call of a row."""
    phase, kind, dtype, flops, nbytes = row[:5]
    intensity = flops / nbytes if nbytes else None
    if kind == "matmul":
        compute = flops / rates.matmul_rate(dtype, intensity)
    elif kind == "attention":
        measured = rates.attention_call_seconds(dtype, row[7]) if len(row) > 7 else None
        if measured is not None:  # the call at its shape, less what the fixed part counts
            return max(measured - rates.fixed_seconds(phase, kind, dtype), measured / 4)
        compute = flops / rates.attention_rate(dtype)
    elif kind == "conv":
        compute = flops / rates.conv_rate(dtype, intensity)
    else:
        compute = 0.0
    return max(compute, nbytes / rates.bandwidth(kind, nbytes))


def _host_seconds(row: list, rates: DeviceRates) -> float:
    """Fixed cost of one call of a row (host work: Python, dispatch, autograd)."""
    if row[1] == "module":
        return rates.module_seconds
    return _kernels(row[5], rates) * rates.fixed_seconds(row[0], row[1], row[2])


def op_seconds(row: list, rates: DeviceRates) -> float:
    """Seconds of one call of a :class:`StepCost` row, ``fixed + max(compute, memory)``.

    On a GPU the fixed part is the device's per-kernel time; the host's cost is accounted
    for the whole step in :func:`step_seconds`.
    """
    if rates.asynchronous:
        return _kernels(row[5], rates) * rates.device_kernel_seconds + _device_seconds(row, rates)
    return _host_seconds(row, rates) + _device_seconds(row, rates)


def step_seconds(cost: StepCost, rates: DeviceRates) -> float:
    """Predicted seconds of the kernels in ``cost`` on the device of ``rates``.

    A CPU runs each op's fixed cost and its arithmetic one after the other: the sum of
    :func:`op_seconds`. On a GPU the step takes the device time (kernels with their launch
    gaps) plus the host time (the per-kernel and per-module host costs): the two overlap
    only between the points where the host waits for the device, and an eager step has
    many (``.item()``, ``nonzero`` and length checks: 19 a step in a tiny wav2vec2's
    profile on an H200). Of the two bounds, the sum was the closer on the H200's 30 steps
    (median |error| 11.9 % against 25.2 % for the longer of the two; docs/benchmarks.md).
    """
    device = sum(op_seconds(r, rates) * r[6] for r in cost.rows)
    if not rates.asynchronous:
        return device
    host = sum(_host_seconds(r, rates) * r[6] for r in cost.rows)
    return device + host


def step_seconds_parts(cost: StepCost, rates: DeviceRates) -> tuple[float, float | None, float]:
    """``(fixed, host or None, arithmetic)`` seconds of the kernels in ``cost``.

    ``fixed`` is the per-kernel cost on the device's critical path (a GPU's launch gaps, a
    CPU's per-op cost), ``host`` a GPU's host-side per-kernel cost (None on a CPU) and
    ``arithmetic`` the roofline part. :func:`step_seconds` is ``fixed + arithmetic`` on a
    CPU and ``fixed + arithmetic + host`` on a GPU. The per-kernel parts do not grow
    with the batch; the arithmetic does.
    """
    arithmetic = arithmetic_seconds(cost, rates)
    if not rates.asynchronous:
        return sum(_host_seconds(r, rates) * r[6] for r in cost.rows), None, arithmetic
    fixed = sum(_kernels(r[5], rates) * rates.device_kernel_seconds * r[6] for r in cost.rows)
    host = sum(_host_seconds(r, rates) * r[6] for r in cost.rows)
    return fixed, host, arithmetic


def seconds_by_kind(cost: StepCost, rates: DeviceRates) -> dict[str, float]:
    """Predicted seconds per op kind (see :data:`KINDS`), largest first."""
    out: dict[str, float] = {}
    for r in cost.rows:
        out[r[1]] = out.get(r[1], 0.0) + op_seconds(r, rates) * r[6]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def kernel_counts(cost: StepCost, rates: DeviceRates) -> tuple[float, float]:
    """(forward kernels, other kernels) of ``cost`` as the device of ``rates`` runs them."""
    forward = sum(_kernels(r[5], rates) * r[6] for r in cost.rows if r[0] == "forward")
    other = sum(_kernels(r[5], rates) * r[6] for r in cost.rows if r[0] != "forward")
    return forward, other


def arithmetic_seconds(cost: StepCost, rates: DeviceRates) -> float:
    """The roofline part alone (``max(compute, memory)`` per op, no per-kernel cost)."""
    return sum(_device_seconds(r, rates) * r[6] for r in cost.rows)
