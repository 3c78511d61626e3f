"""Stop signals while training: finish the optimizer step, save a checkpoint, then stop.

Without this a Ctrl-C, or a cluster's preemption notice (SLURM and Kubernetes send SIGTERM
before they kill; SLURM's ``--signal`` sends SIGUSR1), loses every step since the last
checkpoint (``asrfit train`` saves every 30 minutes by default). The first SIGINT, or the
first of the *stop signals* (SIGTERM and SIGUSR1 unless told otherwise), asks the loop to
stop after the step in progress: the trainer saves a checkpoint there (the same exact-resume
checkpoint as ``--save-every``) and raises :class:`TrainingInterrupted`, whose
:attr:`~TrainingInterrupted.exit_status` is ``128 + the signal's number`` (130 for Ctrl-C, 143
for SIGTERM, 138 for SIGUSR1 on Linux). A second SIGINT stops at once, as Python's default
handler does; a repeated stop signal changes nothing.

With several processes the signal may reach only one of them. After every optimizer step
each process adds its request to one all-reduce (the maximum of one integer: the signal's
number, 0 for none), so every rank stops after the same step, the main process writes the
one checkpoint, and all of them raise. The handlers are installed in the main thread only.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_STOP_SIGNALS: tuple[str, ...] = ("SIGTERM", "SIGUSR1")


def parse_stop_signals(value: str | Sequence[str] | None) -> tuple[signal.Signals, ...]:
    """Signal names to signals: ``"SIGTERM,SIGUSR1"``, ``"TERM USR2"``, ``["SIGTERM"]``; ``"none"``
    or empty for none.

    Raises:
        ConfigError: On a name that is not a signal this system has, or SIGKILL/SIGSTOP
            (which no process can catch), or SIGINT (always handled, as Ctrl-C).
    """
    if value is None:
        return ()
    names = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    if [n.lower() for n in names] in (["none"], []):
        return ()
    found = []
    for name in names:
        text = str(name).strip().upper()
        text = text if text.startswith("SIG") else "SIG" + text
        member = signal.Signals.__members__.get(text)
        if member is None or member in (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT):
            raise ConfigError(
                f"stop_signals: {name!r} is not a signal training can stop on; give names "
                "such as SIGTERM,SIGUSR1 (SIGINT is always Ctrl-C; SIGKILL and SIGSTOP cannot "
                "be caught), or 'none'."
            )
        if member not in found:
            found.append(member)
    return tuple(found)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped at a signal, after saving a checkpoint of the last finished step.

    Attributes:
        step: The optimizer step the checkpoint holds.
        checkpoint: Its file (None where none was written, and on processes other than the main).
        signal_number: The signal that asked to stop (``SIGINT`` for Ctrl-C).
    """

    def __init__(
        self, step: int, checkpoint: Path | None, signal_number: int = signal.SIGINT
    ) -> None:
        self.step, self.checkpoint = step, checkpoint
        self.signal_number = int(signal_number)
        what = "Ctrl-C" if self.signal_number == signal.SIGINT else self.signal_name
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint"
        super().__init__(
            f"stopped by {what} after step {step} ({where}); run the same command with "
            "--resume to continue from it"
        )

    @property
    def signal_name(self) -> str:
        """``"SIGTERM"``, ``"SIGINT"``, ..."""
        try:
            return signal.Signals(self.signal_number).name
        except ValueError:
            return f"signal {self.signal_number}"

    @property
    def exit_status(self) -> int:
        """The status a command stopped this way exits with: ``128 + signal number``."""
        return 128 + self.signal_number


class InterruptRequest:
    """Whether a signal asked training to stop after the current step.

    Args:
        stop_signals: Signals that stop training after the step, besides SIGINT (Ctrl-C).
            (Default: SIGTERM and SIGUSR1)
    """

    def __init__(
        self, stop_signals: Sequence[str | int] | str | None = DEFAULT_STOP_SIGNALS
    ) -> None:
        if isinstance(stop_signals, str) or stop_signals is None:
            self.stop_signals = parse_stop_signals(stop_signals)
        else:
            self.stop_signals = tuple(
                signal.Signals(s) if isinstance(s, int) else parse_stop_signals([s])[0]
                for s in stop_signals
            )
        self.signal_number = 0

    @property
    def requested(self) -> bool:
        """Whether this process received a stop request."""
        return self.signal_number != 0

    @contextlib.contextmanager
    def installed(self, enabled: bool = True, processes: int = 1) -> Iterator[InterruptRequest]:
        """Catch SIGINT and the stop signals while the block runs: when ``enabled`` (there is
        a folder to save to), in the main thread; else nothing changes. ``processes`` is
        kept for callers; every process installs its handlers (see :meth:`agreed`)."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield self
            return
        handled = (signal.SIGINT, *self.stop_signals)
        previous = {signum: signal.getsignal(signum) for signum in handled}

        def handler(signum: int, frame: Any) -> None:
            if self.signal_number:
                if signum == signal.SIGINT:  # the second Ctrl-C: stop now
                    raise KeyboardInterrupt
                return
            self.signal_number = int(signum)
            name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
            logger.warning(
                "%s: finishing this step, then saving a checkpoint to resume from%s",
                name,
                " (Ctrl-C again to stop at once, without it)" if signum == signal.SIGINT else "",
            )

        for signum in handled:
            signal.signal(signum, handler)
        try:
            yield self
        finally:
            for signum, old in previous.items():
                signal.signal(signum, old)
            self.signal_number = 0

    def agreed(self, accelerator: Any) -> int:
        """The signal every process agrees to stop on after this step (0: go on).

        One process: its own request. Several: the largest signal number any of them
        received, by one all-reduce of one integer, which every process must call after the
        same step.
        """
        if accelerator.num_processes == 1:
            return self.signal_number
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.signal_number], dtype=torch.int64, device=accelerator.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        if agreed and not self.signal_number:
            logger.warning(
                "process %d: another process received %s; stopping after this step with it",
                accelerator.process_index,
                signal.Signals(agreed).name,
            )
        return agreed


__all__ = [
    "DEFAULT_STOP_SIGNALS",
    "InterruptRequest",
    "TrainingInterrupted",
    "parse_stop_signals",
]
