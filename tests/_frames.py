"""A tiny per-frame classifier and its summed loss, shared by the trainer-runtime tests.

``frame_loss`` returns ``(summed cross-entropy, labelled frames)``: the trainer divides the
sums of an accumulation window by its total units, which is what makes accumulation over
uneven micro-batches equal to one big batch.
"""

from __future__ import annotations

import torch
from torch import nn


class FrameModel(nn.Module):
    """``(B, T, 4)`` frames to ``(B, T, 3)`` logits."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.proj(x)))


def frame_units(batch) -> int:
    """Labelled frames (labels that are not -100)."""
    return int((batch["labels"] != -100).sum())


def frame_loss(model, batch):
    """``(summed cross-entropy over labelled frames, labelled frames)``."""
    logits = model(batch["x"])
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, 3), batch["labels"].reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss, frame_units(batch)
