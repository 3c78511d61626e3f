"""The planner's last phase: the chosen setup and buckets become a :class:`Plan`.

Accumulation to the target effective batch, the data-side decisions (streaming, caching,
loader workers), the warnings, and the ``rests_on`` lines that say what each figure of the
plan rests on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asrfit.plan.data_checks import data_warnings
from asrfit.plan.data_side import data_decisions, offload_warnings
from asrfit.plan.effective_batch import accumulation
from asrfit.plan.fingerprint import fingerprints
from asrfit.plan.inputs import PlanInputs
from asrfit.plan.label_buckets import LABEL_PROBE_LOW
from asrfit.plan.plan import Bucket, DataDecisions, Plan
from asrfit.plan.precision import fit_words
from asrfit.plan.speed import loader_workers, speed_line
from asrfit.profiles.calibration import rests_on_line
from asrfit.profiles.host import device_rates


@dataclass
class Candidate:
    """A setup that fits, with its buckets and predicted speed over all processes.

    Attributes:
        costs: The setup's costs (:class:`asrfit.plan.costs.SetupCosts`).
        buckets: Its buckets and their batch limits.
        throughput: Audio seconds trained per second, all processes.
        epoch_seconds: Predicted seconds of one epoch.
    """

    costs: Any
    buckets: list[Bucket]
    throughput: float
    epoch_seconds: float


@dataclass
class Choice:
    """The search's answer: the chosen candidate and the others, fastest first.

    Attributes:
        setup: The chosen setup.
        best: Its candidate with the final buckets (duration x label when ``dims`` is 2d).
        alternatives: The other setups that fit, fastest first.
        dims: ``"1d"`` or ``"2d"`` buckets.
        bucketing_reason: Why those buckets.
        checkpointing_reason: Why the chosen number of checkpointed layers ("" if none).
        rejected: One line per setup that did not fit.
    """

    setup: Any
    best: Candidate
    alternatives: list[Candidate]
    dims: str
    bucketing_reason: str
    checkpointing_reason: str
    rejected: list[str]


def apply_loader(
    best: Candidate, data: DataDecisions, world: int, rate: float, warnings: list[str]
) -> Candidate:
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
    return Candidate(
        best.costs, best.buckets, capacity, best.epoch_seconds * best.throughput / capacity
    )


def assemble_plan(
    inputs: PlanInputs,
    choice: Choice,
    hardware: Any,
    dataset: Any,
    *,
    target_effective_batch: int | None,
    target_hours: float | None,
    num_nodes: int,
    long_utterances: str,
    expandable_segments: bool,
    loader_audio_seconds_per_second: float | None,
) -> Plan:
    """The plan of ``choice`` (the keyword arguments are :func:`asrfit.plan.search.plan`'s)."""
    world, edge_max = inputs.world, inputs.edge_max_seconds
    best, setup = choice.best, choice.setup
    accum, eff_utts, eff_hours, warnings = accumulation(
        best.buckets, world, target_effective_batch, target_hours
    )
    data = data_decisions(dataset, hardware, world, long_utterances, edge_max)
    warnings += data_warnings(dataset, inputs.profile)
    warnings += offload_warnings(best.costs.offloaded_bytes, world // num_nodes, hardware)
    if loader_audio_seconds_per_second is not None:
        best = apply_loader(best, data, world, loader_audio_seconds_per_second, warnings)
    if data.long_utterance_fraction > 0 and long_utterances == "filter":
        warnings.append(
            f"{data.long_utterance_fraction:.1%} of utterances are longer than {edge_max:g} s "
            "and will be dropped"
        )
    lps = inputs.labels_per_second
    rests_on = [
        f"memory: fake-tensor simulations of {inputs.adapter.name} (cached per setup); "
        f"{fit_words(best.costs.memory)}; reserved = allocator model (asrfit.memory.cuda.allocator)",
        speed_line(best.costs, device_rates(hardware)),
        f"labels: {lps:.1f} per second (95th percentile of the dataset's transcripts)",
        inputs.margin_reason,
        rests_on_line(inputs.calibration, hardware),
    ]
    if choice.dims == "2d":
        rests_on.append(
            "label ranges: memory, FLOPs and step time moved off labels = "
            f"{lps:.1f}/s x duration by two traces at {LABEL_PROBE_LOW:g} of those "
            "labels (asrfit.plan.label_buckets)"
        )
    if setup.zero_stage or world > 1:
        rests_on.append("ZeRO / DDP model states by formula (asrfit.memory.cuda.zero)")
    target = (
        f"{target_hours:g} hours"
        if target_hours is not None
        else f"{target_effective_batch} utterances"
    )
    return Plan(
        model=inputs.adapter.name,
        gpu=hardware.spec.name if hardware.spec is not None else hardware.source,
        usable_bytes=inputs.usable_bytes,
        setup=setup,
        buckets=best.buckets,
        gradient_accumulation_steps=accum,
        target_effective_batch=target,
        effective_batch_utterances=eff_utts,
        effective_batch_hours=eff_hours,
        predicted_throughput_seconds_per_second=best.throughput,
        predicted_epoch_seconds=best.epoch_seconds,
        cost_model=best.costs.memory,
        data=data,
        expandable_segments=expandable_segments,
        input_frames_per_second=inputs.frames_per_second,
        labels_per_second=lps,
        model_state_offset_bytes=best.costs.sharded_state_bytes - best.costs.model_state_bytes,
        optimizer_peak_bytes=best.costs.optimizer_peak_bytes,
        architecture=inputs.architecture,
        alternatives=[
            f"{c.costs.setup.describe()}: {c.throughput:,.1f} audio s/s"
            for c in choice.alternatives[:5]
        ],
        warnings=warnings,
        rests_on=rests_on,
        rejected=choice.rejected,
        checkpointing_reason=choice.checkpointing_reason,
        bucketing=choice.dims,
        bucketing_reason=choice.bucketing_reason,
        num_nodes=num_nodes,
        fingerprints=fingerprints(hardware, dataset, inputs.profile),
    )
