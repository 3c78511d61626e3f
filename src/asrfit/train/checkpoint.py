"""Checkpoints that resume exactly: model, optimizer, scheduler, scaler, sampler, RNG, config, plan.

The files, their checksums and how resume picks one are in
:mod:`asrfit.train.checkpoint_files` (re-exported here). Only the last ``keep_last`` are kept.

Resume is exact when the data order is a function of the sampler state: a resumed run
restores the RNGs (Python, NumPy, torch, CUDA), the optimizer, the LR schedule, the fp16
grad scaler, and the sampler's state at the start of the epoch plus the number of batches
already trained in it (the trainer skips those without loading their data).
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrfit.errors import CheckpointWriteError, ConfigError
from asrfit.train.checkpoint_files import (
    CHECKPOINT_PATTERN,
    FORMAT_VERSION,
    checkpoint_path,
    checkpoint_problem,
    checksum_path,
    file_sha256,
    latest_checkpoint,
    latest_good_checkpoint,
    list_checkpoints,
    read_checkpoint,
    resolve_checkpoint,
    write_checkpoint_file,
)
from asrfit.train.protocols import TrainerLike
from asrfit.utils.io import Pathlike

logger = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's, torch's and (when initialised) CUDA's generators."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [
            kind,
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            pos,
            has_gauss,
            cached,
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class CheckpointInfo:
    """Where a loaded checkpoint left off.

    Attributes:
        path: The file.
        step: Optimizer steps done.
        epoch: The epoch in progress.
        config: The training config (as a dict) it was made with, or None.
        plan: The plan (as a dict), or None.
        extra: Anything else the writer stored (the trainer's position in the epoch).
    """

    path: Path
    step: int
    epoch: int
    config: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    directory: Pathlike,
    *,
    model: torch.nn.Module,
    step: int,
    epoch: int = 0,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: Any = None,
    config: Any = None,
    plan: Any = None,
    extra: dict[str, Any] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write a checkpoint atomically and delete all but the newest ``keep_last``.

    Args:
        directory: Folder of the checkpoints (created when missing).
        model: The (unwrapped) model.
        step: Optimizer steps done; names the file.
        epoch: The epoch in progress.
        optimizer: Its ``state_dict`` is stored.
        scheduler: An LR scheduler; its ``state_dict`` is stored.
        scaler: A ``torch.amp.GradScaler``; its ``state_dict`` is stored.
        sampler: Anything with ``state_dict()`` (``MemoryBudgetSampler``), or a state dict.
        config: A ``TrainingConfig`` (or anything with ``to_dict``), stored as a dict.
        plan: A ``Plan``, stored as a dict.
        extra: More plain data to store (returned as ``CheckpointInfo.extra``).
        keep_last: Checkpoints to keep, newest first; 0 keeps all. (Default: 3)

    Returns:
        The checkpoint file.

    Raises:
        ConfigError: On a negative ``keep_last`` or ``step``.
    """
    if keep_last < 0 or step < 0:
        raise ConfigError(f"save_checkpoint: keep_last={keep_last} and step={step} must be >= 0.")
    state: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "step": int(step),
        "epoch": int(epoch),
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "sampler": _state_of(sampler),
        "rng": capture_rng_state(),
        "config": None if config is None else _as_dict(config),
        "plan": None if plan is None else _as_dict(plan),
        "extra": dict(extra or {}),
    }
    dest = checkpoint_path(directory, step)
    write_checkpoint_file(state, dest)
    logger.info("saved checkpoint %s (step %d, epoch %d)", dest, step, epoch)
    if keep_last:
        for old in list_checkpoints(directory)[:-keep_last]:
            old.unlink(missing_ok=True)
            checksum_path(old).unlink(missing_ok=True)
            logger.debug("removed old checkpoint %s", old)
    return dest


def load_checkpoint(
    path: Pathlike,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    sampler: Any = None,
    directory: Pathlike | None = None,
    restore_rng: bool = True,
) -> CheckpointInfo:
    """Load a checkpoint into the given objects (those passed; the others are left alone).

    Args:
        path: A checkpoint file or folder, or ``"latest"`` (the newest in ``directory``).
        model: Receives the weights (strictly: missing or unexpected keys are an error).
        optimizer: Receives the optimizer state.
        scheduler: Receives the LR schedule's state.
        scaler: Receives the grad scaler's state (when the checkpoint has one).
        sampler: Receives ``load_state_dict`` of the sampler state (when the checkpoint has one).
        directory: Where ``"latest"`` looks.
        restore_rng: Restore the Python, NumPy, torch and CUDA generators. (Default: True)

    Returns:
        A :class:`CheckpointInfo`.

    Raises:
        ConfigError: When the file is missing, is not an asrfit checkpoint, or lacks a state
            that was asked for.
    """
    file = resolve_checkpoint(path, directory)
    state = read_checkpoint(file)
    model.load_state_dict(state["model"])
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is None:
            continue
        if state[name] is None:
            raise ConfigError(f"{file}: has no {name} state to resume from.")
        target.load_state_dict(state[name])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if sampler is not None and state["sampler"] is not None:
        sampler.load_state_dict(state["sampler"])
    if restore_rng:
        restore_rng_state(state["rng"])
    logger.info("resumed from %s (step %d, epoch %d)", file, state["step"], state["epoch"])
    return CheckpointInfo(
        path=file,
        step=state["step"],
        epoch=state["epoch"],
        config=state["config"],
        plan=state["plan"],
        extra=state["extra"],
    )


def tracks_consumed(sampler: Any) -> bool:
    """Whether ``sampler.state_dict`` takes ``batches_consumed`` (``MemoryBudgetSampler`` does)."""
    method = getattr(sampler, "state_dict", None)
    if not callable(method):
        return False
    try:
        return "batches_consumed" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def sampler_checkpoint_state(
    sampler: Any, batches_in_epoch: int, epoch_start_state: Any
) -> dict[str, Any] | None:
    """The sampler's part of a checkpoint; None between epochs or without a sampler.

    A sampler whose ``state_dict`` takes ``batches_consumed`` stores its exact position (a
    prefetching data loader runs ahead of the training loop): kind ``"position"``. Any other
    stores its state at the start of the epoch, and resume skips the batches already
    trained: kind ``"epoch_start"``.
    """
    if sampler is None or batches_in_epoch == 0:
        return None
    if tracks_consumed(sampler):
        return {"kind": "position", "state": sampler.state_dict(batches_consumed=batches_in_epoch)}
    return {"kind": "epoch_start", "state": epoch_start_state}


def restore_sampler(
    sampler: Any, saved: dict[str, Any] | None, batches_in_epoch: int
) -> tuple[int, bool]:
    """Put a fresh sampler where :func:`sampler_checkpoint_state` left it.

    Returns:
        ``(batches to skip, restored)``: ``restored`` False means "start the epoch afresh"
        (call ``set_epoch``); without a sampler (a data loader) the epoch's first
        ``batches_in_epoch`` batches are to be skipped.
    """
    if sampler is None:
        return batches_in_epoch, False
    if saved is None:
        return 0, False
    if saved["state"] is not None:
        sampler.load_state_dict(saved["state"])
    if saved["kind"] == "position":
        return 0, True
    return batches_in_epoch, True


def _state_of(obj: Any) -> Any:
    if obj is None or isinstance(obj, dict):
        return obj
    return obj.state_dict()


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj if isinstance(obj, dict) else obj.to_dict()


def save_trainer_checkpoint(trainer: TrainerLike) -> Path | None:
    """Checkpoint a trainer's current step (see :meth:`MemoryEfficientTrainer.save_checkpoint`).

    The per-process parts (sampler position, RNG states) of every process are gathered into
    the one file the main process writes. When that write fails (a full disk), every process
    raises: the main one its error, the others :class:`~asrfit.errors.CheckpointWriteError`
    quoting it.
    """
    if trainer.checkpoint_dir is None:
        raise ConfigError("save_checkpoint: the trainer has no out_dir to write to.")
    acc = trainer.accelerator
    sampler_state = sampler_checkpoint_state(
        trainer.sampler, trainer.batches_in_epoch, trainer.epoch_start_state
    )
    ranks = [{"sampler": sampler_state, "rng": capture_rng_state()}]
    if acc.num_processes > 1:
        from accelerate.utils import gather_object

        ranks = gather_object(ranks)
    path, failure = None, None
    if acc.is_main_process:
        try:
            path = save_checkpoint(
                trainer.checkpoint_dir,
                model=trainer.unwrapped_model,
                step=trainer.global_step,
                epoch=trainer.epoch,
                optimizer=getattr(trainer.optimizer, "optimizer", trainer.optimizer),
                scheduler=trainer.scheduler,
                scaler=acc.scaler,
                config=trainer.config,
                plan=trainer.plan,
                extra={
                    "batches_in_epoch": trainer.batches_in_epoch,
                    "ranks": ranks,
                    "nonfinite": trainer.nonfinite.state_dict(),
                    "micro_limits": trainer.micro_limits.state_dict(),
                    "epoch_loss": [float(trainer.epoch_loss_total), int(trainer.epoch_units_total)],
                },
                keep_last=trainer.keep_last,
            )
        except Exception as exc:  # raised below, after every process has been told
            failure = exc
    if (
        acc.num_processes > 1
    ):  # the others wait for the outcome, instead of a collective that never comes
        from accelerate.utils import broadcast_object_list

        told = broadcast_object_list(
            [None if failure is None else f"{type(failure).__name__}: {failure}"]
        )[0]
        if failure is None and told is not None:
            raise CheckpointWriteError(
                f"process {acc.process_index}: the main process could not write the checkpoint of "
                f"step {trainer.global_step} in {trainer.checkpoint_dir}, so every process stops: {told}"
            )
    if failure is not None:
        raise failure
    return path


def resume_trainer(trainer: TrainerLike, resume_from: Pathlike, sampler: Any) -> tuple[int, bool]:
    """Load a checkpoint into a trainer (and its fresh sampler) to continue exactly.

    Returns:
        ``(batches to skip, sampler restored)``, see :func:`restore_sampler`.

    Raises:
        ConfigError: An unreadable checkpoint, or one saved by another number of processes.
    """
    acc = trainer.accelerator
    requested = _schedule_settings(trainer.scheduler)
    info = load_checkpoint(
        resume_from,
        model=trainer.unwrapped_model,
        optimizer=getattr(trainer.optimizer, "optimizer", trainer.optimizer),
        scheduler=trainer.scheduler,
        scaler=acc.scaler,
        directory=trainer.checkpoint_dir,
        restore_rng=False,
    )
    _keep_requested_schedule(trainer.scheduler, requested, info.path)
    ranks = info.extra.get("ranks", [])
    if len(ranks) != acc.num_processes:
        raise ConfigError(
            f"{info.path}: saved by {len(ranks)} processes, resumed on {acc.num_processes}: "
            "each process's data shard, sampler position and random state are in the checkpoint, "
            f"so exact resume needs the same number. Resume on {len(ranks)} processes "
            f"(torchrun --nproc_per_node {len(ranks)}, or accelerate launch --num_processes "
            f"{len(ranks)}), or start a new run from its weights (load_checkpoint(path, model=...) "
            "without the optimizer and sampler states)."
        )
    if info.plan is not None and trainer.plan is not None:
        from asrfit.plan.plan import Plan

        trainer.plan = Plan.from_dict(info.plan)  # with any limits lowered after OOMs
    trainer.global_step, trainer.epoch = info.step, info.epoch
    trainer.batches_in_epoch = int(info.extra.get("batches_in_epoch", 0))
    if "nonfinite" in info.extra:
        trainer.nonfinite.load_state_dict(info.extra["nonfinite"])
    if "micro_limits" in info.extra:
        trainer.micro_limits.load_state_dict(info.extra["micro_limits"])
    if "epoch_loss" in info.extra and trainer.batches_in_epoch:
        loss_total, units_total = info.extra["epoch_loss"]
        trainer.epoch_loss_total, trainer.epoch_units_total = float(loss_total), int(units_total)
    rank_state = ranks[acc.process_index]
    restore_rng_state(rank_state["rng"])
    saved = rank_state["sampler"]
    if saved is not None and saved["kind"] == "epoch_start":
        trainer.epoch_start_state = saved["state"]
    return restore_sampler(sampler, saved, trainer.batches_in_epoch)


def restore_weights(trainer: TrainerLike, saved: dict[str, Any], *, position: bool = False) -> None:
    """Load a read checkpoint's weights into a trainer's model, without its optimizer, schedule,
    sampler or random state (to score an epoch whose checkpoint was written but not scored, or
    to start the next stage from a finished one).

    Args:
        trainer: The trainer.
        saved: The checkpoint as :func:`read_checkpoint` returns it.
        position: Also take the checkpoint's step and epoch.
    """
    trainer.unwrapped_model.load_state_dict(saved["model"])
    if position:
        trainer.global_step, trainer.epoch = int(saved["step"]), int(saved["epoch"])


def _schedule_settings(scheduler: Any) -> list[dict[str, Any]] | None:
    """The warm-up and total steps of each of a ``LambdaLR``'s schedule objects (None: none)."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if not lambdas or not all(hasattr(f, "total_steps") for f in lambdas):
        return None
    return [{"warmup_steps": f.warmup_steps, "total_steps": f.total_steps} for f in lambdas]


def _keep_requested_schedule(
    scheduler: Any, requested: list[dict[str, Any]] | None, where: Path
) -> None:
    """After a checkpoint's scheduler state is loaded: keep the schedule this run asked for.

    A :class:`~asrfit.train.schedule.LinearWarmupDecay` saves its warm-up and total steps
    with the scheduler, so a run resumed with the same length continues its schedule
    exactly. A run resumed to train longer (or shorter) asked for another total: the saved
    one would hold the learning rate at 0 after the old end, so the run's own settings are
    put back (the step count is kept) and the optimizer's rates set from them.
    """
    restored = _schedule_settings(scheduler)
    if requested is None or restored is None or restored == requested:
        return
    for fn, settings in zip(scheduler.lr_lambdas, requested, strict=True):
        fn.__dict__.update(settings)
    step = scheduler.last_epoch
    rates = [
        base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() reports until the next step
    logger.warning(
        "%s: its learning-rate schedule ended at step %s; this run's ends at step %s: "
        "continuing from step %d on this run's schedule (learning rate now %.3g)",
        where,
        restored[0]["total_steps"],
        requested[0]["total_steps"],
        step,
        rates[0],
    )


def save_due(trainer: Any) -> bool:
    """Whether ``save_every_steps`` or ``save_every_minutes`` asks for a checkpoint now."""
    if trainer.out_dir is None:
        return False
    if trainer.save_every_steps and trainer.global_step % trainer.save_every_steps == 0:
        return True
    minutes = trainer.save_every_minutes
    return bool(minutes) and time.monotonic() - trainer._last_save_time >= 60.0 * minutes


__all__ = [
    "CHECKPOINT_PATTERN",
    "FORMAT_VERSION",
    "CheckpointInfo",
    "checkpoint_path",
    "checkpoint_problem",
    "checksum_path",
    "file_sha256",
    "latest_checkpoint",
    "latest_good_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
]
