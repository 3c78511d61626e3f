"""What the trainer's collaborators may read of it, as a protocol, so they need not import it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch


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
