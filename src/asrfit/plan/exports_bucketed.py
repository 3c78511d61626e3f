"""Exports that keep per-bucket batch sizes (NeMo, lhotse) and the Lightning ``Trainer``.

Called through :func:`asrfit.plan.exports.export_plan`; see that module for what carries
over. NeMo and lhotse batch each duration bucket at its planned size with the plan's own
accumulation; Lightning gets the fixed-batch accumulation.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from asrfit.memory.setup import Precision, Setup
from asrfit.plan.plan import Plan

GRADIENT_CLIP_NORM = 1.0
"""Global gradient-norm clip used by every export (the Hugging Face and DeepSpeed default)."""

LHOTSE_DEFAULT_BUCKET_BUFFER = 10_000
"""lhotse's default ``bucket_buffer_size`` (cuts held across all buckets)."""

_LIGHTNING_PRECISION = {
    Precision.FP32: "32-true",
    Precision.BF16: "bf16-mixed",
    Precision.FP16: "16-mixed",
    Precision.PURE_BF16: "bf16-true",
}
_NEMO_PRECISION = {**_LIGHTNING_PRECISION, Precision.FP32: "32"}


def _lightning_strategy(setup: Setup) -> str:
    """Lightning's registered strategy name for the setup (also NeMo's ``trainer.strategy``).

    Lightning registers ``deepspeed_stage_{1,2,3}``, ``deepspeed_stage_2_offload`` (optimizer)
    and ``deepspeed_stage_3_offload`` (optimizer and parameters). A setup between those gets
    the next one that offloads or shards *more* (less GPU memory, slower), with a warning.
    """
    stage = setup.zero_stage
    if stage == 0:
        return "ddp" if setup.world_size > 1 else "auto"
    offload = setup.offload_optimizer or setup.offload_params
    if not offload:
        return f"deepspeed_stage_{stage}"
    if stage == 2 or (stage == 3 and setup.offload_optimizer and setup.offload_params):
        return f"deepspeed_stage_{stage}_offload"
    name = "deepspeed_stage_2_offload" if stage == 1 else "deepspeed_stage_3_offload"
    warnings.warn(
        f"Lightning has no registered strategy for {setup.describe()!r}; using {name!r}, which "
        "offloads or shards more (fits, runs slower). For the exact setup pass "
        "DeepSpeedStrategy(config=export_plan(plan, 'deepspeed')).",
        stacklevel=4,
    )
    return name


def export_lightning(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer``.

    The batch size lives in the data loader, not the ``Trainer``: with a fixed batch of
    :attr:`Plan.min_batch_size` the accumulation here (recomputed for it, see
    :meth:`Plan.fixed_batch_accumulation_steps`) keeps the target effective batch; with
    asrfit's per-bucket sampler use the plan's ``gradient_accumulation_steps`` instead.
    ``devices`` counts the GPUs on one node and ``num_nodes`` the nodes.
    Registered DeepSpeed strategies use Lightning's own bucket sizes; for the planned ones pass
    ``DeepSpeedStrategy(config=export_plan(plan, "deepspeed"))`` instead of the name.
    """
    setup = plan.setup
    return {
        "accelerator": "cpu" if plan.on_cpu else "gpu",
        "devices": plan.gpus_per_node,
        "num_nodes": plan.num_nodes,
        "strategy": _lightning_strategy(setup),
        "precision": _LIGHTNING_PRECISION[setup.precision],
        "accumulate_grad_batches": plan.fixed_batch_accumulation_steps(),
        "gradient_clip_val": GRADIENT_CLIP_NORM,
    }


def _bucket_buffer_size(plan: Plan) -> int:
    """Cuts lhotse must hold so each bucket fills two batches at its share of the data.

    A bucket with a share ``f`` of the utterances gets about ``f`` of the buffer, so a full
    batch of ``B`` needs ``B / f`` buffered cuts; twice that, never below lhotse's default,
    and at most ten times the default (buffered cuts cost host memory).
    """
    need = 0.0
    for b in plan.buckets:
        if b.utterance_fraction > 0:
            need = max(need, 2 * b.batch_size / b.utterance_fraction)
    return int(
        min(10 * LHOTSE_DEFAULT_BUCKET_BUFFER, max(LHOTSE_DEFAULT_BUCKET_BUFFER, math.ceil(need)))
    )


def export_nemo(plan: Plan) -> dict[str, Any]:
    """A NeMo ``model.train_ds`` (lhotse, fixed batch per bucket) and ``trainer`` snippet.

    With ``bucket_batch_size`` lhotse batches each bucket at exactly its planned size
    (``batch_duration`` is unused, so null). Utterances above the largest bucket edge are
    dropped by NeMo (``max_duration`` and its bucketing filter). Merge the snippet into a
    model config (``OmegaConf.merge``); lhotse shards the data itself, hence
    ``use_distributed_sampler: false``, and since its stream is unbounded set
    ``trainer.max_steps`` yourself. The fields are NeMo 2.x's ``LhotseDataLoadingConfig``
    ones, and ``shard_seed: "randomized"`` gives each rank its own order (lhotse's advice for
    DDP with an infinite stream).

    A two-dimensional plan (``plan.bucketing == "2d"``) exports ``bucket_duration_bins`` as
    ``[seconds, tokens]`` pairs, NeMo's 2-D bucketing, with ``bucketing_2d_strict_mode``
    off: a cut with more tokens than its duration range's last edge is moved to a later
    range that holds it (NeMo drops it when none does). The token edges are the plan's label
    lengths: characters for character vocabularies, characters / 4 for subword ones, so for
    a subword model check them against your tokenizer.
    """
    setup = plan.setup
    if plan.data.long_utterances == "chunk" and plan.data.long_utterance_fraction > 0:
        warnings.warn(
            f"the plan chunks the {plan.data.long_utterance_fraction:.1%} of utterances above "
            f"{plan.data.max_seconds:g} s; NeMo's lhotse loader drops them instead (max_duration). "
            "Chunk them in the manifest to keep them.",
            stacklevel=3,
        )
    train_ds = {
        "use_lhotse": True,
        "use_bucketing": True,
        "num_buckets": len(plan.buckets),
        "bucket_duration_bins": plan.bucket_duration_bins,
        "bucket_batch_size": plan.bucket_batch_sizes,
        "batch_duration": None,
        "min_duration": plan.buckets[0].min_seconds,
        "max_duration": plan.buckets[-1].max_seconds,
        "shuffle": True,
        "num_workers": plan.data.num_workers,
        "pin_memory": True,
        "bucket_buffer_size": _bucket_buffer_size(plan),
        "concurrent_bucketing": True,
        "bucketing_2d_strict_mode": False,
        "shuffle_buffer_size": LHOTSE_DEFAULT_BUCKET_BUFFER,
        "drop_last": False,
        "seed": 0,
        "shard_seed": "randomized",
        "cuda_expandable_segments": plan.expandable_segments,
    }
    trainer = {
        "accelerator": "cpu" if plan.on_cpu else "gpu",
        "devices": plan.gpus_per_node,
        "num_nodes": plan.num_nodes,
        "strategy": _lightning_strategy(setup),
        "precision": _NEMO_PRECISION[setup.precision],
        "accumulate_grad_batches": plan.gradient_accumulation_steps,
        "gradient_clip_val": GRADIENT_CLIP_NORM,
        "use_distributed_sampler": False,
    }
    return {"model": {"train_ds": train_ds}, "trainer": trainer}


def export_lhotse(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for lhotse's ``DynamicBucketingSampler`` with the plan's buckets.

    ``constraint`` holds the arguments of lhotse's ``FixedBucketBatchSizeConstraint``
    (bucket upper edges and their batch sizes); ``duration_bins`` are the same upper edges,
    so a cut of ``d`` seconds lands in the first bucket whose edge is at least ``d``. Build
    it as::

        kwargs = export_plan(plan, "lhotse")
        constraint = FixedBucketBatchSizeConstraint(**kwargs.pop("constraint"))
        sampler = DynamicBucketingSampler(cuts, constraint=constraint, **kwargs)

    Filter out cuts above the largest edge first (lhotse's constraint rejects them). For the
    byte budget instead of fixed sizes use :class:`asrfit.data.lhotse.LhotseBytesConstraint`.
    Accumulate the plan's ``gradient_accumulation_steps`` micro-batches per step.

    A two-dimensional plan's bins are ``[seconds, labels]`` pairs, which lhotse's own
    ``FixedBucketBatchSizeConstraint`` cannot select by; ``constraint`` then holds the
    arguments of NeMo's ``FixedBucketBatchSizeConstraint2D`` (``strict_2d`` off), or use
    ``LhotseBytesConstraint(plan)`` with these ``duration_bins``, which picks each cut's
    bucket by its duration and transcript.
    """
    constraint: dict[str, Any] = {
        "max_seq_len_buckets": list(plan.bucket_duration_bins),
        "batch_sizes": list(plan.bucket_batch_sizes),
    }
    if plan.is_two_dimensional:
        constraint["strict_2d"] = False
    return {
        "constraint": constraint,
        "duration_bins": list(plan.bucket_duration_bins),
        "num_buckets": len(plan.buckets),
        "buffer_size": _bucket_buffer_size(plan),
        "shuffle": True,
        "drop_last": False,
        "seed": 0,
    }


__all__ = [
    "GRADIENT_CLIP_NORM",
    "LHOTSE_DEFAULT_BUCKET_BUFFER",
    "export_lhotse",
    "export_lightning",
    "export_nemo",
]
