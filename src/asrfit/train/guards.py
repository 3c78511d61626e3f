"""Guards around an optimizer step: non-finite loss or gradients, and micro-batch limits.

A step whose loss or gradient norm is NaN or infinite is *skipped*: its gradients are
dropped, the optimizer does not step, the step is counted (:class:`NonFiniteGuard`).
``max_consecutive`` such steps in a row stop the run with :class:`NonFiniteLossError`, which
names the cause and the utterances of the last bad step. (With an fp16 grad scaler,
infinite gradients are the scaler's business: it skips those steps itself.)

After repeated out-of-memory errors in a bucket the trainer does not change which
utterances the sampler puts together: it runs that bucket's micro-batches as pieces of at
most :attr:`MicroBatchLimits.limits` utterances, inside the same optimizer step
(:func:`presplit`), so every step keeps its utterances.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from asrfit.errors import AsrfitError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class NonFiniteLossError(AsrfitError, RuntimeError):
    """Too many optimizer steps in a row had a NaN or infinite loss or gradient."""


def total_grad_norm(parameters: Iterable[torch.nn.Parameter]) -> float:
    """The L2 norm of all gradients (0.0 when there are none)."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norms = torch._foreach_norm(grads, 2.0)
    return float(torch.linalg.vector_norm(torch.stack([n.float().cpu() for n in norms]), 2.0))


@dataclass
class NonFiniteGuard:
    """Counts skipped non-finite steps; stops after ``max_consecutive`` in a row.

    Args:
        max_consecutive: Non-finite steps in a row that stop the run. (Default: 5)
    """

    max_consecutive: int = 5
    skipped_steps: int = 0
    streak: int = 0
    causes: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def cause(loss: float, grad_norm: float | None) -> str | None:
        """``"loss"`` or ``"gradients"`` when one is not finite, else None."""
        if not math.isfinite(loss):
            return "loss"
        if grad_norm is not None and not math.isfinite(grad_norm):
            return "gradients"
        return None

    def record(self, cause: str | None, step: int, where: str) -> None:
        """Count a step's outcome (``cause`` None: a good step, which ends a streak).

        Raises:
            NonFiniteLossError: At ``max_consecutive`` non-finite steps in a row.
        """
        if cause is None:
            self.streak = 0
            return
        self.skipped_steps += 1
        self.streak += 1
        self.causes[cause] = self.causes.get(cause, 0) + 1
        logger.warning(
            "step %d: the %s is NaN or infinite (%s); step skipped (%d in a row, %d in all).",
            step,
            cause,
            where,
            self.streak,
            self.skipped_steps,
        )
        if self.streak >= self.max_consecutive:
            raise NonFiniteLossError(
                f"{self.streak} optimizer steps in a row (the last: step {step}, {where}) had a NaN "
                f"or infinite {cause}; training stopped. Look for broken audio or transcripts in "
                "those utterances, lower the learning rate, or train in fp32/bf16 instead of fp16."
            )

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {
            "skipped_steps": self.skipped_steps,
            "streak": self.streak,
            "causes": dict(self.causes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.skipped_steps, self.streak = int(state["skipped_steps"]), int(state["streak"])
        self.causes = dict(state["causes"])


@dataclass
class MicroBatchLimits:
    """The most utterances a micro-batch of a bucket runs at once, after repeated OOMs.

    Attributes:
        limits: Bucket index -> utterances per piece.
    """

    limits: dict[int, int] = field(default_factory=dict)

    def lower(self, bucket: int, limit: int) -> None:
        """Run ``bucket``'s micro-batches in pieces of at most ``limit``."""
        self.limits[int(bucket)] = max(1, int(limit))

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (keys as strings)."""
        return {str(k): v for k, v in self.limits.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.limits = {int(k): int(v) for k, v in state.items()}


def presplit(
    pieces: list[T],
    limits: MicroBatchLimits,
    *,
    bucket_of: Callable[[T], int | None],
    size_of: Callable[[T], int],
    split: Callable[[T, tuple[int, int]], tuple[T, T]],
) -> list[T]:
    """Cut every piece above its bucket's limit into consecutive pieces of at most the limit.

    The utterances, and their order, stay the same: only the micro-batch boundaries move.
    """
    out: list[T] = []
    for piece in pieces:
        bucket = bucket_of(piece)
        limit = limits.limits.get(bucket) if bucket is not None else None
        while limit is not None and size_of(piece) > limit:
            head, piece = split(piece, (limit, size_of(piece) - limit))
            out.append(head)
        out.append(piece)
    return out
