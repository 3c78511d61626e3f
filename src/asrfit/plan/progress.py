"""Planning progress on a terminal: which simulation runs, and at most how many remain.

One line on stderr, rewritten in place (``\\r``) as each new simulation starts and cleared
when planning ends. Silent unless stderr is a terminal; the CLI also keeps it off for
``--json`` and exports, whose output is for machines.
"""

from __future__ import annotations

import sys
from typing import IO

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape


class TraceProgress:
    """Counts simulations against an upper bound and shows the current one.

    Args:
        stream: Where to write (a terminal).
        frames_per_second: Model-input steps per audio second (to show lengths in seconds).
    """

    def __init__(self, stream: IO[str], frames_per_second: float = 16000.0) -> None:
        self.stream = stream
        self.frames_per_second = frames_per_second
        self.done = 0
        self.bound = 0  # simulations this plan may still need, at most (done included)
        self._width = 0

    @classmethod
    def for_terminal(
        cls, enabled: bool = True, stream: IO[str] | None = None
    ) -> TraceProgress | None:
        """A progress line on ``stream`` (Default: stderr) if enabled and it is a terminal."""
        stream = stream if stream is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        if not enabled or isatty is None or not isatty():
            return None
        return cls(stream)

    def expect(self, simulations: int) -> None:
        """Raise the bound by ``simulations`` that may be needed (cached ones count on hits)."""
        self.bound += simulations

    def skip(self, simulations: int) -> None:
        """Lower the bound: ``simulations`` that screening made unnecessary."""
        self.bound = max(self.done, self.bound - simulations)

    def started(self, batch: BatchShape, setup: Setup, what: str) -> None:
        """A new (uncached) simulation starts."""
        self.done += 1
        self.bound = max(self.bound, self.done)
        seconds = batch.input_length / self.frames_per_second
        line = (
            f"asrfit plan: simulation {self.done} (at most {self.bound - self.done} more): "
            f"{what}, {setup.precision.value}{'+ckpt' if setup.gradient_checkpointing else ''}, "
            f"batch {batch.batch_size} x {seconds:.1f} s"
        )
        self._write(line)

    def close(self) -> None:
        """Clear the line."""
        if self._width:
            self._write("")
            self.stream.write("\r")
            self.stream.flush()
            self._width = 0

    def _write(self, line: str) -> None:
        pad = max(0, self._width - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._width = len(line)
