"""``plan``: the fastest setup that fits, with duration buckets and accumulation.

1. Candidate setups: precision (bf16 where the GPU has it, else fp16 with a scaler; fp32
   when asked), gradient checkpointing off/on, AdamW / 8-bit AdamW / Adafactor, and with
   several GPUs DDP or ZeRO 1-3; ZeRO with the optimizer state offloaded to the CPU only
   when nothing else fits, and ZeRO-3 with the parameters offloaded as well only when that
   does not fit either.
2. Each setup's memory and FLOPs come from cached simulations (:mod:`asrfit.plan.costs`).
3. For each setup, bucket edges are fitted to the dataset's durations (equal audio per
   bucket, several bucket counts tried); each bucket gets the largest batch whose
   predicted *reserved* memory fits usable memory; the bucket count with the highest
   predicted throughput wins (bins and limits chosen together).
4. The setup with the highest predicted throughput (audio seconds per second) wins. For it,
   each duration bucket is split by transcript length when that is predicted faster
   (two more traces; :mod:`asrfit.plan.label_buckets`), and the plan says both figures.
5. Accumulation meets the target effective batch; data-side decisions follow host RAM.

In code, :func:`plan` runs four phases, each with a typed result: the request's inputs
(:func:`asrfit.plan.inputs.plan_inputs` -> :class:`~asrfit.plan.inputs.PlanInputs`), the
search over setups with the checkpointing choice (:func:`search_setups` ->
:class:`SetupSearch`), the bucketing choice (:func:`choose` ->
:class:`~asrfit.plan.assemble.Choice`), and the plan (:func:`asrfit.plan.assemble.assemble_plan`).

Throughput model (:mod:`asrfit.plan.speed`): each traced shape's kernels (FLOPs and bytes
per op) are timed by the per-op roofline of :mod:`asrfit.memory.steptime.roofline` on the device's
rates (a catalog GPU's peaks and bandwidth, or this CPU's measured figures,
:mod:`asrfit.profiles.host`), fitted over batch and length, plus the optimizer step. Only a
detected GPU missing from the catalog falls back to FLOPs at a stated MFU.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from asrfit.errors import AsrfitError
from asrfit.memory.cache import model_key
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.plan.assemble import Candidate, Choice, assemble_plan
from asrfit.plan.bucketing import plan_buckets
from asrfit.plan.checkpointing import (
    MAX_LAYER_EVALUATIONS,
    choose_layers,
    encoder_layers_of,
    recompute_bound,
)
from asrfit.plan.costs import COARSE_TRACES, MAX_REFINE_TRACES, CostEstimator
from asrfit.plan.inputs import PlanInputs, check_request, plan_inputs
from asrfit.plan.label_buckets import LABEL_TRACES, SHORTLIST, choose_across
from asrfit.plan.plan import Plan
from asrfit.plan.progress import TraceProgress
from asrfit.plan.proposals import Shape, nothing_fits_proposals
from asrfit.plan.screen import refined, twin
from asrfit.plan.setup_costs import SetupCosts
from asrfit.profiles.host import device_rates

logger = logging.getLogger(__name__)


class PlanError(AsrfitError, ValueError):
    """No setup fits, or the request cannot be planned."""


def candidate_setups(
    hardware: Any,
    precision: str | None,
    world_size: int,
    freeze_feature_encoder: bool,
    offload: bool,
    offload_params: bool = False,
) -> list[Setup]:
    """The setups searched, cheapest in memory last (``offload``: ZeRO-2 and 3 with the
    optimizer state on the CPU; with ``offload_params``, ZeRO-3 with the parameters there too)."""
    if precision is not None:
        precisions = [Precision(precision)]
    elif hardware.num_gpus == 0:
        precisions = [Precision.FP32]
    else:
        precisions = [Precision.BF16 if hardware.supports_bf16 else Precision.FP16]
    stages: list[tuple[int, bool]] = (
        [(0, False)] if world_size == 1 else [(0, False), (1, False), (2, False), (3, False)]
    )
    if offload:
        stages = [(2, True), (3, True)]
    if offload_params:
        stages = [(3, True)]
    optimizers = [OptimizerKind.ADAMW, OptimizerKind.ADAMW_8BIT, OptimizerKind.ADAFACTOR]
    # bitsandbytes' 8-bit AdamW keeps its quantised state with CUDA kernels: not a CPU plan's
    # choice, nor one for this machine's GPUs when bitsandbytes is not installed here.
    no_bnb = importlib.util.find_spec("bitsandbytes") is None
    # Nor one whose state is offloaded: the optimizer then steps on the host's copy, where
    # bitsandbytes' kernels do not run (DeepSpeed's CPU Adam or a torch optimizer do).
    if hardware.num_gpus == 0 or (hardware.source == "detected" and no_bnb) or offload:
        optimizers.remove(OptimizerKind.ADAMW_8BIT)
    setups = []
    for p in precisions:
        for ckpt in (False, True):
            for opt in optimizers:
                for stage, off in stages:
                    setups.append(
                        Setup(
                            precision=p,
                            gradient_checkpointing=ckpt,
                            optimizer=opt,
                            freeze_feature_encoder=freeze_feature_encoder,
                            zero_stage=stage,
                            offload_optimizer=off,
                            offload_params=offload_params,
                            world_size=world_size,
                        )
                    )
    return setups


@dataclass
class SetupSearch:
    """The search over setups: what fits, what did not, and why.

    Attributes:
        candidates: The setups that fit, in search order.
        rejected: One line per setup that does not fit one utterance of the largest bucket.
        checkpointing_reasons: Why k layers are checkpointed, per setup that checkpoints k.
        all_costs: Every setup's costs (for proposals when nothing fits).
    """

    candidates: list[Candidate] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    checkpointing_reasons: dict[Setup, str] = field(default_factory=dict)
    all_costs: list[SetupCosts] = field(default_factory=list)


@dataclass
class SetupEvaluator:
    """Costs of a setup (traced) or of given costs (not traced), and their buckets.

    Calling it returns ``(costs, result)``; ``result`` is None when not even one utterance
    of the largest bucket fits, else ``(buckets, throughput, epoch seconds)`` per process.
    """

    inputs: PlanInputs
    hardware: Any
    estimator: CostEstimator
    num_utterances: int
    exhaustive: bool

    def __call__(self, setup: Setup | SetupCosts, refined: bool = True) -> tuple[SetupCosts, Any]:
        x = self.inputs
        costs = (
            setup
            if isinstance(setup, SetupCosts)
            else self.estimator.costs(
                setup,
                x.max_input,
                x.labels_per_second / x.frames_per_second,
                x.architecture,
                x.usable_bytes if refined else None,
            )
        )
        buckets = plan_buckets(
            costs,
            self.hardware,
            x.durations,
            x.usable_bytes,
            x.frames_per_second,
            x.labels_per_second,
            x.edge_max_seconds,
            x.batch_cap,
            self.num_utterances,
        )
        return costs, buckets


def search_setups(
    evaluate: SetupEvaluator,
    *,
    precision: str | None,
    freeze_feature_encoder: bool,
    progress: TraceProgress | None,
) -> SetupSearch:
    """Every candidate setup's fit, then how many layers to checkpoint; with the optimizer
    state offloaded to the CPU only when nothing fits without it, and the parameters as well
    only when nothing fits with that."""
    x, estimator, hardware = evaluate.inputs, evaluate.estimator, evaluate.hardware
    exhaustive = evaluate.exhaustive
    found = SetupSearch()
    layers = encoder_layers_of(x.adapter, x.profile.config)

    def skip(untraced: bool) -> None:  # a group not refined (untraced: not even coarsely)
        if progress is not None:
            progress.skip(MAX_REFINE_TRACES + (COARSE_TRACES if untraced else 0))

    cap = x.batch_cap if not exhaustive else None
    at_cap = None if cap is None else lambda r: all(b.batch_size >= cap for b in r[0])
    rates = device_rates(hardware)

    def cannot_win(off: tuple[SetupCosts, Any]) -> bool:
        return recompute_bound(off, evaluate, rates, layers)

    for offload, offload_params in ((False, False), (True, False), (True, True)):
        setups = candidate_setups(
            hardware, precision, x.world, freeze_feature_encoder, offload, offload_params
        )
        # at most: the refined groups, one state trace per optimizer, and what choosing how many
        # layers to checkpoint may trace (the unused part is skipped after the choice)
        per_choice = (
            MAX_LAYER_EVALUATIONS * (COARSE_TRACES + MAX_REFINE_TRACES + 1) if layers else 0
        )
        if progress is not None:
            groups = {(s.precision, s.gradient_checkpointing) for s in setups}
            states = {(s.precision, s.optimizer) for s in setups}
            progress.expect(
                (COARSE_TRACES + MAX_REFINE_TRACES) * len(groups) + len(states) + per_choice
            )
        without: list[tuple[Setup, SetupCosts, Any]] = []  # setups without checkpointing
        # every group's coarse traces and every optimizer's state, side by side where this
        # host has the cores (asrfit.plan.parallel); the search below finds them traced
        # (with a batch cap, checkpointing every layer is traced only where its twin without
        # checkpointing does not hold the cap everywhere: asrfit.plan.screen)
        screened = [s for s in setups if at_cap is None or twin(s) not in setups or s == twin(s)]
        estimator.prefetch_screening(
            screened, x.max_input, x.labels_per_second / x.frames_per_second
        )
        for setup, costs, result in refined(
            setups, evaluate, exhaustive, skip, at_cap, None if exhaustive else cannot_win
        ):
            found.all_costs.append(costs)
            if not setup.gradient_checkpointing:
                without.append((setup, costs, result))
            if result is None:
                edge = x.edge_max_seconds
                need = costs.reserved_bytes(1, x.max_input, math.ceil(edge * x.labels_per_second))
                found.rejected.append(
                    f"{setup.describe()}: needs {need / 2**30:.2f} GiB for one {edge:g} s utterance"
                )
                continue
            buckets, throughput, epoch = result
            found.candidates.append(
                Candidate(costs, buckets, throughput * x.world, epoch / x.world)
            )
        if without:
            _checkpoint_some_layers(found, without, evaluate, layers, per_choice, progress)
        if found.candidates:
            break
    return found


def _checkpoint_some_layers(
    found: SetupSearch,
    without: list[tuple[Setup, SetupCosts, Any]],
    evaluate: SetupEvaluator,
    layers: int,
    per_choice: int,
    progress: TraceProgress | None,
) -> None:
    """Checkpointing k of L layers, for one base: the fastest setup without checkpointing (the
    first in search order when none fits); other optimizers change the model states, not which
    layers are worth recomputing, and one choice keeps the traces few."""
    x = evaluate.inputs
    fitting = [w for w in without if w[2] is not None]
    base = max(fitting, key=lambda w: w[2][1]) if fitting else without[0]
    before = progress.done if progress is not None else 0

    planned = {costs.setup: costs for costs in found.all_costs}  # refined by the search

    def for_layers(setup: Setup | SetupCosts) -> tuple[SetupCosts, Any]:
        # the all-layers setup only anchors the predictions: its refined fit where the search
        # made one, else its coarse traces (made by the screening); every k the choice keeps
        # is traced in full
        if isinstance(setup, Setup) and setup in planned:
            return evaluate(planned[setup])
        full = isinstance(setup, Setup) and setup.gradient_checkpointing and not evaluate.exhaustive
        return evaluate(setup, not full)

    partial = choose_layers(
        base[0],
        (base[1], base[2]),
        for_layers,
        layers,
        device_rates(evaluate.hardware),
        x.batch_cap,
        bound=not evaluate.exhaustive,
        rival=max((c.throughput for c in found.candidates), default=0.0) / x.world,
    )
    if progress is not None:
        progress.skip(per_choice - (progress.done - before))
    if partial is not None:
        found.checkpointing_reasons[partial.costs.setup] = partial.reason(x.world)
        buckets, throughput, epoch = partial.result
        found.candidates.append(
            Candidate(partial.costs, buckets, throughput * x.world, epoch / x.world)
        )


def nothing_fits(x: PlanInputs, found: SetupSearch, hardware: Any, expandable: bool) -> PlanError:
    """The error when no setup fits, with what would fit, checked by the simulator."""
    gpu = hardware.spec.name if hardware.spec else hardware.source
    proposals = nothing_fits_proposals(
        adapter=x.adapter,
        profile=x.profile,
        costs=found.all_costs,
        usable_bytes=x.usable_bytes,
        shape=Shape(x.frames_per_second, x.labels_per_second),
        longest_seconds=x.edge_max_seconds,
        target_batch=x.batch_cap or 1,
        architecture=x.architecture,
        expandable=expandable,
        gpu=gpu,
    )
    return PlanError(
        f"{x.adapter.name} does not fit {x.usable_bytes / 2**30:.2f} GiB usable on {x.world} x "
        f"{gpu} even at batch 1 of {x.edge_max_seconds:g} s. Tried:\n  "
        + "\n  ".join(found.rejected)
        + f"\nNot tried, and not checked: {untried_words(found, hardware)}."
        + "\nProposals (checked by the simulator):\n  "
        + "\n  ".join(proposals)
    )


def untried_words(found: SetupSearch, hardware: Any) -> str:
    """What else might fit, among what the search did not try (it tries the 8-bit optimizer
    where it can run, and ZeRO with CPU offload, parameters too, whenever nothing fits
    without): so no advice names a setup the error lists as tried. Chunking is the
    proposals' to judge."""
    tried = {costs.setup.optimizer for costs in found.all_costs}
    ideas = []
    if OptimizerKind.ADAMW_8BIT not in tried and hardware.num_gpus:
        ideas.append("the 8-bit optimizer (install bitsandbytes where the GPU is)")
    ideas.append("more GPUs (--world-size), over which ZeRO shards the model states")
    ideas.append("a GPU with more memory")
    return "; ".join(ideas[:-1]) + "; or " + ideas[-1]


def choose(found: SetupSearch, evaluate: SetupEvaluator, dataset: Any, bucketing: str) -> Choice:
    """The fastest setup once duration x label buckets have had their say."""
    x = evaluate.inputs
    candidates = sorted(found.candidates, key=lambda c: -c.throughput)
    at, (chosen_costs, chosen, dims, reason) = choose_across(
        candidates,
        x.world,
        evaluate.estimator,
        evaluate.hardware,
        x.durations,
        x.paired_labels,
        x.usable_bytes,
        x.frames_per_second,
        x.labels_per_second,
        x.edge_max_seconds,
        x.batch_cap,
        dataset.num_utterances,
        bucketing,
    )
    candidates.insert(0, candidates.pop(at))  # the chosen first, the others as alternatives
    best = candidates[0]
    setup = best.costs.setup
    if dims == "2d":
        buckets, throughput, epoch = chosen
        best = Candidate(chosen_costs, buckets, throughput * x.world, epoch / x.world)
    return Choice(
        setup=setup,
        best=best,
        alternatives=candidates[1:],
        dims=dims,
        bucketing_reason=reason,
        checkpointing_reason=found.checkpointing_reasons.get(setup, ""),
        rejected=found.rejected,
    )


def plan(
    hardware: Any,
    dataset: Any,
    model: Any,
    *,
    target_effective_batch: int | None = 32,
    target_hours: float | None = None,
    precision: str | None = None,
    world_size: int | None = None,
    num_nodes: int = 1,
    long_utterances: str = "chunk",
    max_seconds: float | None = None,
    freeze_feature_encoder: bool = True,
    expandable_segments: bool = True,
    loader_audio_seconds_per_second: float | None = None,
    exhaustive: bool = False,
    progress: TraceProgress | None = None,
    bucketing: str = "auto",
) -> Plan:
    """Choose the fastest setup that fits, with per-bucket batch limits and accumulation.

    Args:
        hardware: A ``HardwareProfile`` (its usable bytes, peak rates, host RAM and CPUs).
        dataset: A ``DatasetProfile`` (its duration and transcript samples).
        model: A model spec (bundled name, Hub id, path) or transformers config.
        target_effective_batch: Utterances per optimizer step over all GPUs (Default: 32).
        target_hours: Audio hours per optimizer step instead (overrides utterances).
        precision: Force "fp32", "bf16", "fp16" or "pure_bf16" (Default: bf16 if supported, else fp16).
        world_size: Processes over all nodes (Default: the hardware's GPU count, at least 1).
        num_nodes: Machines the processes run on, dividing the world size (Default: 1).
        long_utterances: "chunk" (Default) or "filter" utterances above the largest bucket.
        max_seconds: Largest bucket edge (Default: the longest utterance in the dataset).
        freeze_feature_encoder: Freeze wav2vec2-style conv encoders (Default: True).
        expandable_segments: Whether the run sets ``expandable_segments:True`` (Default: True).
        loader_audio_seconds_per_second: Audio seconds one data-loader worker decodes and
            featurises per second on this host (:func:`asrfit.data.throughput.measure_loader_rate`).
            With it, the workers are set to keep up with the predicted training rate, and the
            plan says (and predicts) when loading bounds the step. (Default: None, not measured)
        exhaustive: Refine every setup's fit with traces near the budget, instead of only the
            setups that screening on coarse traces leaves in contention
            (:func:`asrfit.plan.screen.refined`). Same plan, more simulations; for
            checking the screen. (Default: False)
        progress: Shows each new simulation and at most how many remain
            (:meth:`asrfit.plan.progress.TraceProgress.for_terminal`). (Default: None)
        bucketing: ``"auto"`` (duration x label buckets when predicted faster, two more
            traces), ``"1d"`` (duration buckets) or ``"2d"`` (label ranges whenever the
            profile pairs durations with transcripts) (:mod:`asrfit.plan.label_buckets`).
            (Default: "auto")

    Returns:
        The plan.

    Raises:
        PlanError: When no setup fits even one utterance of the longest bucket.
        ConfigError: On invalid arguments.
    """
    started = time.perf_counter()
    check_request(long_utterances, target_hours, target_effective_batch, bucketing)
    x = plan_inputs(
        hardware,
        dataset,
        model,
        target_effective_batch=target_effective_batch,
        target_hours=target_hours,
        precision=precision,
        world_size=world_size,
        long_utterances=long_utterances,
        max_seconds=max_seconds,
        freeze_feature_encoder=freeze_feature_encoder,
    )
    estimator = CostEstimator(
        x.adapter,
        model_key(x.adapter.name + repr(x.profile.config)),
        x.profile.trainable_params,
        max(1, round(x.frames_per_second)),
    )
    estimator.progress = progress
    estimator.expandable_segments = expandable_segments
    if progress is not None:
        progress.frames_per_second = x.frames_per_second
        progress.expect(0 if bucketing == "1d" else LABEL_TRACES * SHORTLIST)
    evaluate = SetupEvaluator(x, hardware, estimator, dataset.num_utterances, exhaustive)
    found = search_setups(
        evaluate,
        precision=precision,
        freeze_feature_encoder=freeze_feature_encoder,
        progress=progress,
    )
    if not found.candidates:
        if progress is not None:
            progress.close()
        raise nothing_fits(x, found, hardware, expandable_segments)
    choice = choose(found, evaluate, dataset, bucketing)
    if progress is not None:
        progress.close()
    result = assemble_plan(
        x,
        choice,
        hardware,
        dataset,
        target_effective_batch=target_effective_batch,
        target_hours=target_hours,
        num_nodes=num_nodes,
        long_utterances=long_utterances,
        expandable_segments=expandable_segments,
        loader_audio_seconds_per_second=loader_audio_seconds_per_second,
    )
    logger.info(
        "planned in %.1f s (%d new simulations, %d steps replayed from their tapes)",
        time.perf_counter() - started,
        estimator.simulations,
        estimator.replays,
    )
    return result
