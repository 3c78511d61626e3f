"""Training on a plan: the Accelerate loop, OOM recovery, memory monitor, checkpoints.

Names are imported lazily (``import asrfit.train`` does not import torch or accelerate):

- :class:`MemoryEfficientTrainer` (``asrfit.train.trainer``): the training loop.
- :class:`AdaptiveMemoryCallback` (``asrfit.train.callbacks``): the monitor as a Hugging
  Face ``TrainerCallback``.
- :class:`MemoryMonitor` (``asrfit.train.monitor``): per-step memory, predicted vs measured.
- :func:`save_checkpoint` / :func:`load_checkpoint` (``asrfit.train.checkpoint``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "MemoryEfficientTrainer": "asrfit.train.trainer",
    "TrainSummary": "asrfit.train.records",
    "AdaptiveMemoryCallback": "asrfit.train.callbacks",
    "MemoryMonitor": "asrfit.train.monitor",
    "save_checkpoint": "asrfit.train.checkpoint",
    "load_checkpoint": "asrfit.train.checkpoint",
    "latest_checkpoint": "asrfit.train.checkpoint",
    "read_checkpoint": "asrfit.train.checkpoint",
    "latest_good_checkpoint": "asrfit.train.checkpoint",
    "TrainingInterrupted": "asrfit.train.interrupt",
    "BatchTooLargeError": "asrfit.train.oom",
    "is_oom": "asrfit.train.oom",
    "run_preflight": "asrfit.train.preflight",
}

if TYPE_CHECKING:  # pragma: no cover
    from asrfit.train.callbacks import AdaptiveMemoryCallback
    from asrfit.train.checkpoint import (
        latest_checkpoint,
        latest_good_checkpoint,
        load_checkpoint,
        read_checkpoint,
        save_checkpoint,
    )
    from asrfit.train.interrupt import TrainingInterrupted
    from asrfit.train.monitor import MemoryMonitor
    from asrfit.train.oom import BatchTooLargeError, is_oom
    from asrfit.train.preflight import run_preflight
    from asrfit.train.records import TrainSummary
    from asrfit.train.trainer import MemoryEfficientTrainer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asrfit.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "AdaptiveMemoryCallback",
    "BatchTooLargeError",
    "MemoryEfficientTrainer",
    "MemoryMonitor",
    "TrainSummary",
    "TrainingInterrupted",
    "is_oom",
    "latest_checkpoint",
    "latest_good_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "run_preflight",
    "save_checkpoint",
]
