"""Export a :class:`~asrfit.plan.plan.Plan` to the trainers people already use.

``export_plan(plan, fmt)`` returns plain data for one of :data:`EXPORT_FORMATS`;
``export_text(plan, fmt)`` renders it (JSON for ``hf``, ``deepspeed`` and ``lightning``,
YAML for ``accelerate`` and ``nemo``). Nothing here touches the plan, the network or a GPU.

Two things do not carry over exactly, and the exports say so where they apply:

- Fixed-batch trainers (Hugging Face ``Trainer``, Lightning, DeepSpeed's
  ``train_micro_batch_size_per_gpu``) get the plan's *smallest* bucket batch
  (:attr:`Plan.min_batch_size`), the one that fits the longest utterances. Only the NeMo/lhotse
  export keeps the per-bucket batch sizes.
- Gradient clipping is not part of a plan; every export clips at :data:`GRADIENT_CLIP_NORM`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from typing import Any

import yaml

from asrfit.errors import ConfigError
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.memory.zero import PREFETCH_BUCKET_ELEMENTS, REDUCE_BUCKET_ELEMENTS
from asrfit.plan.plan import Plan

EXPORT_FORMATS = ("hf", "deepspeed", "accelerate", "nemo", "lightning")
"""Formats :func:`export_plan` knows, in the order the CLI lists them."""

EXPORT_FILENAMES = {
    "hf": "training_args.json",
    "deepspeed": "ds_config.json",
    "accelerate": "accelerate_config.yaml",
    "nemo": "nemo_lhotse.yaml",
    "lightning": "lightning_trainer.json",
}
"""A default file name per format, for commands that write every export at once."""

GRADIENT_CLIP_NORM = 1.0
"""Global gradient-norm clip used by every export (the Hugging Face and DeepSpeed default)."""

LHOTSE_DEFAULT_BUCKET_BUFFER = 10_000
"""lhotse's default ``bucket_buffer_size`` (cuts held across all buckets)."""

_YAML_FORMATS = ("accelerate", "nemo")

_LIGHTNING_PRECISION = {
    Precision.FP32: "32-true",
    Precision.BF16: "bf16-mixed",
    Precision.FP16: "16-mixed",
    Precision.PURE_BF16: "bf16-true",
}
_NEMO_PRECISION = {**_LIGHTNING_PRECISION, Precision.FP32: "32"}

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
            ``accelerate`` (an ``accelerate launch --config_file`` YAML), ``nemo`` (a NeMo
            ``model.train_ds`` lhotse snippet plus ``trainer``) or ``lightning``
            (``lightning.Trainer`` keyword arguments).

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
        f" ({plan.setup.describe()}), exported for {key}\n"
    )
    return header + yaml.dump(data, Dumper=_YamlDumper, sort_keys=False)


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
    longest bucket. Length grouping keeps padding low; to get the larger per-bucket batches
    back, feed the ``Trainer`` asrfit's memory-budget sampler (override
    ``get_train_dataloader``) and keep everything else from here.

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
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
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
    kwargs[ckpt] = setup.gradient_checkpointing
    if setup.gradient_checkpointing:
        kwargs[f"{ckpt}_kwargs"] = {"use_reentrant": False}
    if fields is None or "train_sampling_strategy" in fields:
        kwargs["train_sampling_strategy"] = "group_by_length"
    else:
        kwargs["group_by_length"] = True
    if setup.zero_stage > 0:
        kwargs["deepspeed"] = _export_deepspeed(plan)
    return kwargs


def _export_deepspeed(plan: Plan) -> dict[str, Any]:
    """A DeepSpeed config whose micro-batch, accumulation, precision and ZeRO match the plan.

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
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "train_batch_size": batch * plan.gradient_accumulation_steps * setup.world_size,
        "gradient_clipping": GRADIENT_CLIP_NORM,
        "fp16": fp16,
        "bf16": {"enabled": setup.precision in (Precision.BF16, Precision.PURE_BF16)},
        "zero_optimization": zero,
    }
    if setup.zero_stage >= 1:
        config["zero_allow_untested_optimizer"] = True
    if setup.offload_optimizer and setup.optimizer != OptimizerKind.ADAMW:
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def _export_accelerate(plan: Plan) -> dict[str, Any]:
    """What ``accelerate config`` writes for this setup (``accelerate launch --config_file``).

    Without DeepSpeed, Accelerate's config file has no accumulation field: pass
    ``Accelerator(gradient_accumulation_steps=plan.gradient_accumulation_steps)`` (asrfit's
    trainer does). With DeepSpeed it sits in ``deepspeed_config``.
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
        "num_machines": 1,
        "num_processes": setup.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if setup.zero_stage > 0:
        config["deepspeed_config"] = {
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "gradient_clipping": GRADIENT_CLIP_NORM,
            "offload_optimizer_device": "cpu" if setup.offload_optimizer else "none",
            "offload_param_device": "cpu" if setup.offload_params else "none",
            "zero3_init_flag": setup.zero_stage == 3,
            "zero3_save_16bit_model": setup.zero_stage == 3,
            "zero_stage": setup.zero_stage,
        }
    return config


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


def _export_lightning(plan: Plan) -> dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer``.

    The batch size lives in the data loader, not the ``Trainer``: use
    :attr:`Plan.min_batch_size` for a fixed batch, or asrfit's sampler for per-bucket ones.
    Registered DeepSpeed strategies use Lightning's own bucket sizes; for the planned ones pass
    ``DeepSpeedStrategy(config=export_plan(plan, "deepspeed"))`` instead of the name.
    """
    setup = plan.setup
    return {
        "accelerator": "gpu",
        "devices": setup.world_size,
        "strategy": _lightning_strategy(setup),
        "precision": _LIGHTNING_PRECISION[setup.precision],
        "accumulate_grad_batches": plan.gradient_accumulation_steps,
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


def _export_nemo(plan: Plan) -> dict[str, Any]:
    """A NeMo ``model.train_ds`` (lhotse, fixed batch per bucket) and ``trainer`` snippet.

    With ``bucket_batch_size`` lhotse batches each bucket at exactly its planned size
    (``batch_duration`` is unused, so null). Utterances above the largest bucket edge are
    dropped by NeMo (``max_duration`` and its bucketing filter). Merge the snippet into a
    model config (``OmegaConf.merge``); lhotse shards the data itself, hence
    ``use_distributed_sampler: false``, and since its stream is unbounded set
    ``trainer.max_steps`` yourself.
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
        "cuda_expandable_segments": plan.expandable_segments,
    }
    trainer = {
        "accelerator": "gpu",
        "devices": setup.world_size,
        "strategy": _lightning_strategy(setup),
        "precision": _NEMO_PRECISION[setup.precision],
        "accumulate_grad_batches": plan.gradient_accumulation_steps,
        "gradient_clip_val": GRADIENT_CLIP_NORM,
        "use_distributed_sampler": False,
    }
    return {"model": {"train_ds": train_ds}, "trainer": trainer}


_EXPORTERS = {
    "hf": _export_hf,
    "deepspeed": _export_deepspeed,
    "accelerate": _export_accelerate,
    "nemo": _export_nemo,
    "lightning": _export_lightning,
}
