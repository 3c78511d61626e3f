"""``plan``: the fastest setup that fits, with duration buckets and accumulation.

1. Candidate setups: precision (bf16 where the GPU has it, else fp16 with a scaler; fp32
   when asked), gradient checkpointing off/on, AdamW / 8-bit AdamW / Adafactor, and with
   several GPUs DDP or ZeRO 1-3; ZeRO with CPU offload only when nothing else fits.
2. Each setup's memory and FLOPs come from cached simulations (:mod:`asrfit.plan.costs`).
3. For each setup, bucket edges are fitted to the dataset's durations (equal audio per
   bucket, several bucket counts tried); each bucket gets the largest batch whose
   predicted *reserved* memory fits usable memory; the bucket count with the highest
   predicted throughput wins (bins and limits chosen together).
4. The setup with the highest predicted throughput (audio seconds per second) wins. For it,
   each duration bucket is split by transcript length when that is predicted faster
   (two more traces; :mod:`asrfit.plan.label_buckets`), and the plan says both figures.
5. Accumulation meets the target effective batch; data-side decisions follow host RAM.

Throughput model (:mod:`asrfit.plan.speed`): each traced shape's kernels (FLOPs and bytes
per op) are timed by the per-op roofline of :mod:`asrfit.memory.roofline` on the device's
rates (a catalog GPU's peaks and bandwidth, or this CPU's measured figures,
:mod:`asrfit.profiles.host`), fitted over batch and length, plus the optimizer step. Only a
detected GPU missing from the catalog falls back to FLOPs at a stated MFU.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from asrfit.errors import AsrfitError, ConfigError
from asrfit.memory.allocator import CUDA_CONTEXT_BYTES
from asrfit.memory.cache import model_key
from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.memory.step import SUPPORTED_FAMILIES
from asrfit.plan.bucketing import plan_buckets
from asrfit.plan.checkpointing import MAX_LAYER_EVALUATIONS, choose_layers, encoder_layers_of
from asrfit.plan.costs import (
    COARSE_TRACES,
    MAX_REFINE_TRACES,
    CostEstimator,
    SetupCosts,
)
from asrfit.plan.data_checks import data_warnings
from asrfit.plan.data_side import data_decisions, offload_warnings
from asrfit.plan.effective_batch import CHARS_PER_SUBWORD, accumulation, chars_per_second
from asrfit.plan.fingerprint import fingerprints
from asrfit.plan.label_buckets import LABEL_PROBE_LOW, LABEL_TRACES, SHORTLIST, choose_across
from asrfit.plan.long_audio import chunked_sample, long_audio_cap_from_profile
from asrfit.plan.margin import applied_margin
from asrfit.plan.plan import Bucket, DataDecisions, Plan
from asrfit.plan.precision import check_precision, fit_words
from asrfit.plan.progress import TraceProgress
from asrfit.plan.proposals import Shape, nothing_fits_proposals
from asrfit.plan.screen import refined
from asrfit.plan.speed import loader_workers, speed_line
from asrfit.profiles.calibration import calibration_for, rests_on_line
from asrfit.profiles.host import device_rates

logger = logging.getLogger(__name__)

# Bytes of optimizer-state traffic per trainable parameter and step (read + write).
OPTIMIZER_TRAFFIC_BYTES = {
    OptimizerKind.ADAMW: 32,
    OptimizerKind.ADAMW_8BIT: 14,
    OptimizerKind.ADAFACTOR: 16,
    OptimizerKind.SGD: 16,
}


class PlanError(AsrfitError, ValueError):
    """No setup fits, or the request cannot be planned."""


@dataclass
class _Candidate:
    costs: SetupCosts
    buckets: list[Bucket]
    throughput: float
    epoch_seconds: float


def candidate_setups(
    hardware: Any,
    precision: str | None,
    world_size: int,
    freeze_feature_encoder: bool,
    offload: bool,
) -> list[Setup]:
    """The setups searched, cheapest in memory last."""
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
    optimizers = [OptimizerKind.ADAMW, OptimizerKind.ADAMW_8BIT, OptimizerKind.ADAFACTOR]
    # bitsandbytes' 8-bit AdamW keeps its quantised state with CUDA kernels: not a CPU plan's
    # choice, nor one for this machine's GPUs when bitsandbytes is not installed here.
    no_bnb = importlib.util.find_spec("bitsandbytes") is None
    if hardware.num_gpus == 0 or (hardware.source == "detected" and no_bnb):
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
                            world_size=world_size,
                        )
                    )
    return setups


def _apply_loader(
    best: _Candidate, data: DataDecisions, world: int, rate: float, warnings: list[str]
) -> _Candidate:
    """Set the loader workers from the measured worker rate; slow the plan if loading bounds it."""
    per_process = best.throughput / world
    workers, bound = loader_workers(per_process, rate, data.num_workers)
    if data.num_workers > 0:  # with none allowed, the decision's own reason stands
        data.reasons.append(
            f"{workers} loader workers: one decodes + featurises {rate:,.0f} audio s/s here "
            f"(measured), training takes {per_process:,.0f} per process"
        )
    data.num_workers = workers
    if not bound:
        return best
    capacity = max(workers, 1) * rate * world
    warnings.append(
        f"data loading bounds the step: {max(workers, 1)} worker(s) per process supply "
        f"{capacity / world:,.0f} audio s/s, the device could train {per_process:,.0f}; "
        "cache decoded features or add CPUs"
    )
    return _Candidate(
        best.costs, best.buckets, capacity, best.epoch_seconds * best.throughput / capacity
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
    if long_utterances not in ("chunk", "filter"):
        raise ConfigError(f"long_utterances={long_utterances!r}: use 'chunk' or 'filter'.")
    if target_hours is not None and target_hours <= 0:
        raise ConfigError(f"target_hours={target_hours}: must be positive.")
    if target_effective_batch is not None and target_effective_batch < 1:
        raise ConfigError(f"target_effective_batch={target_effective_batch}: must be at least 1.")
    if bucketing not in ("auto", "1d", "2d"):
        raise ConfigError(f"bucketing={bucketing!r}: use 'auto', '1d' or '2d'.")
    check_precision(precision, hardware)
    world = world_size or max(1, hardware.num_gpus)
    adapter, profile = resolve_adapter(model, freeze_feature_encoder=freeze_feature_encoder)
    if profile is None:
        raise ConfigError(
            f"plan needs a model name or config, not {type(model).__name__}; families: {SUPPORTED_FAMILIES}."
        )
    rate = float(profile.input_frames_per_second or 16000)
    durations = np.asarray(
        dataset.duration_sample_seconds or [dataset.duration_max_seconds], dtype=float
    )
    longest = float(max(dataset.duration_max_seconds, durations.max()))
    edge_max = float(max_seconds) if max_seconds is not None else longest
    if max_seconds is None:  # the long-audio rule (asrfit.plan.long_audio)
        cap, reason = long_audio_cap_from_profile(dataset.duration_p90_seconds, longest)
        if cap is not None:
            edge_max = cap
            logger.warning("long audio: %s", reason)
    if profile.max_input_seconds:
        edge_max = min(edge_max, float(profile.max_input_seconds))
    chars = np.asarray(dataset.text_chars_sample or [dataset.text_chars_mean], dtype=float)
    subword = (profile.vocab_size or 0) > 64
    cps = chars_per_second(chars, durations, profile.encoder_frames_per_second, subword)
    labels_per_second = cps / CHARS_PER_SUBWORD if subword else cps
    paired = None  # label lengths paired with the sampled durations, for 2-D buckets
    if dataset.text_chars_sample and len(dataset.text_chars_sample) == durations.size:
        paired = np.ceil(chars / CHARS_PER_SUBWORD) if subword else chars
    if long_utterances == "chunk" and durations.max() > edge_max:
        # training cuts them into pieces, which the buckets must hold (else the sampler drops them)
        durations, paired = chunked_sample(durations, paired, edge_max)
    usable, margin_reason = applied_margin(int(hardware.usable_bytes), hardware.safety_margin)
    calibration = calibration_for(hardware)
    if calibration is not None:  # what real steps here held beyond the trace, kept free
        usable -= calibration[0].unmodelled_bytes(usable)
    if hardware.num_gpus == 0:
        usable = max(
            0, usable - CUDA_CONTEXT_BYTES
        )  # planning for CPU RAM: no context, keep it simple
    arch = hardware.spec.architecture if hardware.spec is not None else None
    estimator = CostEstimator(
        adapter,
        model_key(adapter.name + repr(profile.config)),
        profile.trainable_params,
        max(1, round(rate)),
    )
    batch_cap = None
    if target_hours is None and target_effective_batch is not None:
        batch_cap = max(1, math.ceil(target_effective_batch / world))

    max_input = max(1, round(edge_max * rate))

    def evaluate(setup: Setup | SetupCosts, refined: bool = True) -> tuple[SetupCosts, Any]:
        """Costs (traced for a Setup; given costs are bucketed as they are) and buckets."""
        cap = None if exhaustive else batch_cap  # the exhaustive search refines every length
        costs = (
            setup
            if isinstance(setup, SetupCosts)
            else estimator.costs(
                setup, max_input, labels_per_second / rate, arch, usable if refined else None, cap
            )
        )
        args = (durations, usable, rate, labels_per_second, edge_max, batch_cap)
        return costs, plan_buckets(costs, hardware, *args, dataset.num_utterances)

    candidates: list[_Candidate] = []
    tried: list[str] = []
    layers, ckpt_reasons, all_costs = encoder_layers_of(adapter, profile.config), {}, []
    estimator.progress = progress
    estimator.expandable_segments = expandable_segments
    if progress is not None:
        progress.frames_per_second = rate
        progress.expect(0 if bucketing == "1d" else LABEL_TRACES * SHORTLIST)
    skip = (lambda: progress.skip(MAX_REFINE_TRACES)) if progress is not None else None
    for offload in (False, True):
        setups = candidate_setups(hardware, precision, world, freeze_feature_encoder, offload)
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
        estimator.prefetch_screening(setups, max_input, labels_per_second / rate)
        for setup, costs, result in refined(setups, evaluate, exhaustive, skip):
            all_costs.append(costs)
            if not setup.gradient_checkpointing:
                without.append((setup, costs, result))
            if result is None:
                need = costs.reserved_bytes(1, max_input, math.ceil(edge_max * labels_per_second))
                tried.append(
                    f"{setup.describe()}: needs {need / 2**30:.2f} GiB for one {edge_max:g} s utterance"
                )
                continue
            buckets, throughput, epoch = result
            candidates.append(_Candidate(costs, buckets, throughput * world, epoch / world))
        # checkpointing k of L layers, for one base: the fastest setup without checkpointing
        # (the first in search order when none fits); other optimizers change the model states,
        # not which layers are worth recomputing, and one choice keeps the traces few
        if without:
            fitting = [w for w in without if w[2] is not None]
            base = max(fitting, key=lambda w: w[2][1]) if fitting else without[0]
            before = progress.done if progress is not None else 0

            def for_layers(x: Setup | SetupCosts) -> tuple[SetupCosts, Any]:
                # the all-layers setup only anchors the predictions: its coarse traces (made by
                # the screening) are enough; every k the choice keeps is traced in full
                full = isinstance(x, Setup) and x.gradient_checkpointing and not exhaustive
                return evaluate(x, not full)

            partial = choose_layers(
                base[0], (base[1], base[2]), for_layers, layers, device_rates(hardware), batch_cap
            )
            if progress is not None:
                progress.skip(per_choice - (progress.done - before))
            if partial is not None:
                ckpt_reasons[partial.costs.setup] = partial.reason(world)
                candidates.append(
                    _Candidate(
                        partial.costs,
                        partial.result[0],
                        partial.result[1] * world,
                        partial.result[2] / world,
                    )
                )
        if candidates:
            break
    if not candidates:
        if progress is not None:
            progress.close()
        raise PlanError(
            f"{adapter.name} does not fit {usable / 2**30:.2f} GiB usable on {world} x "
            f"{hardware.spec.name if hardware.spec else hardware.source} even at batch 1 of {edge_max:g} s. Tried:\n  "
            + "\n  ".join(tried)
            + "\nWhat would fit: a shorter --max-seconds (long utterances are then chunked), the 8-bit optimizer, "
            "ZeRO-3 with CPU offload, more GPUs (--world-size), or a GPU with more memory."
            + "\nProposals (checked by the simulator):\n  "
            + "\n  ".join(
                nothing_fits_proposals(
                    adapter=adapter,
                    profile=profile,
                    costs=all_costs,
                    usable_bytes=usable,
                    shape=Shape(rate, labels_per_second),
                    longest_seconds=edge_max,
                    target_batch=batch_cap or 1,
                    architecture=arch,
                    expandable=expandable_segments,
                    gpu=hardware.spec.name if hardware.spec else hardware.source,
                )
            )
        )
    candidates.sort(key=lambda c: -c.throughput)
    at, (chosen_costs, chosen, dims, bucketing_reason) = choose_across(
        candidates,
        world,
        estimator,
        hardware,
        durations,
        paired,
        usable,
        rate,
        labels_per_second,
        edge_max,
        batch_cap,
        dataset.num_utterances,
        bucketing,
    )
    candidates.insert(0, candidates.pop(at))  # the chosen first, the others as alternatives
    best = candidates[0]
    setup = best.costs.setup
    if progress is not None:
        progress.close()
    if dims == "2d":
        best = _Candidate(chosen_costs, chosen[0], chosen[1] * world, chosen[2] / world)
    accum, eff_utts, eff_hours, warnings = accumulation(
        best.buckets, world, target_effective_batch, target_hours
    )
    data = data_decisions(dataset, hardware, world, long_utterances, edge_max)
    warnings += data_warnings(dataset, profile)
    warnings += offload_warnings(best.costs.offloaded_bytes, world // num_nodes, hardware)
    if loader_audio_seconds_per_second is not None:
        best = _apply_loader(best, data, world, loader_audio_seconds_per_second, warnings)
    if data.long_utterance_fraction > 0 and long_utterances == "filter":
        warnings.append(
            f"{data.long_utterance_fraction:.1%} of utterances are longer than {edge_max:g} s and will be dropped"
        )
    rests_on = [
        f"memory: fake-tensor simulations of {adapter.name} (cached per setup); "
        f"{fit_words(best.costs.memory)}; reserved = allocator model (asrfit.memory.allocator)",
        speed_line(best.costs, device_rates(hardware)),
        f"labels: {labels_per_second:.1f} per second (95th percentile of the dataset's transcripts)",
        margin_reason,
        rests_on_line(calibration, hardware),
    ]
    if dims == "2d":
        rests_on.append(
            "label ranges: memory, FLOPs and step time moved off labels = "
            f"{labels_per_second:.1f}/s x duration by two traces at {LABEL_PROBE_LOW:g} of those "
            "labels (asrfit.plan.label_buckets)"
        )
    if setup.zero_stage or world > 1:
        rests_on.append("ZeRO / DDP model states by formula (asrfit.memory.zero)")
    logger.info(
        "planned in %.1f s (%d new simulations)",
        time.perf_counter() - started,
        estimator.simulations,
    )
    return Plan(
        model=adapter.name,
        gpu=hardware.spec.name if hardware.spec is not None else hardware.source,
        usable_bytes=usable,
        setup=setup,
        buckets=best.buckets,
        gradient_accumulation_steps=accum,
        target_effective_batch=f"{target_hours:g} hours"
        if target_hours is not None
        else f"{target_effective_batch} utterances",
        effective_batch_utterances=eff_utts,
        effective_batch_hours=eff_hours,
        predicted_throughput_seconds_per_second=best.throughput,
        predicted_epoch_seconds=best.epoch_seconds,
        cost_model=best.costs.memory,
        data=data,
        expandable_segments=expandable_segments,
        input_frames_per_second=rate,
        labels_per_second=labels_per_second,
        model_state_offset_bytes=best.costs.sharded_state_bytes - best.costs.model_state_bytes,
        optimizer_peak_bytes=best.costs.optimizer_peak_bytes,
        architecture=arch,
        alternatives=[
            f"{c.costs.setup.describe()}: {c.throughput:,.1f} audio s/s" for c in candidates[1:6]
        ],
        warnings=warnings,
        rests_on=rests_on,
        rejected=tried,
        checkpointing_reason=ckpt_reasons.get(setup, ""),
        bucketing=dims,
        bucketing_reason=bucketing_reason,
        num_nodes=num_nodes,
        fingerprints=fingerprints(hardware, dataset, profile),
    )
