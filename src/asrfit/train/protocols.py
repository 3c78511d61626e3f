"""What the trainer's collaborators may read of it, as a protocol, so they need not import it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from asrfit.models.losses import LossFn

if TYPE_CHECKING:  # accelerate, the plan and the config are imported where they are used
    from accelerate import Accelerator

    from asrfit.plan.plan import Plan
    from asrfit.train.batching import DataInfo
    from asrfit.train.config import TrainingConfig


class TrainerLike(Protocol):
    """What :mod:`asrfit.train.checkpoint` and :mod:`asrfit.train.preflight` read of a trainer.

    :class:`~asrfit.train.trainer.MemoryEfficientTrainer` is one; the protocol keeps those
    modules from importing the trainer that imports them.
    """

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    loss_fn: LossFn
    collate_fn: Callable[[list[Any]], Any]
    config: TrainingConfig
    plan: Plan | None
    info: DataInfo
    # any map-style dataset and any batch sampler the user passes (None before fit)
    dataset: Any
    sampler: Any
    out_dir: Path | None
    keep_last: int
    global_step: int
    epoch: int
    batches_in_epoch: int
    # the sampler's state_dict() at the epoch's start, where it has one
    epoch_start_state: dict[str, Any] | None
    epoch_loss_total: float
    epoch_units_total: int

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        """The model without its DDP/DeepSpeed wrapper."""

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where checkpoints go (None: no out_dir)."""
