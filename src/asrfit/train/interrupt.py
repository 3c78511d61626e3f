"""Ctrl-C while training: finish the optimizer step, save a checkpoint, then stop.

Without this a Ctrl-C loses every step since the last checkpoint (``asrfit train`` saves
every 30 minutes by default). The first SIGINT asks the loop to stop after the step in
progress: the trainer saves a checkpoint there (the same exact-resume checkpoint as
``--save-every``) and raises :class:`TrainingInterrupted`; a second SIGINT stops at once, as
Python's default handler does. Only in the main thread of a single process: with several
processes every rank would have to agree on the step, so there the default stays.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped at a Ctrl-C, after saving a checkpoint of the last finished step.

    Attributes:
        step: The optimizer step the checkpoint holds.
        checkpoint: Its file (None where none was written).
    """

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint"
        super().__init__(
            f"stopped by Ctrl-C after step {step} ({where}); run the same command with "
            "--resume to continue from it"
        )


class InterruptRequest:
    """Whether a Ctrl-C asked training to stop after the current step."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self, enabled: bool = True, processes: int = 1) -> Iterator[InterruptRequest]:
        """Catch SIGINT while the block runs: when ``enabled`` (there is a folder to save
        to), in one process, in the main thread; else nothing changes."""
        if (
            not enabled
            or processes != 1
            or threading.current_thread() is not threading.main_thread()
        ):
            yield self
            return
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            if self.requested:  # the second Ctrl-C: stop now
                raise KeyboardInterrupt
            self.requested = True
            logger.warning(
                "Ctrl-C: finishing this step, then saving a checkpoint to resume from "
                "(Ctrl-C again to stop at once, without it)"
            )

        signal.signal(signal.SIGINT, handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
            self.requested = False


__all__ = ["InterruptRequest", "TrainingInterrupted"]
