"""Progress of a ``train()`` call: the bar, a log line every few steps, the listeners' events
and the closing summary."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from asrfit.train.events import StepEvent
from asrfit.train.records import GIB, StepRecord, TrainSummary

logger = logging.getLogger(__name__)


class ProgressReport:
    """Progress bar, a log line every few steps, and the summary of one ``train()`` call.

    Args:
        total_steps: Steps the run ends at (None: unknown).
        initial_step: Steps done before this call (after a resume).
        show_bar: Show a tqdm bar (the main process).
        log: Write log lines (the main process).
        log_every_steps: Steps between log lines.
        durations: Seconds per utterance, for audio seconds per second.
        listeners: Run listeners told about every step (:mod:`asrfit.train.events`).
    """

    def __init__(
        self,
        *,
        total_steps: int | None,
        initial_step: int,
        show_bar: bool,
        log: bool,
        log_every_steps: int,
        durations: Any = None,
        listeners: Any = (),
    ) -> None:
        self.bar = None
        if show_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True
            )
        self.log, self.log_every_steps, self.durations = log, log_every_steps, durations
        self.initial_step, self.total_steps = initial_step, total_steps
        self.listeners = list(listeners)
        self.started = time.perf_counter()
        self.utterances, self.audio_seconds = 0, 0.0
        self.loss_total, self.units_total = 0.0, 0

    def update(
        self,
        record: StepRecord,
        peak_memory_bytes: int | None = None,
        memory: dict[str, Any] | None = None,
    ) -> StepEvent:
        """Count a step; refresh the bar; log every ``log_every_steps`` steps.

        Args:
            record: The step.
            peak_memory_bytes: Its measured peak. (Default: ``memory["peak_reserved_bytes"]``)
            memory: The memory monitor's record of the step (for the prediction).

        Returns:
            The step as listeners see it.
        """
        memory = memory or {}
        if peak_memory_bytes is None:
            peak_memory_bytes = int(memory.get("peak_reserved_bytes", 0))
        self.utterances += record.utterances
        step_audio = 0.0
        if self.durations is not None and record.indices is not None:
            step_audio = float(sum(self.durations[i] for mb in record.indices for i in mb))
            self.audio_seconds += step_audio
        self.loss_total += record.loss * record.units
        self.units_total += record.units
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        memory_gib = peak_memory_bytes / GIB
        stats = {
            "loss": f"{record.loss:.4f}",
            "utt/s": f"{self.utterances / elapsed:.1f}",
            "mem": f"{memory_gib:.2f}G",
        }
        if self.audio_seconds:
            stats["audio s/s"] = f"{self.audio_seconds / elapsed:.1f}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(stats, refresh=False)
        if self.log and record.step % self.log_every_steps == 0:
            logger.info(
                "step %d: loss %.4f, batch %d utterances %s, lr %.3g, peak memory %.2f GiB",
                record.step,
                record.loss,
                record.utterances,
                record.micro_batch_sizes,
                record.learning_rate,
                memory_gib,
            )
        done = record.step - self.initial_step
        eta = None
        if self.total_steps is not None and done > 0:
            eta = max(0, self.total_steps - record.step) * elapsed / done
        event = StepEvent(
            step=record.step,
            total_steps=self.total_steps,
            epoch=record.epoch,
            loss=record.loss,
            learning_rate=record.learning_rate,
            utterances=record.utterances,
            audio_seconds=step_audio,
            elapsed_seconds=elapsed,
            audio_seconds_per_second=self.audio_seconds / elapsed,
            eta_seconds=eta,
            predicted_bytes=memory.get("predicted_bytes"),
            measured_bytes=peak_memory_bytes,
            memory_source=str(memory.get("source", "")),
        )
        for listener in self.listeners:
            listener.on_step(event)
        return event

    def finish(
        self, *, steps: int, epochs: int, peak_memory_bytes: int, oom_recoveries: int
    ) -> TrainSummary:
        """Close the bar, log the summary and return it."""
        if self.bar is not None:
            self.bar.close()
        summary = TrainSummary(
            steps=steps,
            epochs=epochs,
            utterances=self.utterances,
            audio_seconds=self.audio_seconds,
            wall_seconds=time.perf_counter() - self.started,
            peak_memory_bytes=peak_memory_bytes,
            mean_loss=self.loss_total / self.units_total if self.units_total else math.nan,
            oom_recoveries=oom_recoveries,
        )
        if self.log:
            audio = f", {self.audio_seconds / 3600:.3f} h of audio" if self.audio_seconds else ""
            logger.info(
                "trained %d steps (%d utterances%s) in %.1f s; peak memory %.2f GiB; "
                "mean loss %.4f; %d OOM recoveries.",
                steps - self.initial_step,
                self.utterances,
                audio,
                summary.wall_seconds,
                peak_memory_bytes / GIB,
                summary.mean_loss,
                oom_recoveries,
            )
        return summary
