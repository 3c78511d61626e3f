"""A plan in the words of the person who asked for it: what fits, what was chosen and why,
what was rejected and why, and how long an epoch should take.
"""

from __future__ import annotations

from asrfit.plan.plan import Bucket, Plan, duration_words
from asrfit.plan.precision import choose_precision

GIB = 2**30


def _precision_reason(plan: Plan) -> str:
    """Why the plan's precision, from the GPU catalog when the GPU is in it."""
    precision = plan.setup.precision.value
    try:
        from asrfit.profiles.gpus.catalog import resolve_gpu_name

        spec = resolve_gpu_name(plan.gpu)[0]
    except Exception:  # a CPU plan, or a GPU the catalog does not know
        return f"{precision}"
    chosen, reason = choose_precision(None, spec)
    if chosen == precision:
        return f"{precision}, because {reason}"
    return f"{precision}, as asked (by GPU it would be {chosen}: {reason})"


def _batches(plan: Plan) -> str:
    """The batch limits in a phrase."""
    first, last, count = plan.buckets[0], plan.buckets[-1], len(plan.buckets)
    if plan.is_two_dimensional and plan.max_batch_size != plan.min_batch_size:
        ranges = len({b.max_seconds for b in plan.buckets})
        return (
            f"up to {plan.max_batch_size} utterances per micro-batch, down to "
            f"{plan.min_batch_size}, in {count} buckets: {ranges} duration ranges up to "
            f"{last.max_seconds:.1f} s, each split by transcript length ({plan.bucketing_reason})"
        )
    if first.batch_size == last.batch_size:
        where = "its one duration bucket" if count == 1 else f"all {count} duration buckets"
        return (
            f"{last.batch_size} utterances per micro-batch in {where}, up to "
            f"{last.max_seconds:.1f} s ({_limit(plan, last.batch_size)})"
        )
    return (
        f"up to {first.batch_size} utterances of {first.max_seconds:.1f} s or less per "
        f"micro-batch, down to {last.batch_size} of up to {last.max_seconds:.1f} s, in "
        f"{count} duration buckets"
    )


def _limit(plan: Plan, batch_size: int) -> str:
    """What sets a batch limit every bucket shares: the target batch where the limit is the
    target's share per process (:attr:`Plan.batch_cap`), else memory (a model that pads every
    utterance to one length, as Whisper pads to 30 s, costs the same in every bucket)."""
    cap = plan.batch_cap
    if cap is not None and batch_size >= cap:
        return "the target batch, not memory, is the limit"
    return "memory is the limit in every bucket alike"


def _about(seconds: float) -> str:
    words = duration_words(seconds)
    return words if words.startswith("under") else f"about {words}"


def explain_plan(plan: Plan) -> list[tuple[str, str]]:
    """``(heading, sentence)`` rows that say what the plan means.

    Args:
        plan: The plan.

    Returns:
        Rows headed "Fits", "Chosen", "Batches", "Rejected" (one per rejected or slower
        setup), "Epoch" and "Data", then any "Warning".
    """
    last = plan.buckets[-1]
    setup = plan.setup
    headroom = (plan.usable_bytes - last.predicted_peak_bytes) / GIB
    rows = [
        (
            "Fits",
            f"{plan.model} trains on {setup.world_size} x {plan.gpu} within "
            f"{plan.usable_bytes / GIB:.2f} GiB per GPU: {_batches(plan)}; the longest "
            f"bucket is predicted to reserve {last.predicted_peak_bytes / GIB:.2f} GiB "
            f"({headroom:.2f} GiB to spare).",
        ),
        (
            "Chosen",
            f"{setup.describe()}: the fastest setup that fits, predicted at "
            f"{plan.predicted_throughput_seconds_per_second:,.1f} audio seconds per second. "
            f"Precision {_precision_reason(plan)}; {_checkpointing_reason(plan)}; "
            f"optimizer {setup.optimizer.value}.",
        ),
        (
            "Batches",
            f"{plan.gradient_accumulation_steps} micro-batch(es) per optimizer step: on average "
            f"{plan.effective_batch_utterances:.1f} utterances, "
            f"{plan.effective_batch_hours * 60:.2f} min of audio per step (asked: "
            f"{plan.target_effective_batch}).",
        ),
    ]
    rows += [
        ("Rejected", f"{line} (more than the {plan.usable_bytes / GIB:.2f} GiB usable)")
        for line in plan.rejected[:4]
    ]
    if len(plan.rejected) > 4:
        rows.append(("Rejected", f"... and {len(plan.rejected) - 4} more setups that do not fit"))
    rows += [
        ("Rejected", f"{line}: fits, but slower or no faster") for line in plan.alternatives[:3]
    ]
    rows.append(
        (
            "Epoch",
            f"{_about(plan.predicted_epoch_seconds)} per epoch (the traced kernels' step "
            "time, see rests_on; the first epoch also decodes the audio).",
        )
    )
    if plan.data.reasons:
        rows.append(("Data", "; ".join(plan.data.reasons) + "."))
    rows += [("Warning", w) for w in plan.warnings]
    return rows


def _checkpointing_reason(plan: Plan) -> str:
    setup = plan.setup
    if setup.checkpoint_layers:
        return plan.checkpointing_reason or (
            f"gradient checkpointing on the first {setup.checkpoint_layers} encoder layers"
        )
    if setup.gradient_checkpointing:
        return "gradient checkpointing on: recomputing activations let larger batches fit"
    return "gradient checkpointing off: activations fit without recomputing them"


def shortfall_warning(
    target: int, accumulation: int, per_batch: float, world: int, buckets: list[Bucket]
) -> str:
    """Why an optimizer step averages other than the utterances asked for, and what is reachable.

    Args:
        target: Utterances per optimizer step asked for.
        accumulation: Micro-batches per step chosen (the closest whole number).
        per_batch: Mean utterances per micro-batch on one GPU.
        world: GPUs.
        buckets: The plan's buckets (the last one limits the batch most).

    Returns:
        The warning.
    """
    reach = ", ".join(
        f"{per_batch * world * k:.1f} with {k}"
        for k in sorted({max(1, accumulation - 1), accumulation, accumulation + 1})
    )
    return (
        f"an optimizer step averages {per_batch * world * accumulation:.1f} utterances, not the "
        f"{target} asked for: the longest bucket fits only {buckets[-1].batch_size} per "
        f"micro-batch, so micro-batches average {per_batch:.1f} utterances (all GPUs: "
        f"{per_batch * world:.1f}); reachable per step: {reach} micro-batches"
    )
