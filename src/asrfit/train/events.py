"""What a training run tells its listeners, and two listeners that write it down.

A listener is a plain class whose hooks do nothing by default (the Lightning callback habit).
The trainer calls :meth:`RunListener.on_step` after every optimizer step with a
:class:`StepEvent`; a recipe calls :meth:`RunListener.on_eval` after scoring dev data. The
CLI's progress display is one listener; :class:`JsonlListener` (``steps.jsonl``, read by
``asrfit report``) and :class:`TensorBoardListener` are two others.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asrfit.train.probes import GIB, require_tensorboard
from asrfit.utils.io import atomic_write_text

logger = logging.getLogger(__name__)


@dataclass
class StepEvent:
    """One optimizer step as a progress display or a log sees it.

    Attributes:
        step: Steps done (1-based).
        total_steps: Steps the run ends at, or None when unknown.
        epoch: The epoch (0-based).
        loss: Mean loss per unit of the step.
        learning_rate: Learning rate of the step.
        utterances: Utterances in the step (this process).
        audio_seconds: Audio seconds in the step (0 when durations are unknown).
        elapsed_seconds: Wall seconds since training began.
        audio_seconds_per_second: Audio seconds trained per wall second so far.
        eta_seconds: Expected seconds to ``total_steps``, or None.
        predicted_bytes: The plan's predicted peak reserved bytes for the step's heaviest
            micro-batch, or None without a plan.
        measured_bytes: Measured peak (CUDA reserved, or process RSS on the CPU).
        memory_source: What ``measured_bytes`` is, e.g. ``"torch.cuda"`` or ``"rss"``.
    """

    step: int
    total_steps: int | None
    epoch: int
    loss: float
    learning_rate: float
    utterances: int
    audio_seconds: float
    elapsed_seconds: float
    audio_seconds_per_second: float
    eta_seconds: float | None
    predicted_bytes: int | None
    measured_bytes: int
    memory_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data."""
        return asdict(self)


class RunListener:
    """Hooks a run calls; each does nothing unless overridden."""

    def on_train_begin(self, total_steps: int | None, initial_step: int) -> None:
        """Training (one ``train()`` call, or a whole run) is about to start."""

    def on_step(self, event: StepEvent) -> None:
        """An optimizer step has finished."""

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Held-out data was scored after ``step`` steps (e.g. ``{"wer": .., "cer": ..}``)."""

    def on_train_end(self) -> None:
        """Training is over; flush and close."""


def tensorboard_available() -> bool:
    """True when the ``tensorboard`` package is installed."""
    return importlib.util.find_spec("tensorboard") is not None


class JsonlListener(RunListener):
    """Append every step and every evaluation to a JSON-lines file.

    Lines are ``{"kind": "step", ...StepEvent}`` and ``{"kind": "eval", "step": .., ...scores}``.

    Args:
        path: The file (its folder is created).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: Any = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def on_step(self, event: StepEvent) -> None:
        """Write the step."""
        self._write({"kind": "step", **event.to_dict()})

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Write the scores."""
        self._write({"kind": "eval", "step": step, **scores})

    def on_train_end(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def drop_after(self, step: int) -> int:
        """Keep the records up to ``step`` (a resumed run trains the later steps again).

        The file is rewritten atomically; returns the records dropped.
        """
        self.on_train_end()
        if not self.path.is_file():
            return 0
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                late = int(json.loads(line).get("step", 0)) > step
            except (ValueError, TypeError, AttributeError):
                late = True  # a line cut short when the run was killed
            if late:
                dropped += 1
            else:
                kept.append(line + "\n")
        if dropped:
            atomic_write_text(self.path, "".join(kept))
        return dropped


class TensorBoardListener(RunListener):
    """TensorBoard scalars: loss, learning rate, throughput, memory predicted and measured,
    and evaluation scores.

    Tags: ``train/loss``, ``train/learning_rate``, ``train/audio_seconds_per_second``,
    ``memory/measured_gib``, ``memory/predicted_gib`` and ``eval/<score>`` (``eval/wer``,
    ``eval/cer``).

    Args:
        log_dir: Folder for the event files.

    Raises:
        ImportError: ``tensorboard`` is not installed (says how to install it).
    """

    def __init__(self, log_dir: Path | str) -> None:
        self.log_dir = Path(log_dir)
        self._writer = require_tensorboard()(log_dir=str(self.log_dir))

    def on_step(self, event: StepEvent) -> None:
        """Write the step's scalars."""
        scalars = {
            "train/loss": event.loss,
            "train/learning_rate": event.learning_rate,
            "train/audio_seconds_per_second": event.audio_seconds_per_second,
            "memory/measured_gib": event.measured_bytes / GIB,
        }
        if event.predicted_bytes is not None:
            scalars["memory/predicted_gib"] = event.predicted_bytes / GIB
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, event.step)

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Write the scores under ``eval/``."""
        for name, value in scores.items():
            self._writer.add_scalar(f"eval/{name}", value, step)
        self._writer.flush()

    def on_train_end(self) -> None:
        """Flush and close the writer."""
        self._writer.flush()
        self._writer.close()
