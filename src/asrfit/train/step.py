"""One optimizer step of :class:`~asrfit.train.trainer.MemoryEfficientTrainer`.

A window of micro-batches runs forward and backward with each loss scaled by the window's
total units (summed over processes), so the accumulated gradient equals one big batch's;
an out-of-memory error splits the failing micro-batch inside the same step
(:func:`~asrfit.train.oom.run_with_recovery`); then clipping, the optimizer and the
schedule step, and the memory monitor records the step.

The trainer builds one :class:`OptimizerStep` with what stays fixed (accelerator, model,
optimizer, loss and units functions, limits and counters) and calls :meth:`OptimizerStep.run`
once per window; what changes between steps it reads, and advances, through
:class:`StepState`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from asrfit.errors import ConfigError
from asrfit.models.losses import LossFn, UnitsFn
from asrfit.train.batching import DataInfo
from asrfit.train.guards import MicroBatchLimits, NonFiniteGuard, presplit, total_grad_norm
from asrfit.train.oom import (
    BucketOOMCounter,
    OOMEvent,
    describe_batch,
    lower_bucket_limit,
    mark_backward,
    run_with_recovery,
    split_batch,
)
from asrfit.train.preflight import predict_batch_bytes
from asrfit.train.records import MicroBatch, StepRecord

if TYPE_CHECKING:  # accelerate, the plan and the config are imported when they are used
    from accelerate import Accelerator

    from asrfit.plan.plan import Plan
    from asrfit.train.config import TrainingConfig
    from asrfit.train.monitor import MemoryMonitor


class StepState(Protocol):
    """What a step reads of the trainer that changes after construction, and what it advances.

    :class:`~asrfit.train.trainer.MemoryEfficientTrainer` is one. ``train()`` sets
    ``scheduler``, ``monitor``, ``dataset`` and ``info``; a resume and the pre-flight replace
    ``plan``, which a step lowers after repeated OOMs; the loop sets ``epoch``; a step
    advances ``global_step`` by one.
    """

    plan: Plan | None
    scheduler: torch.optim.lr_scheduler.LambdaLR | None
    monitor: MemoryMonitor | None
    dataset: Any
    info: DataInfo
    global_step: int
    epoch: int


class OptimizerStep:
    """Runs the trainer's optimizer steps, one window of micro-batches per :meth:`run`.

    Args:
        state: The trainer's changing state, read at each step (see :class:`StepState`).
        accelerator: The trainer's ``Accelerator``.
        model: The prepared (possibly DDP-wrapped) model.
        optimizer: The prepared optimizer.
        loss_fn: ``loss_fn(model, batch) -> (loss_sum, units)``.
        units_fn: ``units_fn(batch) -> units``, counted before the forward pass.
        collate_fn: ``collate(samples) -> batch``, to re-collate the halves of a split.
        config: The training config (``max_grad_norm``).
        micro_limits: Per-bucket piece limits, lowered after repeated OOMs.
        oom_counter: OOMs per bucket, which decide when a limit is lowered.
        nonfinite: Counts steps skipped for a NaN/inf loss or gradient.
        oom_events: Where each recovered OOM is appended.
        deepspeed_steps: DeepSpeed's ``gradient_accumulation_steps``; 0 without DeepSpeed.
        out_dir: Where a lowered plan is saved (main process), or None.
    """

    def __init__(
        self,
        state: StepState,
        *,
        accelerator: Accelerator,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        units_fn: UnitsFn,
        collate_fn: Callable[[list[Any]], Any],
        config: TrainingConfig,
        micro_limits: MicroBatchLimits,
        oom_counter: BucketOOMCounter,
        nonfinite: NonFiniteGuard,
        oom_events: list[OOMEvent],
        deepspeed_steps: int,
        out_dir: Path | None,
    ) -> None:
        self.state = state
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.loss_fn, self.units_fn, self.collate_fn = loss_fn, units_fn, collate_fn
        self.config, self.micro_limits, self.oom_counter = config, micro_limits, oom_counter
        self.nonfinite, self.oom_events = nonfinite, oom_events
        self._deepspeed_steps, self.out_dir = deepspeed_steps, out_dir

    def _predicted_bytes(self, micro: MicroBatch) -> int | None:
        plan, info = self.state.plan, self.state.info
        if plan is None or info.durations is None or micro.indices is None:
            return None
        return predict_batch_bytes(plan, micro.indices, info.durations, info.label_lengths)

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
        dataset = self.state.dataset
        if micro.indices is not None and dataset is not None:
            parts = [micro.indices[: sizes[0]], micro.indices[sizes[0] :]]
            a, b = (self.collate_fn([dataset[i] for i in part]) for part in parts)
        else:
            parts = [None, None]
            a, b = split_batch(micro.batch, sizes)
        return (
            MicroBatch(a, parts[0], micro.bucket, micro.origin),
            MicroBatch(b, parts[1], micro.bucket, micro.origin),
        )

    def run(self, window: list[MicroBatch]) -> tuple[StepRecord, dict[str, Any]]:
        """One optimizer step over a window of micro-batches; advances ``global_step``.

        Returns:
            The step's record and the memory monitor's record of it.

        Raises:
            ConfigError: The window has no loss units, or ``units_fn`` disagrees with ``loss_fn``.
            BatchTooLargeError: A single utterance ran out of memory.
            NonFiniteLossError: Too many steps in a row had a NaN/inf loss or gradient.
        """
        state, acc = self.state, self.accelerator
        scheduler, monitor = state.scheduler, state.monitor
        if scheduler is None or monitor is None:
            raise RuntimeError("OptimizerStep.run() needs the scheduler and monitor train() sets.")
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
        monitor.start_step()
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
                scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        state.global_step += 1
        self.nonfinite.record(
            cause if bad else None,
            state.global_step,
            "; ".join(where_of(state.dataset, m) for m in window),
        )
        ok_sizes: dict[int, int] = {}
        for piece in report.pieces:
            ok_sizes[piece.origin] = max(ok_sizes.get(piece.origin, 0), piece.size)
        local_events = [(piece.bucket, ok_sizes[piece.origin]) for piece, *_ in report.events]
        loss_sum = sum(result[0] for result in report.results)
        global_loss, n_events = self._reduce_sum([loss_sum, float(len(local_events))])
        for piece, size, phase, halves in report.events:
            self.oom_events.append(OOMEvent(state.global_step, piece.bucket, size, phase, halves))
        if n_events:
            self._count_ooms(local_events)
        heaviest = max(window, key=lambda m: (self._predicted_bytes(m) or 0, m.size))
        memory = monitor.end_step(
            state.global_step,
            bucket=heaviest.bucket,
            predicted_bytes=self._predicted_bytes(heaviest),
            batch_size=heaviest.size,
        )
        has_indices = all(m.indices is not None for m in window)
        record = StepRecord(
            step=state.global_step,
            epoch=state.epoch,
            loss=global_loss / global_units,
            units=int(global_units),
            utterances=sum(m.size for m in window),
            micro_batch_sizes=[m.size for m in window],
            indices=[list(m.indices) for m in window] if has_indices else None,
            learning_rate=learning_rate,
        )
        return record, memory

    def _count_ooms(self, local_events: list[tuple[int | None, int]]) -> None:
        """Lower a bucket's limit after ``oom_limit`` OOMs in it (the same on every process)."""
        events = local_events
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            events = [e for per_rank in gather_object([local_events]) for e in per_rank]
        for bucket, ok_size in events:
            plan = self.state.plan
            if not self.oom_counter.record(bucket, ok_size) or plan is None:
                continue
            current = self.micro_limits.limits.get(bucket, plan.buckets[bucket].batch_size)
            new = self.oom_counter.new_limit(bucket, current)
            if new is not None:
                # the sampler keeps its batches (each step keeps its utterances): the bucket's
                # micro-batches run in pieces of at most `new` from now on
                self.micro_limits.lower(bucket, new)
                self.state.plan = lower_bucket_limit(
                    plan,
                    bucket,
                    new,
                    sampler=None,
                    out_dir=self.out_dir if self.accelerator.is_main_process else None,
                    oom_count=self.oom_counter.oom_limit,
                )


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
