"""Export a :class:`~asrfit.plan.plan.Plan` to the trainers people already use.

``export_plan(plan, fmt)`` returns plain data for one of :data:`EXPORT_FORMATS`;
``export_text(plan, fmt)`` renders it (JSON for ``hf``, ``deepspeed``, ``lhotse`` and
``lightning``, YAML for ``accelerate`` and ``nemo``); :func:`export_note` says in one line
how the export keeps the target effective batch. Nothing here touches the plan, the network
or a GPU. The bucketed exports (NeMo, lhotse, Lightning) live in
:mod:`asrfit.plan.exports_bucketed`.

Two things do not carry over exactly, and the exports say so where they apply:

- Fixed-batch trainers (Hugging Face ``Trainer``, Lightning, DeepSpeed's
  ``train_micro_batch_size_per_gpu``) get the plan's *smallest* bucket batch
  (:attr:`Plan.min_batch_size`), the one that fits the longest utterances, and an
  accumulation recomputed for it (:meth:`Plan.fixed_batch_accumulation_steps`), so that
  micro-batch x accumulation x world size stays within half a micro-batch per process of the
  target. Only the NeMo/lhotse exports keep the per-bucket batch sizes, with the plan's own
  accumulation.
- Gradient clipping is not part of a plan; every export clips at :data:`GRADIENT_CLIP_NORM`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from typing import Any

import yaml

from asrfit.errors import ConfigError
from asrfit.memory.cuda.zero import PREFETCH_BUCKET_ELEMENTS, REDUCE_BUCKET_ELEMENTS
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.plan.exports_bucketed import (
    GRADIENT_CLIP_NORM,
    LHOTSE_DEFAULT_BUCKET_BUFFER,
    export_lhotse,
    export_lightning,
    export_nemo,
)
from asrfit.plan.plan import Plan

EXPORT_FORMATS = ("hf", "deepspeed", "accelerate", "lhotse", "nemo", "lightning")
"""Formats :func:`export_plan` knows, in the order the CLI lists them."""

EXPORT_FILENAMES = {
    "hf": "training_args.json",
    "deepspeed": "ds_config.json",
    "accelerate": "accelerate_config.yaml",
    "lhotse": "lhotse_sampler.json",
    "nemo": "nemo_lhotse.yaml",
    "lightning": "lightning_trainer.json",
}
"""A default file name per format, for commands that write every export at once."""

HF_AUTO = "auto"
"""The value transformers' DeepSpeed integration replaces from ``TrainingArguments``."""

_YAML_FORMATS = ("accelerate", "nemo")
_BUCKETED_FORMATS = ("lhotse", "nemo")

_HF_OPTIM = {
    OptimizerKind.ADAMW: "adamw_torch_fused",
    OptimizerKind.ADAMW_8BIT: "adamw_bnb_8bit",
    OptimizerKind.ADAFACTOR: "adafactor",
    OptimizerKind.SGD: "sgd",
}

_OFFLOAD = {"device": "cpu", "pin_memory": True}


def export_plan(plan: Plan, fmt: str) -> dict[str, Any]:
    """Translate ``plan`` into the configuration ``fmt`` expects, as plain JSON-able data.

    Args:
        plan: The plan to export. It is read, never changed.
        fmt: One of :data:`EXPORT_FORMATS` (case-insensitive): ``hf`` (keyword arguments of
            ``transformers.TrainingArguments``), ``deepspeed`` (a DeepSpeed config),
            ``accelerate`` (an ``accelerate launch --config_file`` YAML), ``lhotse``
            (``DynamicBucketingSampler`` keyword arguments and a
            ``FixedBucketBatchSizeConstraint``), ``nemo`` (a NeMo ``model.train_ds`` lhotse
            snippet plus ``trainer``) or ``lightning`` (``lightning.Trainer`` keyword arguments).

    Returns:
        A new dict; changing it does not change the plan or a later export.

    Raises:
        ConfigError: ``fmt`` is not a known format.
    """
    key = _check_format(fmt)
    return _EXPORTERS[key](plan)


def export_text(plan: Plan, fmt: str) -> str:
    """Render :func:`export_plan` as file text: JSON, or YAML for ``accelerate`` and ``nemo``.

    Args:
        plan: The plan to export.
        fmt: One of :data:`EXPORT_FORMATS`.

    Returns:
        The text, ending in a newline. YAML starts with a comment naming the plan.

    Raises:
        ConfigError: ``fmt`` is not a known format.
    """
    key = _check_format(fmt)
    data = _EXPORTERS[key](plan)
    if key not in _YAML_FORMATS:
        return json.dumps(data, indent=2) + "\n"
    header = (
        f"# asrfit plan for {plan.model} on {plan.setup.world_size} x {plan.gpu}"
        f" ({plan.setup.describe()}), exported for {key}\n# {export_note(plan, key)}\n"
    )
    return header + yaml.dump(data, Dumper=_YamlDumper, sort_keys=False)


def export_note(plan: Plan, fmt: str) -> str:
    """One line on how the ``fmt`` export keeps the plan's target effective batch.

    Args:
        plan: The plan.
        fmt: One of :data:`EXPORT_FORMATS`.

    Returns:
        E.g. "effective batch 5 x 7 accumulation x 1 process = 35 utterances per step
        (target 32 utterances; ...)".

    Raises:
        ConfigError: ``fmt`` is not a known format.
    """
    key = _check_format(fmt)
    world = plan.setup.world_size
    if key in _BUCKETED_FORMATS:
        return (
            f"per-bucket batches {plan.bucket_batch_sizes} x {plan.gradient_accumulation_steps} "
            f"accumulation x {world} process(es) = {plan.effective_batch_utterances:.1f} "
            f"utterances per step on average (target {plan.target_effective_batch})"
        )
    batch = plan.min_batch_size
    accum = plan.fixed_batch_accumulation_steps()
    return (
        f"fixed batch {batch} (the longest bucket's) x {accum} accumulation x {world} "
        f"process(es) = {batch * accum * world} utterances per step (target "
        f"{plan.target_effective_batch}; accumulation recomputed from the plan's "
        f"{plan.gradient_accumulation_steps}, which is for its larger bucketed batches)"
    )


class _YamlDumper(yaml.SafeDumper):
    """Block-style YAML with lists of scalars on one line (``bucket_batch_size: [32, 12, 5]``)."""


def _represent_list(dumper: yaml.SafeDumper, items: list) -> yaml.Node:
    flat = all(not isinstance(v, (dict, list)) for v in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


_YamlDumper.add_representer(list, _represent_list)


def _check_format(fmt: str) -> str:
    key = str(fmt).strip().lower()
    if key not in EXPORT_FORMATS:
        raise ConfigError(
            f"export format {fmt!r} is not known; use one of: {', '.join(EXPORT_FORMATS)}."
        )
    return key


def _autocast(setup: Setup) -> str:
    """The mixed-precision mode ("no", "bf16", "fp16") for trainers that autocast.

    ``pure_bf16`` holds bf16 weights without autocast ("no"), except under DeepSpeed, which
    must be told the weights are bf16 (its bf16 mode, hence "bf16").
    """
    if setup.precision == Precision.BF16:
        return "bf16"
    if setup.precision == Precision.FP16:
        return "fp16"
    if setup.precision == Precision.PURE_BF16 and setup.zero_stage > 0:
        return "bf16"
    return "no"


@functools.lru_cache(maxsize=1)
def _training_args_fields() -> frozenset[str] | None:
    try:
        from transformers import TrainingArguments
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def _export_hf(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` (add ``output_dir``).

    ``per_device_train_batch_size`` is the plan's smallest bucket batch: the Hugging Face
    ``Trainer`` uses one batch size for every step, so it must be the one that fits the
    longest bucket, and ``gradient_accumulation_steps`` is recomputed for it
    (:meth:`Plan.fixed_batch_accumulation_steps`). Length grouping keeps padding low; to get
    the larger per-bucket batches back, train with :class:`asrfit.train.hf.MemoryBudgetTrainer`
    (asrfit's memory-budget sampler) and keep everything else from here.
    ``remove_unused_columns`` is off: an audio dataset's collator needs its raw columns.

    Names follow the installed ``transformers``: ``activation_checkpointing`` and
    ``train_sampling_strategy`` where it has them, else ``gradient_checkpointing`` and
    ``group_by_length``. For ``pure_bf16`` load the model with ``dtype=torch.bfloat16``:
    ``bf16`` stays off (no autocast) unless DeepSpeed runs it. ``deepspeed`` is the
    ``deepspeed`` export inline, present only for ZeRO stages 1-3.
    """
    setup = plan.setup
    fields = _training_args_fields()
    batch = plan.min_batch_size
    mixed = _autocast(setup)
    optim = _HF_OPTIM[setup.optimizer]
    if setup.optimizer == OptimizerKind.ADAMW and setup.offload_optimizer:
        optim = "adamw_torch"  # the step runs on CPU (Accelerate swaps in DeepSpeedCPUAdam)
    kwargs: dict[str, Any] = {
        "per_device_train_batch_size": batch,
        "per_device_eval_batch_size": batch,
        "gradient_accumulation_steps": plan.fixed_batch_accumulation_steps(batch),
        "remove_unused_columns": False,
        "bf16": mixed == "bf16",
        "fp16": mixed == "fp16",
        "optim": optim,
        "max_grad_norm": GRADIENT_CLIP_NORM,
        "dataloader_num_workers": plan.data.num_workers,
        "dataloader_persistent_workers": plan.data.num_workers > 0,
        "length_column_name": "input_length",
    }
    ckpt = "activation_checkpointing"
    if fields is not None and ckpt not in fields:
        ckpt = "gradient_checkpointing"
    # TrainingArguments checkpoints every layer or none: a plan's first-k layers become every
    # layer (less memory than planned, slower), never none (more memory than planned)
    every = setup.gradient_checkpointing or setup.checkpoint_layers > 0
    kwargs[ckpt] = every
    if every:
        kwargs[f"{ckpt}_kwargs"] = {"use_reentrant": False}
    if fields is None or "train_sampling_strategy" in fields:
        kwargs["train_sampling_strategy"] = "group_by_length"
    else:
        kwargs["group_by_length"] = True
    if setup.zero_stage > 0:
        kwargs["deepspeed"] = _deepspeed_config(plan, hf_auto=True)
    return kwargs


def _export_deepspeed(plan: Plan) -> dict[str, Any]:
    return _deepspeed_config(plan, hf_auto=False)


def _deepspeed_config(plan: Plan, *, hf_auto: bool) -> dict[str, Any]:
    """A DeepSpeed config whose micro-batch, accumulation, precision and ZeRO match the plan.

    The micro-batch is the plan's smallest bucket batch with the accumulation recomputed for
    it (:meth:`Plan.fixed_batch_accumulation_steps`). With ``hf_auto`` (the config inside the
    ``hf`` export), every value transformers' DeepSpeed integration fills from
    ``TrainingArguments`` is ``"auto"``: micro-batch, accumulation, ``train_batch_size``,
    ``gradient_clipping`` and the fp16/bf16 switches, so the two can never disagree. The
    bucket sizes stay numbers: the plan's memory formula assumes them.

    Bucket sizes are the constants asrfit's ZeRO memory formula assumes
    (``REDUCE_BUCKET_ELEMENTS``, ``PREFETCH_BUCKET_ELEMENTS``); ``overlap_comm`` follows
    DeepSpeed's own default (on for stage 3 only): with it on, stages 1-2 hold several
    reduce buckets at once, which the formula does not count. With optimizer offload an
    AdamW plan lets DeepSpeed/Accelerate run ``DeepSpeedCPUAdam``; other optimizers are kept
    as given (``zero_force_ds_cpu_optimizer: false``), which is slower but the optimizer
    the plan sized.
    """
    setup = plan.setup
    batch = plan.min_batch_size
    accum = plan.fixed_batch_accumulation_steps(batch)
    if setup.zero_stage == 0:
        warnings.warn(
            f"plan for {plan.model} uses ZeRO stage 0 (plain DDP/autocast); DeepSpeed's stage 0 "
            "keeps different model states than were planned. Re-plan with zero_stage >= 1 to run "
            "under DeepSpeed.",
            stacklevel=3,
        )
    if setup.precision == Precision.PURE_BF16:
        warnings.warn(
            "pure_bf16 under DeepSpeed: its bf16 mode keeps fp32 master weights and optimizer "
            "state, which the pure_bf16 plan did not count; expect more memory than predicted.",
            stacklevel=3,
        )
    fp16: dict[str, Any] = {"enabled": setup.precision == Precision.FP16}
    if fp16["enabled"]:
        # Dynamic loss scaling from 2**16, as torch.amp.GradScaler starts.
        fp16.update(
            loss_scale=0,
            initial_scale_power=16,
            loss_scale_window=1000,
            hysteresis=2,
            min_loss_scale=1,
        )
    zero: dict[str, Any] = {
        "stage": setup.zero_stage,
        "overlap_comm": setup.zero_stage == 3,
        "contiguous_gradients": True,
    }
    if setup.zero_stage >= 1:
        zero["reduce_bucket_size"] = REDUCE_BUCKET_ELEMENTS
    if setup.offload_optimizer:
        zero["offload_optimizer"] = dict(_OFFLOAD)
    if setup.zero_stage == 3:
        zero["stage3_prefetch_bucket_size"] = PREFETCH_BUCKET_ELEMENTS
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if setup.offload_params:
            zero["offload_param"] = dict(_OFFLOAD)
    bf16 = {"enabled": setup.precision in (Precision.BF16, Precision.PURE_BF16)}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": accum,
        "train_batch_size": batch * accum * setup.world_size,
        "gradient_clipping": GRADIENT_CLIP_NORM,
        "fp16": fp16,
        "bf16": bf16,
        "zero_optimization": zero,
    }
    if hf_auto:
        for name in (
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "train_batch_size",
            "gradient_clipping",
        ):
            config[name] = HF_AUTO
        fp16["enabled"] = HF_AUTO
        bf16["enabled"] = HF_AUTO
    if setup.zero_stage >= 1:
        config["zero_allow_untested_optimizer"] = True
    if setup.offload_optimizer and setup.optimizer != OptimizerKind.ADAMW:
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _export_accelerate(plan: Plan) -> dict[str, Any]:
    """What ``accelerate config`` writes for this setup (``accelerate launch --config_file``).

    Without DeepSpeed, Accelerate's config file has no accumulation field: pass
    ``Accelerator(gradient_accumulation_steps=plan.gradient_accumulation_steps)`` with asrfit's
    bucketed sampler (asrfit's trainer does), or
    :meth:`Plan.fixed_batch_accumulation_steps` with a fixed batch. With DeepSpeed it sits in
    ``deepspeed_config`` and is the fixed-batch one (DeepSpeed runs one micro-batch size).
    ``num_machines`` is the plan's ``num_nodes`` and ``num_processes`` the processes over all
    of them, as ``accelerate launch`` counts; set ``machine_rank`` and
    ``main_process_ip``/``main_process_port`` per node.
    """
    setup = plan.setup
    if setup.zero_stage > 0:
        distributed_type = "DEEPSPEED"
    elif setup.world_size > 1:
        distributed_type = "MULTI_GPU"
    else:
        distributed_type = "NO"
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed_type,
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _autocast(setup),
        "num_machines": plan.num_nodes,
        "num_processes": setup.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": plan.on_cpu,
    }
    if plan.num_nodes > 1:
        config["main_process_ip"] = None  # the rank-0 node's address: fill in
        config["main_process_port"] = 29500
    if setup.zero_stage > 0:
        config["deepspeed_config"] = {
            "gradient_accumulation_steps": plan.fixed_batch_accumulation_steps(),
            "gradient_clipping": GRADIENT_CLIP_NORM,
            "offload_optimizer_device": "cpu" if setup.offload_optimizer else "none",
            "offload_param_device": "cpu" if setup.offload_params else "none",
            "zero3_init_flag": setup.zero_stage == 3,
            "zero3_save_16bit_model": setup.zero_stage == 3,
            "zero_stage": setup.zero_stage,
        }
        if plan.num_nodes > 1:
            config["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
    return config


_EXPORTERS = {
    "hf": _export_hf,
    "deepspeed": _export_deepspeed,
    "accelerate": _export_accelerate,
    "lhotse": export_lhotse,
    "nemo": export_nemo,
    "lightning": export_lightning,
}


__all__ = [
    "EXPORT_FILENAMES",
    "EXPORT_FORMATS",
    "GRADIENT_CLIP_NORM",
    "HF_AUTO",
    "LHOTSE_DEFAULT_BUCKET_BUFFER",
    "export_note",
    "export_plan",
    "export_text",
]
