"""One optimizer step of :class:`~asrfit.train.trainer.MemoryEfficientTrainer`.

A window of micro-batches runs forward and backward with each loss scaled by the window's
total units (summed over processes), so the accumulated gradient equals one big batch's;
an out-of-memory error splits the failing micro-batch inside the same step
(:func:`~asrfit.train.oom.run_with_recovery`); then clipping, the optimizer and the
schedule step, and the memory monitor records the step.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from asrfit.errors import ConfigError
from asrfit.train.guards import NonFiniteGuard, presplit, total_grad_norm
from asrfit.train.interrupt import TrainingInterrupted
from asrfit.train.oom import (
    OOMEvent,
    describe_batch,
    lower_bucket_limit,
    mark_backward,
    run_with_recovery,
    split_batch,
)
from asrfit.train.preflight import predict_batch_bytes
from asrfit.train.records import MicroBatch, StepRecord


class StepMixin:
    """The optimizer-step half of the trainer; it reads the trainer's attributes.

    Uses ``accelerator``, ``model``, ``optimizer``, ``scheduler``, ``loss_fn``, ``units_fn``,
    ``collate_fn``, ``dataset``, ``config``, ``plan``, ``monitor``, ``sampler``,
    ``info``, ``oom_counter``, ``oom_events``, ``global_step``, ``epoch`` and ``out_dir``, all set by
    the trainer's ``__init__``.
    """

    accelerator: Any
    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    loss_fn: Any
    units_fn: Any
    collate_fn: Any
    dataset: Any
    config: Any
    plan: Any
    monitor: Any
    sampler: Any
    oom_counter: Any
    info: Any
    oom_events: list[OOMEvent]
    global_step: int
    epoch: int
    out_dir: Any
    _deepspeed_steps: int
    micro_limits: Any
    interrupts: Any
    epoch_loss_total: float
    epoch_units_total: int
    _last_saved_step: int
    _last_saved_path: Any
    nonfinite: Any
    _last_memory: dict[str, Any]

    @property
    def epoch_mean_loss(self) -> float:
        """Mean loss per unit over the current epoch's steps (the last epoch's, between
        epochs), those before a resume included; NaN before its first step."""
        if not self.epoch_units_total:
            return math.nan
        return self.epoch_loss_total / self.epoch_units_total

    def _stop_if_signalled(self) -> None:
        """After a step: when Ctrl-C or a stop signal reached any process (every process
        agrees, :meth:`~asrfit.train.interrupt.InterruptRequest.agreed`), checkpoint this
        step (unless just done) and raise :class:`TrainingInterrupted` on every process."""
        stop = self.interrupts.agreed(self.accelerator) if self.out_dir is not None else 0
        if stop:
            saved = self._last_saved_step == self.global_step
            path = self._last_saved_path if saved else self.save_checkpoint()
            raise TrainingInterrupted(self.global_step, path, stop)

    def _predicted_bytes(self, micro: MicroBatch) -> int | None:
        if self.plan is None or self.info.durations is None or micro.indices is None:
            return None
        return predict_batch_bytes(
            self.plan, micro.indices, self.info.durations, self.info.label_lengths
        )

    # ------------------------------------------------------------------ the loop

    def _reduce_sum(self, values: list[float]) -> list[float]:
        if self.accelerator.num_processes == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, "sum").tolist()

    def _forward_backward(self, micro: MicroBatch, sync: bool, scale: float) -> tuple[float, int]:
        from accelerate.utils import send_to_device

        acc = self.accelerator
        with contextlib.nullcontext() if sync else acc.no_sync(self.model):
            loss_sum, units = self.loss_fn(self.model, send_to_device(micro.batch, acc.device))
            expected = int(self.units_fn(micro.batch))
            if int(units) != expected:
                raise ConfigError(
                    f"loss_fn returned units={int(units)} for a batch ({describe_batch(micro.batch)}) "
                    f"for which units_fn counted {expected}; pass units_fn= that counts the same "
                    "units as loss_fn (utterances by default; e.g. label tokens)."
                )
            if self._deepspeed_steps:  # DeepSpeed steps at the boundary we mark and divides
                acc.gradient_state._set_sync_gradients(sync)  # the loss by its own accumulation
                scale *= self._deepspeed_steps
            try:
                acc.backward(loss_sum * scale)
            except Exception as exc:
                mark_backward(exc)
                raise
            finally:
                if self._deepspeed_steps:
                    acc.gradient_state._set_sync_gradients(True)
        return float(loss_sum.detach()), expected

    def _split(self, micro: MicroBatch, sizes: tuple[int, int]) -> tuple[MicroBatch, MicroBatch]:
        """Halves of a micro-batch: re-collated from the dataset (less padding) when possible."""
        if micro.indices is not None and self.dataset is not None:
            parts = [micro.indices[: sizes[0]], micro.indices[sizes[0] :]]
            a, b = (self.collate_fn([self.dataset[i] for i in part]) for part in parts)
        else:
            parts = [None, None]
            a, b = split_batch(micro.batch, sizes)
        return (
            MicroBatch(a, parts[0], micro.bucket, micro.origin),
            MicroBatch(b, parts[1], micro.bucket, micro.origin),
        )

    def _step(self, window: list[MicroBatch]) -> StepRecord:
        acc = self.accelerator
        for position, micro in enumerate(window):
            micro.origin = position
        window = presplit(
            window,
            self.micro_limits,
            bucket_of=lambda m: m.bucket,
            size_of=lambda m: m.size,
            split=self._split,
        )
        local_units = sum(int(self.units_fn(m.batch)) for m in window)
        (global_units,) = self._reduce_sum([float(local_units)])
        if global_units <= 0:
            raise ConfigError("an optimizer step has 0 loss units (empty labels?); check units_fn.")
        scale = acc.num_processes / global_units  # DDP averages over processes
        self.monitor.start_step()
        learning_rate = self.optimizer.param_groups[0]["lr"]
        report = run_with_recovery(
            window,
            lambda micro, sync: self._forward_backward(micro, sync, scale),
            size_of=lambda micro: micro.size,
            split=self._split,
            restart=lambda: self.optimizer.zero_grad(set_to_none=True),
            describe=lambda micro: describe_batch(micro.batch),
        )
        local_loss = sum(result[0] for result in report.results)
        if self.config.max_grad_norm > 0:
            norm = float(acc.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
        else:
            norm = total_grad_norm(self.model.parameters())
        cause = NonFiniteGuard.cause(local_loss, None if acc.scaler is not None else norm)
        (bad,) = self._reduce_sum([0.0 if cause is None else 1.0])  # every process skips together
        if bad:
            cause = cause or "loss or gradients (on another process)"
        else:
            self.optimizer.step()
        with warnings.catch_warnings():  # a skipped step still advances the schedule
            warnings.filterwarnings(
                "ignore", message="Detected call of `lr_scheduler.step", category=UserWarning
            )
            if not acc.optimizer_step_was_skipped:
                self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.nonfinite.record(
            cause if bad else None,
            self.global_step,
            "; ".join(where_of(self.dataset, m) for m in window),
        )
        ok_sizes: dict[int, int] = {}
        for piece in report.pieces:
            ok_sizes[piece.origin] = max(ok_sizes.get(piece.origin, 0), piece.size)
        local_events = [(piece.bucket, ok_sizes[piece.origin]) for piece, *_ in report.events]
        loss_sum = sum(result[0] for result in report.results)
        global_loss, n_events = self._reduce_sum([loss_sum, float(len(local_events))])
        for piece, size, phase, halves in report.events:
            self.oom_events.append(OOMEvent(self.global_step, piece.bucket, size, phase, halves))
        if n_events:
            self._count_ooms(local_events)
        heaviest = max(window, key=lambda m: (self._predicted_bytes(m) or 0, m.size))
        self._last_memory = self.monitor.end_step(
            self.global_step,
            bucket=heaviest.bucket,
            predicted_bytes=self._predicted_bytes(heaviest),
            batch_size=heaviest.size,
        )
        has_indices = all(m.indices is not None for m in window)
        return StepRecord(
            step=self.global_step,
            epoch=self.epoch,
            loss=global_loss / global_units,
            units=int(global_units),
            utterances=sum(m.size for m in window),
            micro_batch_sizes=[m.size for m in window],
            indices=[list(m.indices) for m in window] if has_indices else None,
            learning_rate=learning_rate,
        )

    def _count_ooms(self, local_events: list[tuple[int | None, int]]) -> None:
        """Lower a bucket's limit after ``oom_limit`` OOMs in it (the same on every process)."""
        events = local_events
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            events = [e for per_rank in gather_object([local_events]) for e in per_rank]
        for bucket, ok_size in events:
            if not self.oom_counter.record(bucket, ok_size) or self.plan is None:
                continue
            current = self.micro_limits.limits.get(bucket, self.plan.buckets[bucket].batch_size)
            new = self.oom_counter.new_limit(bucket, current)
            if new is not None:
                # the sampler keeps its batches (each step keeps its utterances): the bucket's
                # micro-batches run in pieces of at most `new` from now on
                self.micro_limits.lower(bucket, new)
                self.plan = lower_bucket_limit(
                    self.plan,
                    bucket,
                    new,
                    sampler=None,
                    out_dir=self.out_dir if self.accelerator.is_main_process else None,
                    oom_count=self.oom_counter.oom_limit,
                )


def length_of(data: Any) -> int | None:
    """``len(data)``, or None for data without a length."""
    try:
        return len(data)
    except TypeError:
        return None


def first_given(*values: Any) -> Any:
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


def skip_batches(data: Iterable[Any], skip: int) -> Iterator[MicroBatch]:
    """The batches of ``data`` after its first ``skip``, as micro-batches."""
    for position, batch in enumerate(data):
        if position >= skip:
            yield MicroBatch(batch)


def set_dataset_epoch(dataset: Any, epoch: int) -> None:
    """``dataset.set_epoch(epoch)`` when it (or the dataset a ``Subset`` wraps) has it."""
    while dataset is not None:
        method = getattr(dataset, "set_epoch", None)
        if callable(method):
            method(epoch)
            return
        dataset = getattr(dataset, "dataset", None)


def where_of(dataset: Any, micro: MicroBatch) -> str:
    """Which utterances a micro-batch holds, for messages."""
    if micro.indices is None:
        return f"a batch of {micro.size}"
    base, indices = dataset, list(micro.indices)
    while base is not None and hasattr(base, "indices") and hasattr(base, "dataset"):  # Subset
        indices, base = [base.indices[i] for i in indices], base.dataset
    utterances = getattr(base, "utterances", None)
    if utterances is not None:
        return ", ".join(getattr(utterances[i], "where", str(i)) for i in indices[:4]) + (
            " ..." if len(indices) > 4 else ""
        )
    return f"indices {indices[:8]}"
