"""What a plan asks of the training engines: the optimizer, mixed precision, DeepSpeed,
gradient checkpointing, the CUDA allocator's mode and the memory budget.

Each is usable on its own (for example ``build_optimizer`` in a hand-written loop);
:func:`prepare_engines` puts them together for
:class:`asrfit.train.trainer.MemoryEfficientTrainer`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from asrfit.errors import ConfigError, MissingDependencyError
from asrfit.memory.setup import OptimizerKind, Precision
from asrfit.models.checkpointing import checkpoint_first_layers
from asrfit.train.host_allocator import keep_freed_host_memory
from asrfit.train.records import GIB

if TYPE_CHECKING:
    from accelerate import Accelerator

    from asrfit.plan.plan import Plan
    from asrfit.train.config import TrainingConfig

logger = logging.getLogger(__name__)


def configure_cuda_allocator(expandable_segments: bool) -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` when it can still take effect.

    Only on a machine with CUDA, only when neither ``PYTORCH_CUDA_ALLOC_CONF`` nor
    ``PYTORCH_ALLOC_CONF`` is set, and only before CUDA is initialised.

    Returns:
        True when the variable was set.
    """
    if not expandable_segments or not torch.cuda.is_available():
        return False
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        logger.info("PYTORCH_CUDA_ALLOC_CONF is set by the user; leaving it as it is.")
        return False
    if torch.cuda.is_initialized():
        logger.warning(
            "CUDA is already initialised, so expandable segments cannot be turned on; set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call to "
            "get the fragmentation the plan assumed."
        )
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    logger.info("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (as the plan assumes).")
    return True


def build_optimizer(
    model: torch.nn.Module, kind: str | OptimizerKind, learning_rate: float, *, cpu: bool = False
) -> torch.optim.Optimizer:
    """The optimizer named by a plan (``adamw``...) or a config's ``optim`` (``adamw_torch``...).

    With ``cpu`` (training on the CPU), AdamW is PyTorch's fused CPU kernel: one pass over
    each parameter where the default steps through a dozen ops per tensor (3.6 ms against
    11.3 for conformer-ctc-small's 2.5 M parameters on 2 threads, docs/benchmarks.md). The
    simulator traces the ``foreach`` step, whose temporaries make its prediction a bound.

    Raises:
        MissingDependencyError: 8-bit AdamW without ``bitsandbytes``.
        ConfigError: An unknown name.
    """
    name = kind.value if isinstance(kind, OptimizerKind) else str(kind)
    params = [p for p in model.parameters() if p.requires_grad]
    if name in ("adamw", "adamw_torch", "adamw_torch_fused", "adamw_hf"):
        fused = cpu and all(p.device.type == "cpu" and p.is_floating_point() for p in params)
        return torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0, fused=fused or None)
    if name in ("sgd",):
        return torch.optim.SGD(params, lr=learning_rate)
    if name in ("adafactor",):
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=learning_rate, scale_parameter=False, relative_step=False)
    if name in ("adamw8bit", "adamw_bnb_8bit", "adamw_8bit"):
        if importlib.util.find_spec("bitsandbytes") is None:
            raise MissingDependencyError(
                "the plan uses 8-bit AdamW, which needs bitsandbytes: install it via "
                "`pip install asrfit[bnb]`, or re-plan with optimizer adamw."
            )
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=learning_rate, weight_decay=0.0)
    raise ConfigError(
        f"optimizer {name!r} is not known to the trainer; use adamw, adamw8bit, adafactor or sgd, "
        "or pass optimizer= yourself."
    )


def resolve_mixed_precision(
    plan: Plan | None, config: TrainingConfig, *, cuda: bool
) -> tuple[str, bool]:
    """Accelerate's ``mixed_precision`` for a plan's setup (else the config's fp16/bf16 flags).

    Args:
        plan: The plan; its ``setup.precision`` wins over the config.
        config: The training config.
        cuda: Whether training runs on CUDA (fp16 autocast needs it).

    Returns:
        ``("no" | "fp16" | "bf16", pure_bf16)``; ``pure_bf16`` means: cast the model's
        weights to bfloat16 and run without autocast. fp16 off CUDA becomes "no" (logged).
    """
    if plan is not None:
        precision = plan.setup.precision
        wanted = {Precision.FP16: "fp16", Precision.BF16: "bf16"}.get(precision, "no")
        pure = precision is Precision.PURE_BF16
    else:
        wanted = "fp16" if config.fp16 else "bf16" if config.bf16 else "no"
        pure = False
    if wanted == "fp16" and not cuda:
        logger.warning("fp16 autocast needs CUDA; training in fp32 on the CPU instead.")
        wanted = "no"
    return wanted, pure


def deepspeed_plugin(plan: Plan) -> Any:
    """``accelerate.DeepSpeedPlugin`` configured by the plan's DeepSpeed export.

    Raises:
        MissingDependencyError: DeepSpeed is not installed.
    """
    if importlib.util.find_spec("deepspeed") is None:
        raise MissingDependencyError(
            f"the plan runs ZeRO stage {plan.setup.zero_stage}, which needs DeepSpeed: install it "
            "via `pip install asrfit[deepspeed]`, or re-plan with zero_stage 0."
        )
    from accelerate import DeepSpeedPlugin

    from asrfit.plan.exports import export_plan

    return DeepSpeedPlugin(hf_ds_config=export_plan(plan, "deepspeed"))


def enable_gradient_checkpointing(model: torch.nn.Module, checkpoint_layers: int = 0) -> bool:
    """Call the model's ``gradient_checkpointing_enable()`` (or ``activation_checkpointing_enable()``).

    With ``checkpoint_layers`` k > 0, only the first k encoder layers are checkpointed
    (:func:`asrfit.models.checkpointing.checkpoint_first_layers`), as the plan simulated.

    Returns:
        False (with a warning) when the model has neither.
    """
    if checkpoint_layers:
        names = checkpoint_first_layers(model, checkpoint_layers)
        logger.info("gradient checkpointing on %d layers (%s).", len(names), ", ".join(names))
        return True
    for name in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
        method = getattr(model, name, None)
        if callable(method):
            method()
            logger.info("gradient checkpointing on (%s.%s()).", type(model).__name__, name)
            return True
    logger.warning(
        "gradient checkpointing was asked for, but %s has no gradient_checkpointing_enable(); "
        "training without it uses more memory than planned.",
        type(model).__name__,
    )
    return False


def memory_budget_bytes(plan: Plan | None, config: TrainingConfig, device: torch.device) -> int:
    """The memory budget: the plan's usable bytes, else ``max_memory_gb``, else the device's."""
    if plan is not None:
        return int(plan.usable_bytes)
    if config.max_memory_gb is not None:
        return int(config.max_memory_gb * GIB)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    from asrfit.train.probes import host_total_bytes

    return host_total_bytes()


@dataclass(frozen=True)
class Engines:
    """What :func:`prepare_engines` made of a model and an optimizer.

    Attributes:
        accelerator: The ``Accelerator`` (with DeepSpeed's plugin for a ZeRO plan).
        model: The prepared model (DDP- or DeepSpeed-wrapped where it runs so).
        optimizer: The prepared optimizer.
        mixed_precision: Accelerate's mode: ``"no"``, ``"fp16"`` or ``"bf16"``.
        pure_bf16: The weights were cast to bfloat16 (no autocast).
        deepspeed_steps: DeepSpeed's ``gradient_accumulation_steps``, by which it divides each
            micro-batch's loss; 0 without DeepSpeed.
    """

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    mixed_precision: str
    pure_bf16: bool
    deepspeed_steps: int


def prepare_engines(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    plan: Plan | None,
    config: TrainingConfig,
    *,
    cpu: bool,
    expandable_segments: bool | None,
) -> Engines:
    """Set up what the plan (else the config) asks for, then ``accelerator.prepare`` the two.

    In order: the CUDA allocator's mode (``expandable_segments`` overrides the plan's; on
    without a plan), the host allocator off CUDA, mixed precision, DeepSpeed for a ZeRO plan,
    a fresh ``Accelerator``, bf16 weights, gradient checkpointing and, when ``optimizer`` is
    None, the plan's (else the config's) optimizer.

    Raises:
        MissingDependencyError: The plan needs DeepSpeed (or bitsandbytes) and it is not installed.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    flag = plan.expandable_segments if plan is not None else True
    configure_cuda_allocator(flag if expandable_segments is None else expandable_segments)
    cuda = torch.cuda.is_available() and not cpu
    if not cuda:  # the step-time model prices pages already mapped, as on a GPU
        keep_freed_host_memory()
    mixed_precision, pure_bf16 = resolve_mixed_precision(plan, config, cuda=cuda)
    plugin = deepspeed_plugin(plan) if plan is not None and plan.setup.zero_stage else None
    if AcceleratorState._shared_state:  # a second trainer in a process may change precision
        AcceleratorState._reset_state()
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu, deepspeed_plugin=plugin)
    if pure_bf16:
        model = model.to(torch.bfloat16)
    ckpt_source = plan.setup if plan is not None else config  # both name the two fields
    if ckpt_source.gradient_checkpointing or ckpt_source.checkpoint_layers:
        enable_gradient_checkpointing(model, ckpt_source.checkpoint_layers)
    if optimizer is None:
        kind = plan.setup.optimizer if plan is not None else config.optim
        optimizer = build_optimizer(model, kind, config.learning_rate, cpu=not cuda)
    prepared_model, prepared_optimizer = accelerator.prepare(model, optimizer)
    deepspeed_steps = 0
    if plugin is not None:
        deepspeed_steps = int(plugin.deepspeed_config["gradient_accumulation_steps"])
    return Engines(
        accelerator, prepared_model, prepared_optimizer, mixed_precision, pure_bf16, deepspeed_steps
    )
