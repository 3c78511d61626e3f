"""The records of training: a micro-batch with its origin, one optimizer step, one ``train()``
call, and the grouping of micro-batches into optimizer steps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from asrfit.models.losses import batch_size_of

GIB = 2**30


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
