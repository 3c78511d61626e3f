"""Per-setup memory and FLOP models, fitted to a few cached simulations.

Cost per setup, from traces of **one** step (half the work of two):

- Forward/backward peak of step 1 has no optimizer state yet; the steady (step 2) peak of
  those phases is the same plus the optimizer state bytes, which step 1 creates. Fitted
  over four shapes per (precision, checkpointing) as ``c0 + B*(aT + bT^2 + cU)``.
- The optimizer phase's peak (grads, state and the update's temporaries; no activations)
  does not depend on the batch: one tiny trace per (precision, optimizer).
- FLOPs per step ``B*(aT + bT^2 + cU)`` from the same traces (checkpointing's recompute
  included).

The refinement's batches are replayed from tapes (:mod:`asrfit.plan.tapes`): two at their
length, or one there and two at another; where neither replays, a companion is traced first.

Reserved memory counts allocator segments: classic segments' rounding is fitted with each
traced peak; expandable segments' pages (less than 22 MiB) are added as a bound. The steady
peak of a batch is the larger of the two phases. ZeRO and DDP change model states by formula
(:func:`asrfit.memory.cuda.zero.shard_breakdown`).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from asrfit.memory.cache import cache_key, cached, is_cached
from asrfit.memory.cuda.zero import gradient_bytes, offloaded_bytes, shard_breakdown
from asrfit.memory.fit.costmodel import PeakModel, fit_line_and_floor, fit_peak_model
from asrfit.memory.setup import OptimizerKind, Setup
from asrfit.memory.step import BatchShape, StepAdapter, StepMemory
from asrfit.memory.steptime.roofline import StepCost
from asrfit.memory.tape import Tape
from asrfit.plan.parallel import map_forked, trace_workers
from asrfit.plan.setup_costs import SetupCosts
from asrfit.plan.tapes import Tapes, Traced, load_traced, save_traced

#: A simulation as :meth:`CostEstimator._simulate` asks for it:
#: ``(batch, setup, optimizer_step, forward_backward)``.
Request = tuple[BatchShape, Setup, bool, bool]


# The tracing code imports torch (1.3 s) at the first trace: a plan whose simulations are all
# cached never imports it. Module attributes, so that benches and tests can replace them.
def simulate_step(*args: Any, **kwargs: Any) -> StepMemory:
    """:func:`asrfit.memory.simulate.simulate_step`."""
    from asrfit.memory.simulate import simulate_step as trace

    return trace(*args, **kwargs)


def scaled_step(*args: Any, **kwargs: Any) -> StepMemory:
    """:func:`asrfit.memory.fit.depth.scaled_step`."""
    from asrfit.memory.fit.depth import scaled_step as trace

    return trace(*args, **kwargs)


# Batches of the coarse shapes. Not 1: a batch of one takes other paths in the model code
# (bench/investigations/trace_tapes.py), and at batches of 1-2 the peak of a checkpointed
# setup may sit where few activations are live, so a fit on them underestimates the slope
# in the batch (XLS-R-1B with 35 of 48 layers checkpointed: a ninth of the real slope).
COARSE_BATCHES = (2, 4)


def coarse_shapes(max_input_length: int) -> list[tuple[int, int]]:
    """Coarse (batch, length) shapes for a first fit."""
    t = max_input_length
    small, large = COARSE_BATCHES
    return [(small, t // 4), (small, t), (large, t // 2), (large, t)]


COARSE_TRACES = 4  # shapes of coarse_shapes
MAX_REFINE_TRACES = 6  # two batches at three lengths
_REFINE_MAX_BATCH = 512
_NEAR_BUDGET = 0.4  # points above this share of the budget decide the final fit
# a coarse batch this far above the refined batches' line peaks elsewhere: a floor, not a point
# of the line (parakeet-ctc-1.1b, 30 of 42 layers checkpointed: 6-29 % above it)
_ELSEWHERE = 0.05


DEPTH_SCALING = True  # trace repeated layers at reduced depth (asrfit.memory.fit.depth)
# ... when the model has at least this many times the layers of the reduced traces together
# (bench/plan_speed.py: slower than the full trace for 12-layer wav2vec2-base and 12+12-layer
# whisper-small, faster for 48-layer XLS-R-1B)
DEPTH_WORTH = 2.0


class CostEstimator:
    """Fits :class:`SetupCosts` for one model, reusing simulations across setups and runs.

    Args:
        adapter: The model's step adapter.
        model_key: A string that identifies the model config (cache key).
        trainable_params: Trainable parameter count (for ZeRO formulas).
        min_input_length: Input length of a tiny shape (about 1 s of audio).
        target: Kernels to follow ("cuda").
    """

    def __init__(
        self,
        adapter: StepAdapter,
        model_key: str,
        trainable_params: int,
        min_input_length: int,
        target: str = "cuda",
    ) -> None:
        self.adapter = adapter
        self.model_key = model_key
        self.trainable_params = trainable_params
        self.min_input_length = min_input_length
        self.target = target
        self.simulations = 0
        # this run's tapes, and the steps replayed from them (.enabled False: trace them all)
        self.tapes = Tapes(adapter.name, target, COARSE_BATCHES)
        self.depth_scaling = DEPTH_SCALING
        # the run's allocator: what the fits count of a trace's segments, and what its costs'
        # reserved figure adds (asrfit.memory.cuda.allocator.reserved_of_fitted_peak)
        self.expandable_segments = True
        self._memo: dict[str, StepMemory] = {}  # this run's traces, also with the cache off
        self._ready: dict[str, StepMemory] = {}  # traced by prefetch's workers, not yet asked for
        self._ready_replays: dict[str, bool] = {}  # ... whether it replayed every reduced trace
        self._replayed_ready: dict[str, StepMemory] = {}  # ... and replayed by it
        self._traced_here = False  # whether this process has traced (imported the model's code)
        self.progress: Any = None  # asrfit.plan.progress.TraceProgress, when shown
        self._fits: dict[tuple, tuple[PeakModel, PeakModel]] = {}
        self._optimizer: dict[tuple, StepMemory] = {}
        self._time_points: dict[tuple, list[tuple[int, int, int, StepCost]]] = {}
        self._layers: dict[tuple, tuple] = {}  # (fit key, B, T, U) -> the step's layer marks
        self._last_tapes: list[tuple[Any, Tape]] = []  # the latest trace's (for a worker)
        self._replayed_rows = False  # whether it replayed every reduced trace of a scaled step

    def _simulate(
        self,
        batch: BatchShape,
        setup: Setup,
        what: str,
        optimizer_step: bool = True,
        forward_backward: bool = True,
    ) -> StepMemory:
        key = self._key(batch, setup, optimizer_step, forward_backward)

        def compute() -> StepMemory:
            ready = self._ready.pop(key, None)  # traced by a worker (prefetch)
            replayed = self._replayed_ready.pop(key, None)  # replayed by prefetch
            if ready is None and replayed is None:
                replayed = self.tapes.replayed(batch, setup, optimizer_step, forward_backward)
            if replayed is not None:
                if self.progress is not None:
                    self.progress.skip(1)
                return replayed
            if self.progress is not None:
                self.progress.started(batch, setup, what)
            step = ready or self.trace(batch, setup, optimizer_step, forward_backward)
            if self._ready_replays.pop(key) if ready is not None else self._replayed_rows:
                self.tapes.replays += 1
            else:
                self.simulations += 1
            return step

        if key not in self._memo:
            self._memo[key] = cached(key, compute)
        return self._memo[key]

    def _key(
        self, batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool
    ) -> str:
        return cache_key(
            self.model_key, batch, setup, self.target, 1, optimizer_step, forward_backward
        )

    def trace(
        self, batch: BatchShape, setup: Setup, optimizer_step: bool, forward_backward: bool
    ) -> StepMemory:
        """One uncached trace of ``batch`` under ``setup`` (reduced depth where it pays); its
        tapes are kept for replays, and a scaled step's reduced traces replayed where they can
        be (then :attr:`_replayed_rows`: the step is a replay)."""
        self._traced_here = True
        tapes: list[Tape] = []
        common = {
            "target": self.target,
            "steps": 1,
            "optimizer_step": optimizer_step,
            "forward_backward": forward_backward,
            "keep_tape": tapes,
        }
        rows = self.tapes.rows(batch, setup, optimizer_step, forward_backward)
        if self.depth_scaling:  # a few layers per stack, scaled (full trace as fallback)
            step = scaled_step(self.adapter, batch, setup, worth=DEPTH_WORTH, rows=rows, **common)
        else:
            step = simulate_step(self.adapter, batch, setup, **common)
        self._last_tapes = [(None, tape) for tape in tapes] + rows.kept
        self._replayed_rows = rows.all_replayed and not tapes
        for tape in tapes:  # a whole model's (a scaled step's rows keep their own)
            self.tapes.keep(setup, optimizer_step, forward_backward, tape)
        if self.depth_scaling:
            from asrfit.memory.fit.depth import whole_cheaper

            self.tapes.forget_rows(whole_cheaper(self.adapter))
        return step

    @property
    def replays(self) -> int:
        """Steps replayed from this run's tapes instead of traced."""
        return self.tapes.replays

    def prefetch(self, requests: list[Request]) -> None:
        """Trace the uncached ``requests`` side by side (:mod:`asrfit.plan.parallel`).

        Each is ``(batch, setup, optimizer_step, forward_backward)``, as :meth:`_simulate`
        will ask for it; the results wait for that call, which counts and caches them as if
        it had traced them. Nothing happens with one worker, for fewer than two uncached
        requests, or for a CPU target (its traces depend on this process's thread count).
        """
        if self.target == "cpu":
            return
        todo: dict[str, Request] = {}
        for request in requests:
            key = self._key(*request)
            if key in self._memo or key in self._ready or is_cached(key):
                continue
            replayed = self.tapes.replayed(*request) if self.tapes.replayable(*request) else None
            if replayed is not None:  # waits for its call, as a worker's trace does
                self._replayed_ready[key] = replayed
                continue
            todo.setdefault(key, request)
        workers = trace_workers() if len(todo) > 1 else 1
        if workers < 2:
            return
        if not self._traced_here:
            # the first trace imports the tracing code (and the model's, where nothing has
            # built it yet), warms the fake-tensor caches and learns whether its setup is
            # traced whole (all then keep alike tapes): here, once, for workers to share
            key = next(iter(todo))
            self._ready[key] = self.trace(*todo.pop(key))
            self._ready_replays[key] = self._replayed_rows
        from asrfit.memory.fit.depth import learn_whole_cheaper, whole_cheaper

        def job(request: Request) -> Traced:
            # with what it taught about tracing the setup whole (asrfit.memory.fit.depth)
            step = self.trace(*request)
            return step, whole_cheaper(self.adapter), self._last_tapes, self._replayed_rows

        jobs = [functools.partial(job, request) for request in todo.values()]
        for (key, request), result in zip(
            todo.items(), map_forked(jobs, workers, save_traced, load_traced), strict=True
        ):
            if result is not None:
                self._ready[key], self._ready_replays[key] = result[0], result[3]
                learn_whole_cheaper(self.adapter, result[1])
                for row, tape in result[2]:
                    self.tapes.keep(request[1], request[2], request[3], tape, row)
        self.tapes.forget_rows(whole_cheaper(self.adapter))

    def _activation_fit(
        self,
        setup: Setup,
        max_input_length: int,
        labels_per_step: float,
        budget_bytes: int | None,
    ) -> tuple[PeakModel, PeakModel]:
        key = _fit_key(setup, max_input_length, budget_bytes)
        if key not in self._fits:
            base = _activation_base(setup)
            points: list[tuple[int, int, int, int]] = []
            flop_points: list[tuple[int, int, int, int]] = []

            def shape(b: int, t: int) -> BatchShape:
                return self._shape(b, t, labels_per_step)

            def trace(shapes: list[BatchShape]) -> None:
                self.prefetch_activations(shapes, setup)
                for s in shapes:
                    step = self._simulate(s, base, "activations", False)
                    # Step 1 has no optimizer state during forward/backward (made afterwards).
                    # reserved memory counts segments
                    fwd_bwd = step.forward_backward_peak_bytes + self._overhead(step)
                    b, t, u = s.batch_size, s.input_length, s.label_length
                    points.append((b, t, u, fwd_bwd))
                    flop_points.append((b, t, u, max(step.flops, 1)))
                    self._time_points.setdefault(key, []).append(
                        (b, t, u, step.cost.select(("forward", "backward")))
                    )
                    self._layers[(key, b, t, u)] = (step.layer_costs, step.layer_left_bytes)

            trace([shape(b, t) for b, t in coarse_shapes(max_input_length)])
            memory = fit_peak_model(points)
            if budget_bytes is not None:
                # Refine where the planner decides: the largest batch that fits at three
                # lengths, and half of it; then fit on the points near the budget.
                lengths = (max_input_length // 4, max_input_length // 2, max_input_length)
                batches = {
                    t: self._first_guess(memory, budget_bytes, t, labels_per_step) for t in lengths
                }
                refine = [
                    shape(batch, t)
                    for t in lengths
                    for batch in sorted({batches[t], batches[t] // 2} - {0, *COARSE_BATCHES})
                ]
                trace(refine)
                memory = near_budget_fit(points, budget_bytes)
            self._fits[key] = (memory, fit_peak_model(flop_points))
        return self._fits[key]

    @staticmethod
    def _first_guess(memory: PeakModel, budget_bytes: int, t: int, labels_per_step: float) -> int:
        """The largest batch the first (coarse) fit allows at length ``t``, up to 512."""
        u = max(1, round(t * labels_per_step))
        return min(memory.max_batch(budget_bytes, t, u), _REFINE_MAX_BATCH)

    def _overhead(self, step: StepMemory) -> int:
        """Classic segments' rounding at a traced peak, fitted; expandable segments' pages step
        by 20 MiB, noise to a linear fit: :func:`~asrfit.memory.cuda.allocator.reserved_of_fitted_peak`."""
        return 0 if self.expandable_segments else step.segment_overhead_bytes(False)

    def _shape(self, batch_size: int, input_length: int, labels_per_step: float) -> BatchShape:
        """An activation trace's shape (at least the tiny input length; labels by rate)."""
        t = max(input_length, self.min_input_length)
        return BatchShape(batch_size, t, max(1, round(t * labels_per_step)))

    def prefetch_screening(
        self, setups: list[Setup], max_input_length: int, labels_per_step: float
    ) -> None:
        """Trace side by side what screening ``setups`` needs: every group's coarse shapes and
        every optimizer's state (:meth:`prefetch`; the same requests :meth:`costs` makes)."""
        requests: list[Request] = [
            (self._shape(b, t, labels_per_step), _activation_base(setup), False, True)
            for setup in setups
            for b, t in coarse_shapes(max_input_length)
        ]
        requests += [self._optimizer_request(setup) for setup in setups]
        self.prefetch(requests)

    def activation_step(self, batch: BatchShape, setup: Setup, what: str) -> StepMemory:
        """The activation trace of ``setup`` at ``batch`` (forward and backward of step 1,
        SGD: :func:`_activation_base`), cached, prefetched or replayed like the fit's."""
        return self._simulate(batch, _activation_base(setup), what, False)

    def prefetch_activations(self, shapes: list[BatchShape], setup: Setup) -> None:
        """:meth:`prefetch` the activation traces of ``setup`` at ``shapes``, after their
        companions (:meth:`Tapes.companions`: traced for their tapes only, to replay the
        shapes they complete)."""
        base = _activation_base(setup)
        companions = self.tapes.companions(shapes, base)
        self.prefetch([(s, base, False, True) for s in companions])
        for s in companions:
            self._simulate(s, base, "tape", False)
        self.prefetch([(s, base, False, True) for s in shapes])

    def _optimizer_request(self, setup: Setup) -> Request:
        """The optimizer-state trace of ``setup``: the optimizer phase's peak and the model
        states do not depend on the batch, so it is traced on the gradients backward leaves,
        without a forward and backward pass, at a tiny shape."""
        base = Setup(
            precision=setup.precision,
            optimizer=setup.optimizer,
            freeze_feature_encoder=setup.freeze_feature_encoder,
        )
        return (BatchShape(1, self.min_input_length, 1), base, True, False)

    def _optimizer_trace(self, setup: Setup) -> StepMemory:
        key = (setup.precision, setup.optimizer, setup.freeze_feature_encoder)
        if key not in self._optimizer:
            batch, base, _, _ = self._optimizer_request(setup)
            self._optimizer[key] = self._simulate(
                batch, base, f"{setup.optimizer.value} state", forward_backward=False
            )
        return self._optimizer[key]

    def costs(
        self,
        setup: Setup,
        max_input_length: int,
        labels_per_step: float,
        architecture: str | None = None,
        budget_bytes: int | None = None,
    ) -> SetupCosts:
        """Fit the costs of ``setup`` for batches up to ``max_input_length``.

        With ``budget_bytes`` (usable memory), the fit is refined by traces at the largest
        batches that fit, where the planner's limits are decided, at every length it refines:
        also where a batch cap (the target) will set the limit, since those points shape the
        fit at the other lengths too.
        """
        memory, flops = self._activation_fit(setup, max_input_length, labels_per_step, budget_bytes)
        opt = self._optimizer_trace(setup)
        state = opt.optimizer_state_bytes
        # the state stays, steady (under the floor's branch too)
        floor = memory.floor_bytes + state if memory.floor_bytes else 0.0
        steady = replace(memory, c0_bytes=memory.c0_bytes + state, floor_bytes=floor)
        param_bytes = opt.breakdown_bytes.get("parameters", 0)
        grad_bytes = gradient_bytes(setup, self.trainable_params)
        states = {"parameters": param_bytes, "gradients": grad_bytes, "optimizer_state": state}
        sharded, _ = shard_breakdown(states, setup, self.trainable_params)
        optimizer_peak = opt.phase_peaks_bytes.get("optimizer", 0)
        if opt.peak_phase == "optimizer":  # the peak whose segments the trace counted
            optimizer_peak += self._overhead(opt)
        optimizer_cost = opt.cost.select(("optimizer", "zero_grad"))
        if setup.offload_optimizer:
            # the step runs on the host's copy of the state (DeepSpeed's CPU optimizer): the
            # traced update's temporaries and kernels are not the GPU's, which holds the
            # sharded states alone then (fewer than in the forward and backward passes)
            optimizer_peak, optimizer_cost = 0, None
        key = _fit_key(setup, max_input_length, budget_bytes)
        time_points = self._time_points.get(key, [])
        marks = [(*p[:3], *self._layers[(key, *p[:3])]) for p in time_points]
        return SetupCosts(
            setup=setup,
            memory=steady,
            optimizer_peak_bytes=optimizer_peak,
            model_state_bytes=sum(states.values()),
            sharded_state_bytes=sum(sharded.values()),
            offloaded_bytes=offloaded_bytes(states, setup, self.trainable_params),
            flops=flops,
            architecture=architecture,
            expandable_segments=self.expandable_segments,
            time_points=time_points,
            optimizer_cost=optimizer_cost,
            layer_points=marks,
        )


def near_budget_fit(points: list[tuple[int, int, int, int]], budget_bytes: int) -> PeakModel:
    """The final memory fit of a refined setup: never under its points above
    :data:`_NEAR_BUDGET` of the budget (all of them, with fewer than 4 there).

    A small coarse batch that peaks elsewhere (where the activations barely show), more than
    :data:`_ELSEWHERE` above the line the refined batches near the budget lie on, would hold
    one line never under every point far above them: it is left out of the line and kept as
    a floor instead (:func:`~asrfit.memory.fit.costmodel.fit_line_and_floor`).
    """
    near = [p for p in points if p[3] >= _NEAR_BUDGET * budget_bytes]
    fitted = near if len(near) >= 4 else points
    refined = [p for p in fitted if p[0] not in COARSE_BATCHES]
    if len(refined) < 4 or len({p[1] for p in refined}) < 2:
        return fit_peak_model(fitted, never_under=True)
    line = fit_peak_model(refined, never_under=True)
    elsewhere = [
        p
        for p in fitted
        if p[0] in COARSE_BATCHES and p[3] > (1 + _ELSEWHERE) * line.predict(*p[:3])
    ]
    if not elsewhere:
        return fit_peak_model(fitted, never_under=True)
    return fit_line_and_floor([p for p in fitted if p not in elsewhere], elsewhere)


def _fit_key(setup: Setup, max_input_length: int, budget: int | None) -> tuple:
    """What an activation fit (and its time points) depends on."""
    return (_activation_base(setup), max_input_length, budget)


def _activation_base(setup: Setup) -> Setup:
    """The setup the activation traces of ``setup`` run: its precision and checkpointing,
    plain SGD (step 1 has no optimizer state during forward and backward)."""
    return Setup(
        precision=setup.precision,
        gradient_checkpointing=setup.gradient_checkpointing,
        checkpoint_layers=setup.checkpoint_layers,
        optimizer=OptimizerKind.SGD,
        freeze_feature_encoder=setup.freeze_feature_encoder,
    )
