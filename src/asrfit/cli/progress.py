"""The progress of ``asrfit train``: a live display on a terminal, plain lines when piped.

Both are run listeners (:class:`asrfit.train.events.RunListener`). The live display shows
steps done of the total, the loss, audio seconds per second, memory measured against the
plan's prediction and the time left; the plain form prints the same as one line every
``every_seconds`` (and at the first and last step), so a log file reads well.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from asrfit.train.events import RunListener, StepEvent

GIB = 2**30


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _memory(event: StepEvent) -> str:
    measured = f"{event.measured_bytes / GIB:.2f}"
    if event.predicted_bytes is None:
        return f"mem {measured} GiB"
    predicted = f"{event.predicted_bytes / GIB:.2f}"
    if event.memory_source.startswith("rss"):
        # the whole process (interpreter, libraries, cached inputs), against the step's tensors:
        # not one quantity, so not shown as a ratio
        return f"rss {measured} GiB, step pred {predicted} GiB"
    return f"mem {measured}/{predicted} GiB meas/pred"


def step_line(event: StepEvent) -> str:
    """One plain line for a step, e.g.
    ``step 20/120 | loss 2.3456 | 812.3 audio-s/s | mem 0.21/0.32 GiB meas/pred | ETA 1:05``."""
    total = "?" if event.total_steps is None else str(event.total_steps)
    return (
        f"step {event.step}/{total} | loss {event.loss:.4f} | lr {event.learning_rate:.2e} | "
        f"{event.audio_seconds_per_second:,.1f} audio-s/s | {_memory(event)} | "
        f"ETA {_eta(event.eta_seconds)}"
    )


class PlainProgress(RunListener):
    """A line per ``every_seconds`` of training, and for the first and last step.

    Args:
        every_seconds: Seconds between lines. (Default: 10)
        stream: Where to write. (Default: the current stdout)
    """

    def __init__(self, every_seconds: float = 10.0, stream: Any = None) -> None:
        self.every_seconds, self.stream = every_seconds, stream
        self._last: float | None = None

    def on_step(self, event: StepEvent) -> None:
        """Print the step when it is time to."""
        now = time.monotonic()
        last_step = event.total_steps is not None and event.step >= event.total_steps
        if self._last is None or now - self._last >= self.every_seconds or last_step:
            self._last = now
            click.echo(step_line(event), file=self.stream or sys.stdout)

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Print the scores."""
        text = ", ".join(f"{k.upper()} {100 * v:.1f} %" for k, v in scores.items())
        click.echo(f"step {step}: dev {text}", file=self.stream or sys.stdout)


class RichProgress(RunListener):
    """A live bar with the step's numbers beside it (for a terminal).

    Args:
        console: The console to draw on. (Default: one on stdout)
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            console=self.console,
            transient=False,
        )
        self._task: Any = None

    def on_train_begin(self, total_steps: int | None, initial_step: int) -> None:
        """Start the display, or grow its total for the next stage."""
        if self._task is None:
            self.progress.start()
            self._task = self.progress.add_task(
                "train", total=total_steps, completed=initial_step, stats="starting"
            )
        else:
            self.progress.update(self._task, total=total_steps)

    def on_step(self, event: StepEvent) -> None:
        """Move the bar and refresh the numbers."""
        if self._task is None:
            self.on_train_begin(event.total_steps, event.step - 1)
        stats = (
            f"loss {event.loss:.4f} | {event.audio_seconds_per_second:,.1f} audio-s/s | "
            f"{_memory(event)} | ETA {_eta(event.eta_seconds)}"
        )
        self.progress.update(self._task, completed=event.step, total=event.total_steps, stats=stats)

    def on_eval(self, step: int, scores: dict[str, float]) -> None:
        """Print the scores above the bar."""
        text = ", ".join(f"{k.upper()} {100 * v:.1f} %" for k, v in scores.items())
        self.progress.console.print(f"step {step}: dev {text}", highlight=False)

    def on_train_end(self) -> None:
        """Stop the display (the last state stays on screen)."""
        if self._task is not None:
            self.progress.stop()
            self._task = None


def progress_for(stream: Any = None, every_seconds: float = 10.0) -> RunListener:
    """A live display when ``stream`` (default stdout) is a terminal, else plain lines."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return RichProgress(Console(file=stream))
    return PlainProgress(every_seconds=every_seconds, stream=stream)
