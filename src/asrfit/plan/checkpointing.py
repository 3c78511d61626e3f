"""How many encoder layers to checkpoint: the k of L that maximises predicted throughput.

Checkpointing is not all or nothing here (:mod:`asrfit.models.checkpointing` recomputes the
first k of L encoder layers). For one base setup (no checkpointing), the planner:

1. traces k = 1 (the simulator runs the real step with that layer checkpointed); k = 0
   and every layer checkpointed (the model's own gradient checkpointing) are traced anyway;
2. predicts every k from 2 to L without tracing: memory per shape is the larger of the
   k = 1 line continued (each checkpointed layer saves what the first one saved) and the
   all-layers trace (the floor no k goes below: the peak then sits where no encoder
   layer's activations are live); step time is the chord between none and all (each
   checkpointed layer adds one forward pass of that layer in backward, the same for every
   layer, :mod:`asrfit.plan.speed`);
3. plans buckets for each k (batch limits from the memory, throughput from the step time)
   and takes the fastest k, smallest on a tie;
4. traces that k for real (the trace replaces its prediction; while another predicted k is
   now faster, that one is traced too, up to 3): the plan's limits and predicted peaks come
   from traces, never from the interpolation. A pick predicted no faster than the fastest
   setup the search has already planned from traces (every layer checkpointed, often) is not
   traced: by its prediction it does not beat that setup (throughputs on duration buckets,
   as the screening compares them; two-dimensional buckets are weighed afterwards among the
   fastest).

Before anything checkpointed is traced, :func:`recompute_bound` may show that no
checkpointing can beat none, from the traces of none alone, where each encoder layer's
forward pass is marked (:mod:`asrfit.memory.steptime.layer_span`): its kernels up to its last
saved tensor (what checkpointing it runs again) and the bytes it leaves live (the most
checkpointing it frees). k layers: none's step plus the first k recomputes, none's peak less
what those k leave live; every layer: every recompute, no memory at all. Then neither every
layer nor any k is traced.

Before tracing k = 1, a bound may show that no k can beat none (:func:`no_k_can_win`):
every k is planned at most as well as a setup with the memory of every layer checkpointed
(the least any k keeps) and the step time of none plus half of one average layer's
recompute (the least a checkpointed layer adds; half, so that a first layer cheaper than the
average one, or recompute outside the encoder layers in the all-layers trace, stays inside
it). If that bound plans no faster than none, k = 1 and the picks are not traced. The
exhaustive search does not use the bound, so the benchmark's comparison checks it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from asrfit.errors import ConfigError
from asrfit.memory.cache import cached_model_fact
from asrfit.memory.fit.costmodel import PeakModel, fit_peak_model, lerp_models, subtract_models
from asrfit.memory.setup import Setup
from asrfit.memory.steptime.roofline import StepCost
from asrfit.plan.setup_costs import SetupCosts
from asrfit.plan.speed import set_step_time_fit, step_time_fit

logger = logging.getLogger(__name__)

# evaluate(setup or costs) -> (costs, (buckets, throughput, epoch seconds) or None)
_MAX_EXTRA_TRACES = 3
#: The least recompute :func:`no_k_can_win` counts for a checkpointed layer, as a share of
#: the average encoder layer's (module doc).
LEAST_RECOMPUTE = 0.5
#: Setups :func:`choose_layers` may trace for one base setup: every layer, k = 1, and the extra picks.
MAX_LAYER_EVALUATIONS = 2 + _MAX_EXTRA_TRACES
Evaluate = Callable[[Any], tuple[SetupCosts, Any]]


def encoder_layers_of(adapter: Any, config: dict[str, Any] | None = None) -> int:
    """Encoder layers that can be checkpointed one by one (0: none; built on the meta device).

    With the model's ``config`` (its profile's dict), the count is cached on disk with the
    simulations (:func:`asrfit.memory.cache.cached_model_fact`): a warm plan builds nothing.
    """

    def count() -> int:
        import torch  # builds on the meta device: only when the count is not cached

        from asrfit.models.checkpointing import encoder_layer_count

        try:
            with torch.device("meta"):
                model = adapter.build()
            return encoder_layer_count(model)
        except (ConfigError, RuntimeError, TypeError, ValueError, NotImplementedError) as err:
            logger.info("partial checkpointing not planned for %s: %s", adapter.name, err)
            return 0

    if config is None:
        return count()
    return int(cached_model_fact("encoder_layers", {"config": config}, count))


class _LineOrFloor:
    """``max(off + k * (one - off), floor)`` per shape: a memory model for k layers."""

    def __init__(self, off: PeakModel, one: PeakModel, floor: PeakModel, k: int) -> None:
        self.off, self.one, self.floor, self.k = off, one, floor, k

    def predict(self, batch_size: int, input_length: int, label_length: int) -> float:
        shape = (batch_size, input_length, label_length)
        off = self.off.predict(*shape)
        line = off + self.k * (self.one.predict(*shape) - off)
        return max(line, self.floor.predict(*shape))


def interpolated_costs(
    off: SetupCosts, one: SetupCosts, full: SetupCosts, k: int, layers: int, rates: Any
) -> SetupCosts:
    """Predicted costs of checkpointing the first ``k`` of ``layers`` (no trace; see module doc)."""
    costs = replace(
        full,
        setup=replace(off.setup, checkpoint_layers=k),
        memory=_LineOrFloor(off.memory, one.memory, full.memory, k),  # type: ignore[arg-type]
        flops=lerp_models(off.flops, full.flops, k / layers),
        time_points=[],
    )
    if rates is not None:
        fit = step_time_fit(off, rates).lerp(step_time_fit(full, rates), k / layers)
        set_step_time_fit(costs, rates, fit)
    return costs


def no_k_can_win(
    off: tuple[SetupCosts, Any],
    full: tuple[SetupCosts, Any],
    layers: int,
    evaluate: Evaluate,
    rates: Any,
) -> bool:
    """Whether a bound shows no k of ``layers`` planned faster than none (module doc).

    ``off`` and ``full`` are the costs and results of no layer and of every layer
    checkpointed; the bound plans the memory of ``full`` with the step time of ``off`` plus
    :data:`LEAST_RECOMPUTE` of one average layer's recompute.
    """
    if off[1] is None:
        return False
    weight = LEAST_RECOMPUTE / layers
    bound = replace(
        full[0],
        setup=replace(off[0].setup, checkpoint_layers=1),
        flops=lerp_models(off[0].flops, full[0].flops, weight),
        time_points=[],
    )
    if rates is not None:
        fit = step_time_fit(off[0], rates).lerp(step_time_fit(full[0], rates), weight)
        set_step_time_fit(bound, rates, fit)
    result = evaluate(bound)[1]
    return result is None or result[1] <= off[1][1]


_NO_MEMORY = PeakModel(0.0, 0.0, 0.0, 0.0)


def recompute_bound(
    off: tuple[SetupCosts, Any], evaluate: Evaluate, rates: Any, layers: int
) -> bool:
    """Whether no checkpointing (any k of the ``layers``, or every layer) can plan faster than
    none, by bounds from the traces of none alone (module doc).

    Each encoder layer's recompute and the bytes its forward pass leaves live are marked in
    those traces (:mod:`asrfit.memory.steptime.layer_span`). Checkpointing the first k layers
    is planned at most as well as none with the first k recomputes added to each traced step
    and its peak lowered by what those k layers leave live (a fit never under that figure at
    the traced shapes); every layer checkpointed (which may checkpoint other stacks too) as
    none with every layer's recompute and no memory at all. Where only the first layer is
    marked (a step scaled from reduced depths) or the allocator's classic segments round the
    fitted peaks, every checkpointing is planned with the first layer's recompute and no
    memory at all. False (no bound) where ``off`` does not fit, the step-time model has no
    device rates, or a traced shape lacks the marks.
    """
    costs, result = off
    if result is None or rates is None or not costs.time_points:
        return False
    marks = {(b, t, u): (c, left) for b, t, u, c, left in costs.layer_points}
    shapes = [(b, t, u) for b, t, u, _ in costs.time_points]
    if layers < 1 or any(not marks.get(s, ([], []))[0] for s in shapes):
        return False
    every = all(len(marks[s][0]) == layers for s in shapes)
    memory_points = [tuple(p[:3]) for p in costs.memory.points]
    per_k = (
        every
        and costs.expandable_segments
        and bool(memory_points)
        and all(len(marks.get(s, ([], []))[1]) == layers for s in memory_points)
    )

    def planned(memory: Any, k: int, no_states: bool) -> float:
        bound = replace(
            costs,
            setup=replace(costs.setup, checkpoint_layers=k),
            memory=memory,
            time_points=[
                (
                    b,
                    t,
                    u,
                    StepCost(cost.rows + [r for c in marks[(b, t, u)][0][:k] for r in c.rows]),
                )
                for b, t, u, cost in costs.time_points
            ],
            layer_points=[],
        )
        if no_states:
            bound = replace(
                bound,
                optimizer_peak_bytes=0,
                model_state_bytes=0,
                sharded_state_bytes=0,
                offloaded_bytes=0,
            )
        found = evaluate(bound)[1]
        return 0.0 if found is None else float(found[1])

    def freed_by(k: int) -> PeakModel:
        points = [(b, t, u, sum(marks[(b, t, u)][1][:k])) for b, t, u in memory_points]
        return subtract_models(costs.memory, fit_peak_model(points, never_under=True))

    def holds(low: int, high: int) -> bool:
        # k in low..high: at most the memory of high layers freed, at least low recomputes;
        # split where that does not hold, down to single k
        if planned(freed_by(high), low, False) <= result[1]:
            return True
        mid = (low + high) // 2
        return low < high and holds(low, mid) and holds(mid + 1, high)

    known = costs.__dict__.setdefault("_recompute_bounds", {})  # asked per twin, then per base
    if layers not in known:
        if per_k:
            known[layers] = planned(_NO_MEMORY, layers, True) <= result[1] and holds(1, layers)
        else:
            known[layers] = planned(_NO_MEMORY, 1, True) <= result[1]
        logger.info(
            "recompute bound for %s (%.1f audio s/s): %s",
            costs.setup.describe(),
            result[1],
            "no checkpointing plans faster" if known[layers] else "checkpointing could",
        )
    return known[layers]


@dataclass
class PartialChoice:
    """The chosen k for one base setup, traced, with what the others were predicted to give.

    Attributes:
        costs: Traced costs of the chosen k.
        result: ``(buckets, throughput, epoch seconds)`` of the chosen k.
        layers: L, the encoder layers.
        predicted: k -> predicted throughput (audio s/s per process; 0: does not fit).
    """

    costs: SetupCosts
    result: Any
    layers: int
    predicted: dict[int, float]

    @property
    def k(self) -> int:
        """Layers checkpointed."""
        return self.costs.setup.checkpoint_layers

    def reason(self, world: int = 1) -> str:
        """Why this k: its throughput against none and all layers."""

        def rate(k: int) -> str:
            value = self.predicted.get(k, 0.0) * world
            return f"{value:,.1f} audio s/s" if value > 0 else "does not fit"

        longest = self.result[0][-1]
        return (
            f"gradient checkpointing on the first {self.k} of {self.layers} encoder layers "
            f"(the backward pass reaches them last, so their recompute does not stack on the "
            f"saved activations): predicted {rate(self.k)}, against {rate(0)} with none and "
            f"{rate(self.layers)} with all {self.layers}; the longest bucket takes "
            f"{longest.batch_size} utterances. Each checkpointed layer frees its activations "
            "for larger batches and costs one more forward pass of that layer"
        )


def choose_layers(
    base: Setup,
    off: tuple[SetupCosts, Any],
    evaluate: Evaluate,
    layers: int,
    rates: Any,
    batch_cap: int | None = None,
    bound: bool = True,
    rival: float = 0.0,
) -> PartialChoice | None:
    """The fastest k in 1..L for ``base`` (no checkpointing), traced; None if no k fits.

    Args:
        base: A setup without checkpointing.
        off: Its traced costs and bucketing result (None result: it does not fit).
        evaluate: Costs and bucketing of a setup (traced) or of given costs (not traced).
        layers: L, the encoder layers.
        rates: The device's rates for the step-time model (None: FLOPs at an assumed MFU).
        batch_cap: The largest batch the target allows (None: no cap).
        bound: Return None without tracing anything checkpointed where
            :func:`recompute_bound`, or without tracing k = 1 where :func:`no_k_can_win` (the
            exhaustive search does not).
        rival: The throughput per process of the fastest setup already planned in full (0:
            none); with ``bound``, an extra pick predicted no faster is not traced: by the
            prediction it does not beat that setup (duration buckets).
    """
    if layers < 1 or base.gradient_checkpointing or base.checkpoint_layers:
        return None
    if (
        off[1] is not None
        and batch_cap is not None
        and all(b.batch_size >= batch_cap for b in off[1][0])
    ):
        return None  # memory does not limit any batch: recompute could only slow the step
    if bound and recompute_bound(off, evaluate, rates, layers):
        logger.info("no checkpointing can beat none for %s: not traced", base.describe())
        return None
    # every layer checkpointed, as the model's own gradient checkpointing does it (the
    # planner traces that setup anyway): the floor of memory and the far end of step time
    full = evaluate(replace(base, gradient_checkpointing=True))
    if full[1] is None:
        return None  # not even every layer checkpointed fits: no k does
    if bound and no_k_can_win(off, full, layers, evaluate, rates):
        logger.info("no k of %d layers can beat none for %s: not traced", layers, base.describe())
        return None
    traced = {0: off, 1: evaluate(replace(base, checkpoint_layers=1))}

    def throughput(result: Any) -> float:
        return 0.0 if result is None else float(result[1])

    predicted = {k: throughput(r) for k, (_, r) in traced.items()}
    for k in range(2, layers + 1):
        costs = interpolated_costs(traced[0][0], traced[1][0], full[0], k, layers, rates)
        predicted[k] = throughput(evaluate(costs)[1])
    for _ in range(_MAX_EXTRA_TRACES):  # trace the best predictions until a trace is best
        best = max((k for k in predicted if k >= 1), key=lambda k: (predicted[k], -k))
        if best in traced or predicted[best] <= (rival if bound else 0.0):
            break
        traced[best] = evaluate(replace(base, checkpoint_layers=best))
        guess, predicted[best] = predicted[best], throughput(traced[best][1])
        logger.info("k = %d traced: %.1f audio s/s, predicted %.1f", best, predicted[best], guess)
    fits = [k for k in traced if k >= 1 and traced[k][1] is not None]
    if not fits:
        return None
    k = max(fits, key=lambda k: (predicted[k], -k))
    return PartialChoice(traced[k][0], traced[k][1], layers, predicted)
