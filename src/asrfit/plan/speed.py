"""Predicted step time of a setup for any batch shape, from its traced kernels.

The planner traces a few shapes per setup (:mod:`asrfit.plan.costs`); each trace carries
the FLOPs and bytes of every kernel (:class:`asrfit.memory.steptime.roofline.StepCost`). For a
device's rates, each traced shape's forward + backward seconds come from the per-op
roofline (:func:`asrfit.memory.steptime.roofline.step_seconds`), split into per-kernel costs, which
depend on the shape but not on the batch, and arithmetic, which grows with it; each part is
fitted over the traced shapes (:class:`StepTimeFit`). The optimizer step (and
``zero_grad``) does not depend on the batch and is added once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from asrfit.memory.cuda.zero import unmodelled_step_time
from asrfit.memory.fit.costmodel import PeakModel, fit_peak_model, lerp_models
from asrfit.memory.steptime.roofline import step_seconds, step_seconds_parts
from asrfit.profiles.rates import DeviceRates

_NS = 1e9


@dataclass
class StepTimeFit:
    """Forward + backward seconds at ``(B, T, U)``: per-kernel costs plus arithmetic.

    A step's kernel count does not grow with the batch (a transducer loss's loop over frames
    and labels launches the same kernels for one utterance or a hundred), while each
    kernel's arithmetic and memory traffic does. So the two are fitted apart, each to its
    own exact values at the traced shapes (:mod:`asrfit.memory.steptime.roofline`): ``fixed`` and
    ``host`` as functions of ``(T, U)`` alone (evaluated at ``B = 1``), ``arithmetic`` as
    ``c0 + B (d + a T + b T^2 + c U)``, all in nanoseconds. A CPU runs them one after the
    other (``fixed + arithmetic``); on a GPU the host's time adds to the device's (launch
    gaps + arithmetic): an eager step waits for the device too often for them to overlap
    (:func:`asrfit.memory.steptime.roofline.step_seconds`).

    Attributes:
        fixed: Per-kernel device-side costs (a GPU's launch gaps; a CPU's per-op cost).
        host: Per-kernel host costs while a GPU computes, or None on a CPU.
        arithmetic: Roofline seconds of the kernels' FLOPs and bytes.
        optimizer_seconds: The optimizer step and ``zero_grad`` (batch-independent).
        max_relative_residual: Largest |fit - roofline| / roofline over the traced shapes.
    """

    fixed: PeakModel
    host: PeakModel | None
    arithmetic: PeakModel
    optimizer_seconds: float
    max_relative_residual: float = 0.0

    def forward_backward_seconds(
        self, batch_size: int, input_length: int, label_length: int
    ) -> float:
        """Predicted seconds of forward and backward (no optimizer step)."""
        device = self.fixed.predict(1, input_length, label_length) + self.arithmetic.predict(
            batch_size, input_length, label_length
        )
        if self.host is not None:
            device += self.host.predict(1, input_length, label_length)
        return device / _NS

    def seconds(self, batch_size: int, input_length: int, label_length: int) -> float:
        """Predicted seconds of one step (forward, backward and the optimizer)."""
        return self.forward_backward_seconds(batch_size, input_length, label_length) + (
            self.optimizer_seconds
        )

    def lerp(self, other: StepTimeFit, weight: float) -> StepTimeFit:
        """``(1 - weight) x self + weight x other``, part by part."""
        host = (
            lerp_models(self.host, other.host, weight)
            if self.host is not None and other.host is not None
            else None
        )
        return StepTimeFit(
            fixed=lerp_models(self.fixed, other.fixed, weight),
            host=host,
            arithmetic=lerp_models(self.arithmetic, other.arithmetic, weight),
            optimizer_seconds=self.optimizer_seconds,
        )


def _fit_fixed(points: list[tuple[int, int, float]]) -> PeakModel:
    """A batch-independent part: the points' values as a function of (T, U), at ``B = 1``."""
    return fit_peak_model([(1, t, u, max(1, round(v))) for t, u, v in points])


def _fits(costs: Any, rates: DeviceRates) -> tuple[dict[str, StepTimeFit], str]:
    """The fits kept on ``costs`` and the key of ``rates`` among them."""
    # A dataclass repr names every field; 10x cheaper than to_json (called per bucket).
    return costs.__dict__.setdefault("_speed_fits", {}), repr(rates)


def _fit(costs: Any, rates: DeviceRates) -> StepTimeFit:
    last = costs.__dict__.get("_speed_last")  # the planner asks per bucket, same rates object
    if last is not None and last[0] is rates:
        return last[1]
    fit = _fit_for(costs, rates)
    costs.__dict__["_speed_last"] = (rates, fit)
    return fit


def _fit_for(costs: Any, rates: DeviceRates) -> StepTimeFit:
    cache, key = _fits(costs, rates)
    if key not in cache:
        if len(costs.time_points) < 4:
            raise ValueError(
                f"{costs.setup.describe()}: {len(costs.time_points)} traced shapes carry kernel "
                "counts; the step-time fit needs 4 (clear the simulation cache if it predates them)."
            )
        parts = [(b, t, u, step_seconds_parts(cost, rates)) for b, t, u, cost in costs.time_points]
        optimizer = (
            step_seconds(costs.optimizer_cost, rates) if costs.optimizer_cost is not None else 0.0
        )
        fit = StepTimeFit(
            fixed=_fit_fixed([(t, u, p[0] * _NS) for _, t, u, p in parts]),
            host=_fit_fixed([(t, u, p[1] * _NS) for _, t, u, p in parts if p[1] is not None])
            if rates.asynchronous
            else None,
            arithmetic=fit_peak_model(
                [(b, t, u, max(1, round(p[2] * _NS))) for b, t, u, p in parts]
            ),
            optimizer_seconds=optimizer,
        )
        exact = [(b, t, u, step_seconds(cost, rates)) for b, t, u, cost in costs.time_points]
        fit.max_relative_residual = max(
            abs(fit.forward_backward_seconds(b, t, u) - s) / max(s, 1e-12) for b, t, u, s in exact
        )
        cache[key] = fit
    return cache[key]


def predict_step_seconds(
    costs: Any, rates: DeviceRates, batch_size: int, input_length: int, label_length: int
) -> float:
    """Seconds of one optimizer step of ``costs.setup`` at a padded batch shape.

    Args:
        costs: A :class:`asrfit.plan.costs.SetupCosts` (with its traced kernels).
        rates: The device's rates (:mod:`asrfit.profiles.rates`, :mod:`asrfit.profiles.host`).
        batch_size: Utterances per micro-batch.
        input_length: Padded model-input length.
        label_length: Padded label length.
    """
    return _fit(costs, rates).seconds(batch_size, input_length, label_length)


def step_time_fit(costs: Any, rates: DeviceRates) -> StepTimeFit:
    """The step-time fit of ``costs`` on the device of ``rates`` (made once, then kept)."""
    return _fit(costs, rates)


def set_step_time_fit(costs: Any, rates: DeviceRates, fit: StepTimeFit) -> None:
    """Give ``costs`` a step-time fit made elsewhere (an interpolation between two setups)."""
    cache, key = _fits(costs, rates)
    cache[key] = fit
    costs.__dict__.pop("_speed_last", None)


def fit_residual(costs: Any, rates: DeviceRates) -> float:
    """Largest relative residual of the step-time fit over the traced shapes."""
    return _fit(costs, rates).max_relative_residual


def loader_workers(
    train_audio_seconds_per_second: float,
    worker_audio_seconds_per_second: float,
    max_workers: int,
) -> tuple[int, bool]:
    """Data-loader workers that keep up with training, and whether loading bounds the step.

    Args:
        train_audio_seconds_per_second: What the device trains per second (per process).
        worker_audio_seconds_per_second: What one worker decodes and featurises per second
            (:func:`asrfit.data.throughput.measure_loader_rate`).
        max_workers: Workers the host can give this process (CPUs and RAM).

    Returns:
        ``(workers, bound)``: the fewest workers whose combined rate meets training with a
        25 % margin (at most ``max_workers``, at least 1 when any are allowed), and True
        when even ``max_workers`` fall short (loading, not the device, sets the pace).
    """
    if worker_audio_seconds_per_second <= 0:
        raise ValueError(
            f"worker_audio_seconds_per_second={worker_audio_seconds_per_second}: must be > 0."
        )
    needed = math.ceil(1.25 * train_audio_seconds_per_second / worker_audio_seconds_per_second)
    workers = min(max(1, needed), max_workers) if max_workers > 0 else 0
    capacity = max(workers, 1) * worker_audio_seconds_per_second
    return workers, capacity < train_audio_seconds_per_second


def speed_line(costs: Any, rates: DeviceRates | None) -> str:
    """The plan's "rests on" sentence for its throughput figures."""
    if rates is None:
        return "throughput: GPU not in the catalog; traced FLOPs at an assumed MFU"
    return (
        f"throughput: per-op roofline of the traced kernels (FLOPs, bytes, per-kernel cost) on "
        f"{rates.name} (fitted over the traced shapes within {fit_residual(costs, rates):.1%}); "
        + "; ".join(rates.sources)
        + unmodelled_step_time(costs.setup)
    )
