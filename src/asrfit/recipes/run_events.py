"""The listeners of an ``asrfit train`` run: ``steps.jsonl``, TensorBoard, and the caller's
(the CLI's progress display), with steps numbered across the run's stages."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from asrfit.train.events import (
    JsonlListener,
    RunListener,
    StepEvent,
    TensorBoardListener,
    tensorboard_available,
)

logger = logging.getLogger(__name__)


class StageListeners(RunListener):
    """Fans a run's events out to listeners, numbering steps across stages and estimating
    the time left to the end of the stages known so far.

    Set :attr:`offset` (steps of the earlier stages) and :attr:`total_steps` (steps to the end
    of the current stage, counted from the run's start) before each stage.

    Args:
        listeners: Who hears the events.
    """

    def __init__(self, listeners: list[RunListener]) -> None:
        self.listeners, self.offset, self.total_steps = listeners, 0, 0
        self.started = time.perf_counter()
        self.done = 0

    def on_train_begin(self, total_steps: int | None, initial_step: int) -> None:
        """Pass it on."""
        for listener in self.listeners:
            listener.on_train_begin(total_steps, initial_step)

    def on_step(self, event: StepEvent) -> None:
        """Pass it on, numbered across stages, with the time left to the end."""
        self.done += 1
        elapsed = time.perf_counter() - self.started
        step = event.step + self.offset
        eta = max(0, self.total_steps - step) * elapsed / self.done
        shifted = replace(event, step=step, total_steps=self.total_steps, eta_seconds=eta)
        for listener in self.listeners:
            listener.on_step(shifted)

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Pass it on, numbered across stages."""
        for listener in self.listeners:
            listener.on_eval(step + self.offset, scores)

    def on_train_end(self) -> None:
        """Pass it on."""
        for listener in self.listeners:
            listener.on_train_end()

    def resumed_at(self, step: int) -> None:
        """A resumed run continues after ``step`` (numbered across stages): listeners that
        keep a record drop what they recorded after it, which is trained again."""
        for listener in self.listeners:
            drop = getattr(listener, "drop_after", None)
            if drop is not None:
                dropped = drop(step)
                if dropped:
                    logger.info("resumed after step %d: %d later records dropped", step, dropped)


def run_listeners(cfg: Any, out: Path, extra: list[RunListener]) -> StageListeners:
    """``steps.jsonl`` always, TensorBoard when installed (and ``cfg.tensorboard``), then ``extra``.

    A fresh run starts ``steps.jsonl`` afresh; a resumed one appends to it (after dropping
    the records past its checkpoint: :meth:`StageListeners.resumed_at`).
    """
    if not cfg.resume:
        (out / "steps.jsonl").unlink(missing_ok=True)
    chosen: list[RunListener] = [JsonlListener(out / "steps.jsonl")]
    if cfg.tensorboard and tensorboard_available():
        chosen.append(TensorBoardListener(out / "tensorboard"))
    elif cfg.tensorboard:
        logger.info("no TensorBoard scalars: `pip install tensorboard` to get them.")
    return StageListeners(chosen + extra)
