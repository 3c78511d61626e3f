"""The pieces the trainer assembles: optimizer, LR schedule, precision, allocator, records.

Each is usable on its own (for example ``build_optimizer`` and ``warmup_schedule`` in a
hand-written loop); :class:`asrfit.train.trainer.MemoryEfficientTrainer` puts them together.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from asrfit.errors import AsrfitError, ConfigError
from asrfit.memory.setup import OptimizerKind, Precision
from asrfit.models.checkpointing import checkpoint_first_layers
from asrfit.models.losses import batch_size_of
from asrfit.train.events import StepEvent

if TYPE_CHECKING:
    from asrfit.plan.plan import Plan
    from asrfit.train.config import TrainingConfig

logger = logging.getLogger(__name__)

GIB = 2**30


class MissingDependencyError(AsrfitError, ImportError):
    """An optional package the requested setup needs is not installed."""


class TrainerLike(Protocol):
    """What :mod:`asrfit.train.checkpoint` and :mod:`asrfit.train.preflight` read of a trainer.

    :class:`~asrfit.train.trainer.MemoryEfficientTrainer` is one; the protocol keeps those
    modules from importing the trainer that imports them.
    """

    accelerator: Any
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    collate_fn: Any
    config: Any
    plan: Any
    info: Any
    dataset: Any
    sampler: Any
    out_dir: Path | None
    keep_last: int
    global_step: int
    epoch: int
    batches_in_epoch: int
    epoch_start_state: Any
    epoch_loss_total: float
    epoch_units_total: int

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        """The model without its DDP/DeepSpeed wrapper."""

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where checkpoints go (None: no out_dir)."""


@dataclass
class MicroBatch:
    """A collated micro-batch and where it came from.

    Attributes:
        batch: The collated batch (on the host).
        indices: Dataset indices, or None for batches from a data loader.
        bucket: Bucket index in the plan, or None.
        origin: Position in its window (kept by the halves of a split).
    """

    batch: Any
    indices: list[int] | None = None
    bucket: int | None = None
    origin: int = 0

    @property
    def size(self) -> int:
        """Utterances."""
        return len(self.indices) if self.indices is not None else batch_size_of(self.batch)


@dataclass
class StepRecord:
    """One optimizer step: its loss and what it trained on.

    Attributes:
        step: Steps done after it (1-based).
        epoch: The epoch.
        loss: Mean loss per unit over the window on all processes.
        units: Units of the window on all processes.
        utterances: Utterances on this process.
        micro_batch_sizes: Utterances per micro-batch as sampled (before any OOM split).
        indices: Dataset indices per micro-batch, when known.
        learning_rate: LR used by this step.
    """

    step: int
    epoch: int
    loss: float
    units: int
    utterances: int
    micro_batch_sizes: list[int]
    indices: list[list[int]] | None
    learning_rate: float


@dataclass
class TrainSummary:
    """What a :meth:`MemoryEfficientTrainer.train` call did.

    Attributes:
        steps: Optimizer steps done in total (including before a resume).
        epochs: Epochs completed.
        utterances: Utterances trained on this process in this call.
        audio_seconds: Audio seconds trained (when durations are known) in this call.
        wall_seconds: Duration of this call.
        peak_memory_bytes: Peak reserved (CUDA) or peak RSS (CPU) the monitor saw.
        mean_loss: Mean loss per unit over this call's steps.
        oom_recoveries: Out-of-memory errors recovered by splitting.
    """

    steps: int
    epochs: int
    utterances: int
    audio_seconds: float
    wall_seconds: float
    peak_memory_bytes: int
    mean_loss: float
    oom_recoveries: int

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows for a table."""
        speed = self.utterances / self.wall_seconds if self.wall_seconds else 0.0
        return [
            ("Steps", str(self.steps)),
            ("Epochs completed", str(self.epochs)),
            ("Utterances", f"{self.utterances} ({speed:,.1f}/s)"),
            ("Audio", f"{self.audio_seconds / 3600:,.3f} h"),
            ("Time", f"{self.wall_seconds:,.1f} s"),
            ("Peak memory", f"{self.peak_memory_bytes / GIB:.2f} GiB"),
            ("Mean loss", f"{self.mean_loss:.4f}"),
            ("OOM recoveries", str(self.oom_recoveries)),
        ]


def windows(micro_batches: Iterator[MicroBatch], k: int) -> Iterator[list[MicroBatch]]:
    """Consecutive lists of ``k`` micro-batches (the last may be shorter): one optimizer step each."""
    while True:
        window = list(islice(micro_batches, k))
        if not window:
            return
        yield window


class LinearWarmupDecay:
    """LR factor: linear warm-up from 0 over ``warmup_steps``, then linear decay to 0 at
    ``total_steps`` (constant after warm-up when ``total_steps`` is None). Picklable state:
    ``LambdaLR.state_dict`` saves a callable object's attributes (not a function's or a
    ``functools.partial``'s arguments), so a resumed run continues the saved schedule."""

    def __init__(self, warmup_steps: int, total_steps: int | None) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if self.total_steps is None:
            return 1.0
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def warmup_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` of :class:`LinearWarmupDecay` (the arithmetic of transformers'
    ``get_linear_schedule_with_warmup``, with its parameters in the scheduler's state).

    Args:
        optimizer: The optimizer whose learning rates the schedule scales.
        warmup_steps: Optimizer steps of linear warm-up.
        total_steps: Optimizer steps of the whole run, or None for no decay.

    Returns:
        The scheduler; step it once per optimizer step.
    """
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, LinearWarmupDecay(warmup_steps, total_steps)
    )


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


class ProgressReport:
    """Progress bar, a log line every few steps, and the summary of one ``train()`` call.

    Args:
        total_steps: Steps the run ends at (None: unknown).
        initial_step: Steps done before this call (after a resume).
        show_bar: Show a tqdm bar (the main process).
        log: Write log lines (the main process).
        log_every_steps: Steps between log lines.
        durations: Seconds per utterance, for audio seconds per second.
        listeners: Run listeners told about every step (:mod:`asrfit.train.events`).
    """

    def __init__(
        self,
        *,
        total_steps: int | None,
        initial_step: int,
        show_bar: bool,
        log: bool,
        log_every_steps: int,
        durations: Any = None,
        listeners: Any = (),
    ) -> None:
        self.bar = None
        if show_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True
            )
        self.log, self.log_every_steps, self.durations = log, log_every_steps, durations
        self.initial_step, self.total_steps = initial_step, total_steps
        self.listeners = list(listeners)
        self.started = time.perf_counter()
        self.utterances, self.audio_seconds = 0, 0.0
        self.loss_total, self.units_total = 0.0, 0

    def update(
        self,
        record: StepRecord,
        peak_memory_bytes: int | None = None,
        memory: dict[str, Any] | None = None,
    ) -> StepEvent:
        """Count a step; refresh the bar; log every ``log_every_steps`` steps.

        Args:
            record: The step.
            peak_memory_bytes: Its measured peak. (Default: ``memory["peak_reserved_bytes"]``)
            memory: The memory monitor's record of the step (for the prediction).

        Returns:
            The step as listeners see it.
        """
        memory = memory or {}
        if peak_memory_bytes is None:
            peak_memory_bytes = int(memory.get("peak_reserved_bytes", 0))
        self.utterances += record.utterances
        step_audio = 0.0
        if self.durations is not None and record.indices is not None:
            step_audio = float(sum(self.durations[i] for mb in record.indices for i in mb))
            self.audio_seconds += step_audio
        self.loss_total += record.loss * record.units
        self.units_total += record.units
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        memory_gib = peak_memory_bytes / GIB
        stats = {
            "loss": f"{record.loss:.4f}",
            "utt/s": f"{self.utterances / elapsed:.1f}",
            "mem": f"{memory_gib:.2f}G",
        }
        if self.audio_seconds:
            stats["audio s/s"] = f"{self.audio_seconds / elapsed:.1f}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(stats, refresh=False)
        if self.log and record.step % self.log_every_steps == 0:
            logger.info(
                "step %d: loss %.4f, batch %d utterances %s, lr %.3g, peak memory %.2f GiB",
                record.step,
                record.loss,
                record.utterances,
                record.micro_batch_sizes,
                record.learning_rate,
                memory_gib,
            )
        done = record.step - self.initial_step
        eta = None
        if self.total_steps is not None and done > 0:
            eta = max(0, self.total_steps - record.step) * elapsed / done
        event = StepEvent(
            step=record.step,
            total_steps=self.total_steps,
            epoch=record.epoch,
            loss=record.loss,
            learning_rate=record.learning_rate,
            utterances=record.utterances,
            audio_seconds=step_audio,
            elapsed_seconds=elapsed,
            audio_seconds_per_second=self.audio_seconds / elapsed,
            eta_seconds=eta,
            predicted_bytes=memory.get("predicted_bytes"),
            measured_bytes=peak_memory_bytes,
            memory_source=str(memory.get("source", "")),
        )
        for listener in self.listeners:
            listener.on_step(event)
        return event

    def finish(
        self, *, steps: int, epochs: int, peak_memory_bytes: int, oom_recoveries: int
    ) -> TrainSummary:
        """Close the bar, log the summary and return it."""
        if self.bar is not None:
            self.bar.close()
        summary = TrainSummary(
            steps=steps,
            epochs=epochs,
            utterances=self.utterances,
            audio_seconds=self.audio_seconds,
            wall_seconds=time.perf_counter() - self.started,
            peak_memory_bytes=peak_memory_bytes,
            mean_loss=self.loss_total / self.units_total if self.units_total else math.nan,
            oom_recoveries=oom_recoveries,
        )
        if self.log:
            audio = f", {self.audio_seconds / 3600:.3f} h of audio" if self.audio_seconds else ""
            logger.info(
                "trained %d steps (%d utterances%s) in %.1f s; peak memory %.2f GiB; "
                "mean loss %.4f; %d OOM recoveries.",
                steps - self.initial_step,
                self.utterances,
                audio,
                summary.wall_seconds,
                peak_memory_bytes / GIB,
                summary.mean_loss,
                oom_recoveries,
            )
        return summary
