"""The learning-rate schedule: linear warm-up then linear decay, saved with the checkpoint."""

from __future__ import annotations

import torch


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
