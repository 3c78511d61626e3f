"""``MemoryEfficientTrainer``: train on a plan with Accelerate, exactly accumulated, OOM-safe.

One optimizer step takes a *window* of ``gradient_accumulation_steps`` micro-batches, which
may differ in size (the memory-budget sampler's buckets). The model-specific loss is
``loss_fn(model, batch) -> (loss_sum, units)``: the loss summed over the batch's
normalisation units (utterances, tokens or frames) and their number. Before running the
window the trainer counts its units with ``units_fn`` (summed over all processes), then
back-propagates ``loss_sum x world_size / total_units`` for each micro-batch, so the
accumulated (and, under DDP, averaged) gradient is the gradient of the mean loss over the
whole window on all processes: the same as one big batch, whatever the micro-batch sizes.
Gradients synchronise across processes only on the window's last micro-batch
(``accelerator.no_sync`` before). Accelerate's ``accumulate()``, which divides by the number
of micro-batches, is not used.

Around that: mixed precision (from the plan's setup, else the config), gradient clipping, a
linear warm-up then linear decay schedule, gradient checkpointing, out-of-memory recovery
(:mod:`asrfit.train.oom`), the memory monitor (:mod:`asrfit.train.monitor`), a pre-flight
run of the most memory-hungry batches (:mod:`asrfit.train.preflight`) and exact resume
(:mod:`asrfit.train.checkpoint`; also at Ctrl-C and at a preemption's SIGTERM or SIGUSR1,
:mod:`asrfit.train.interrupt`). ZeRO plans
run under DeepSpeed through ``accelerate.DeepSpeedPlugin`` (not tested here: DeepSpeed counts
micro-batches itself, which a variable number per step may not suit).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asrfit.errors import ConfigError, MissingDependencyError
from asrfit.models.losses import LossFn, batch_size_of, default_loss_fn
from asrfit.train import checkpoint as ckpt
from asrfit.train.batching import (
    DataInfo,
    SkipFirst,
    build_batch_sampler,
    is_map_style,
    length_of,
    load_batches,
    pad_collate,
    sampler_info,
    set_dataset_epoch,
    skip_batches,
)
from asrfit.train.engines import memory_budget_bytes, prepare_engines
from asrfit.train.guards import MicroBatchLimits, NonFiniteGuard
from asrfit.train.interrupt import DEFAULT_STOP_SIGNALS, InterruptRequest, TrainingInterrupted
from asrfit.train.oom import BucketOOMCounter, OOMEvent
from asrfit.train.preflight import PreflightResult, preflight_trainer
from asrfit.train.preflight_limits import apply_preflight
from asrfit.train.progress import ProgressReport
from asrfit.train.records import MicroBatch, StepRecord, TrainSummary, windows
from asrfit.train.schedule import warmup_schedule
from asrfit.train.step import OptimizerStep
from asrfit.utils.io import Pathlike

if TYPE_CHECKING:  # the plan and the config import scipy and transformers: only when used
    from asrfit.plan.plan import Plan
    from asrfit.train.config import TrainingConfig
    from asrfit.train.monitor import MemoryMonitor

logger = logging.getLogger(__name__)


class MemoryEfficientTrainer:
    """Train a model on a plan (or the seed's config) with Accelerate.

    Where the plan and the config disagree, the plan decides precision, gradient
    checkpointing, optimizer and ZeRO; the config decides learning rate, warm-up, clipping,
    accumulation and epochs (``TrainingConfig.from_plan`` makes them agree).

    Args:
        model: The model (an ``nn.Module``).
        config: A ``TrainingConfig``. (Default: ``TrainingConfig.from_plan(plan)``, or
            ``TrainingConfig()`` without a plan)
        plan: An asrfit ``Plan``: buckets for the sampler, the setup, the predictions.
        loss_fn: ``loss_fn(model, batch) -> (loss_sum, units)``; ``model`` is the prepared
            (possibly DDP-wrapped) model. (Default: :func:`~asrfit.models.losses.default_loss_fn`)
        units_fn: ``units_fn(batch) -> units``, counted before the forward pass; must give what
            ``loss_fn`` returns as units (checked). (Default: utterances in the batch)
        optimizer: Your optimizer. (Default: from the plan's setup or the config's ``optim``)
        out_dir: Checkpoints, ``memory.jsonl``, adjusted plan, failed pre-flight batch.
        collate_fn: ``collate(samples) -> batch`` for map-style datasets.
            (Default: :func:`~asrfit.train.batching.pad_collate`)
        oom_limit: OOMs in one bucket before its batch limit is lowered. (Default: 2)
        keep_last: Checkpoints kept. (Default: 3)
        save_every_steps: Checkpoint every this many steps; with ``out_dir`` a last one is
            written at the end of :meth:`train` either way. (Default: None)
        save_every_minutes: Checkpoint when this many minutes passed since the last one
            (checked after each step). (Default: None)
        max_nonfinite_steps: Steps in a row with a NaN/inf loss or gradient (each skipped)
            that stop the run, see :mod:`asrfit.train.guards`. (Default: 5)
        preflight: Run the pessimistic batches before the first step (needs the durations
            or a map-style dataset). (Default: True)
        progress: Show a progress bar (main process). (Default: True)
        listeners: Run listeners told every step, main process (:mod:`asrfit.train.events`).
        log_every_steps: Log a line every this many steps. (Default: 10)
        seed: Sampler shuffle seed. (Default: 0)
        expandable_segments: Override the plan's ``expandable_segments``; without a plan
            it is on. (Default: None)
        cpu: Train on the CPU even when CUDA is available. (Default: False)
        stop_signals: Signals that, like Ctrl-C, stop training after the step in progress
            with a checkpoint (with ``out_dir``; every process agrees on the step), see
            :mod:`asrfit.train.interrupt`. (Default: SIGTERM and SIGUSR1)

    Raises:
        MissingDependencyError: The plan needs DeepSpeed (or bitsandbytes) and it is not installed.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainingConfig | None = None,
        *,
        plan: Plan | None = None,
        loss_fn: LossFn | None = None,
        units_fn: Callable[[Any], int] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        out_dir: Pathlike | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        oom_limit: int = 2,
        keep_last: int = 3,
        save_every_steps: int | None = None,
        save_every_minutes: float | None = None,
        max_nonfinite_steps: int = 5,
        preflight: bool = True,
        progress: bool = True,
        log_every_steps: int = 10,
        seed: int = 0,
        expandable_segments: bool | None = None,
        cpu: bool = False,
        listeners: Sequence[Any] = (),
        stop_signals: Sequence[str | int] | str | None = DEFAULT_STOP_SIGNALS,
    ) -> None:
        if config is None:
            from asrfit.train.config import TrainingConfig

            config = TrainingConfig.from_plan(plan) if plan is not None else TrainingConfig()
        self.config, self.plan = config, plan
        self.loss_fn = loss_fn or default_loss_fn
        self.units_fn = units_fn or batch_size_of
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.collate_fn = collate_fn or pad_collate
        self.keep_last, self.save_every_steps = keep_last, save_every_steps
        self.listeners = listeners
        self.preflight_enabled, self.progress = preflight, progress
        self.log_every_steps, self.seed = max(1, log_every_steps), seed
        self.oom_counter = BucketOOMCounter(oom_limit)
        self.save_every_minutes = save_every_minutes
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)
        self.micro_limits = MicroBatchLimits()
        self._last_save_time, self._last_saved_step = time.monotonic(), -1
        self._last_saved_path: Path | None = None
        for parameter in model.parameters():  # a trainer never inherits gradients left behind
            parameter.grad = None
        self.accumulation_steps = config.gradient_accumulation_steps

        engines = prepare_engines(
            model, optimizer, plan, config, cpu=cpu, expandable_segments=expandable_segments
        )
        self.accelerator = engines.accelerator
        self.model, self.optimizer = engines.model, engines.optimizer
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.monitor: MemoryMonitor | None = None
        self.global_step, self.epoch, self.batches_in_epoch = 0, 0, 0
        self.history: list[StepRecord] = []
        self.oom_events: list[OOMEvent] = []
        # Ctrl-C or a stop signal: checkpoint after the step, then stop
        self.interrupts = InterruptRequest(stop_signals)
        # the epoch's loss x units and units, checkpointed: a resumed mean covers the whole epoch
        self.epoch_loss_total, self.epoch_units_total = 0.0, 0
        self.preflight_results: list[PreflightResult] = []
        self.preflight_notes: list[str] = []  # what the pre-flight changed or found off
        self.info = DataInfo()
        self._sampler_cache: dict[int, tuple[Any, DataInfo]] = {}
        self.sampler: Any = None
        self.dataset: Any = None
        self.epoch_start_state: Any = None
        self._stepper = OptimizerStep(
            self,
            accelerator=self.accelerator,
            model=self.model,
            optimizer=self.optimizer,
            loss_fn=self.loss_fn,
            units_fn=self.units_fn,
            collate_fn=self.collate_fn,
            config=config,
            micro_limits=self.micro_limits,
            oom_counter=self.oom_counter,
            nonfinite=self.nonfinite,
            oom_events=self.oom_events,
            deepspeed_steps=engines.deepspeed_steps,
            out_dir=self.out_dir,
        )
        logger.info(
            "trainer: %s on %s x %d, mixed precision %s%s, %d micro-batches per step, lr %g",
            type(model).__name__,
            self.accelerator.device,
            self.accelerator.num_processes,
            engines.mixed_precision,
            " (pure bf16 weights)" if engines.pure_bf16 else "",
            self.accumulation_steps,
            config.learning_rate,
        )

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        """The model without the DDP/DeepSpeed wrapper (for attributes and saving)."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def checkpoint_dir(self) -> Path | None:
        """``out_dir/checkpoints``."""
        return None if self.out_dir is None else self.out_dir / "checkpoints"

    @property
    def epoch_mean_loss(self) -> float:
        """Mean loss per unit over the current epoch's steps (the last epoch's, between
        epochs), those before a resume included; NaN before its first step."""
        if not self.epoch_units_total:
            return math.nan
        return self.epoch_loss_total / self.epoch_units_total

    # ------------------------------------------------------------------ data
    def make_sampler(
        self,
        dataset: Any,
        *,
        durations: Sequence[float] | None = None,
        label_lengths: Sequence[int] | None = None,
    ) -> Any:
        """The batch sampler :meth:`train` uses for a map-style dataset (cached per dataset).

        See :func:`~asrfit.train.batching.build_batch_sampler`: a ``MemoryBudgetSampler``
        with a plan, else the seed's analytic rule; sharded by process.
        """
        cached = self._sampler_cache.get(id(dataset))
        if cached is None:
            parameter_bytes = sum(
                p.numel() * p.element_size() for p in self.unwrapped_model.parameters()
            )
            cached = build_batch_sampler(
                dataset,
                plan=self.plan,
                config=self.config,
                parameter_bytes=parameter_bytes,
                durations=durations,
                label_lengths=label_lengths,
                seed=self.seed,
                num_replicas=self.accelerator.num_processes,
                rank=self.accelerator.process_index,
            )
            self._sampler_cache[id(dataset)] = cached
            self._sampler_cache[id(cached[0])] = cached
        return cached[0]

    def _resolve_data(self, data: Any, dataset: Any, durations: Any, label_lengths: Any) -> Any:
        """Return the batch sampler (None for a data loader); set ``dataset`` and ``info``."""
        if dataset is None and is_map_style(data):
            dataset, data = (
                data,
                self.make_sampler(data, durations=durations, label_lengths=label_lengths),
            )
        self.dataset = dataset
        if dataset is None:
            self.info = DataInfo(durations, label_lengths)
            return None
        known = self._sampler_cache.get(id(data), (None, DataInfo()))[1]
        self.info = sampler_info(data, known, durations, label_lengths)
        replicas = getattr(data, "num_replicas", None)
        if replicas is not None and replicas != self.accelerator.num_processes:
            raise ConfigError(
                f"the sampler is sharded for num_replicas={replicas}, but training runs on "
                f"{self.accelerator.num_processes} processes; build it with "
                "num_replicas=accelerator.num_processes, rank=accelerator.process_index."
            )
        return data

    def train(
        self,
        data: Any,
        *,
        dataset: Any = None,
        epochs: float | None = None,
        max_steps: int | None = None,
        resume_from: Pathlike | None = None,
        durations: Sequence[float] | None = None,
        label_lengths: Sequence[int] | None = None,
    ) -> TrainSummary:
        """Train until ``max_steps`` optimizer steps, or ``epochs`` epochs, are done in total.

        Args:
            data: One of: a batch sampler yielding lists of indices into ``dataset`` (e.g. a
                ``MemoryBudgetSampler``, or a plain list of index lists); a map-style dataset
                that is not a list (the trainer makes the sampler, see :meth:`make_sampler`);
                or a ``DataLoader``, list or other iterable of collated batches (resume then
                replays the epoch's first batches).
            dataset: The map-style dataset ``data`` samples from, when ``data`` is a sampler.
            epochs: Total epochs; a fraction stops within the last. (Default: ``config.num_train_epochs``)
            max_steps: Total optimizer steps; wins over ``epochs``.
            resume_from: A checkpoint file or folder, or ``"latest"`` (in ``out_dir/checkpoints``).
            durations: Seconds per utterance of the dataset (predictions, pre-flight, audio s/s).
            label_lengths: Labels per utterance (pre-flight's longest transcript).

        Returns:
            A :class:`~asrfit.train.records.TrainSummary`.

        Raises:
            ConfigError: A sampler sharded for another world size, an unusable checkpoint, a
                ``units_fn`` that disagrees with ``loss_fn``, or unknown length without ``max_steps``.
            BatchTooLargeError: The pre-flight, or a single utterance, ran out of memory.
        """
        sampler = self.sampler = self._resolve_data(data, dataset, durations, label_lengths)
        batches = length_of(sampler if sampler is not None else data)
        per_epoch = None if batches is None else math.ceil(batches / self.accumulation_steps)
        epochs = self.config.num_train_epochs if epochs is None else epochs
        total = max_steps
        if total is None and per_epoch is not None:
            total = math.ceil(epochs * per_epoch)
        if total is None and math.isinf(epochs):
            raise ConfigError("train(): give max_steps or epochs for data of unknown length.")
        if self.scheduler is None:
            inner = getattr(self.optimizer, "optimizer", self.optimizer)
            self.scheduler = warmup_schedule(inner, self.config.warmup_steps, total)
        if self.monitor is None:
            from asrfit.train.monitor import MemoryMonitor

            log_dir = self.out_dir
            if log_dir is not None and self.accelerator.num_processes > 1:
                log_dir = log_dir / f"rank{self.accelerator.process_index}"
            budget = memory_budget_bytes(self.plan, self.config, self.accelerator.device)
            self.monitor = MemoryMonitor(budget, device=self.accelerator.device, log_dir=log_dir)
        try:
            resume = None
            if resume_from is not None:
                resume = ckpt.resume_trainer(self, resume_from, sampler)
            elif self.global_step == 0 and self.preflight_enabled and sampler is not None:
                self.preflight()
            with self.interrupts.installed(
                self.out_dir is not None, self.accelerator.num_processes
            ):
                return self._loop(data, sampler, epochs, total, resume)
        except BaseException:
            self.clear_gradients()  # a failed run leaves nothing for the next step to add to
            raise

    def clear_gradients(self) -> None:
        """Drop every gradient of the model (``grad = None``)."""
        self.optimizer.zero_grad(set_to_none=True)
        for parameter in self.model.parameters():
            parameter.grad = None

    def train_epoch(self, dataset: Any, *, durations: Sequence[float] | None = None) -> float:
        """Train one epoch over a map-style dataset of dict samples (the seed's API).

        Samples are collated by ``collate_fn`` (:func:`~asrfit.train.batching.pad_collate`:
        padded to the longest in the batch, ``labels`` with -100). Batches come from
        :meth:`make_sampler`. The LR schedule spans ``config.num_train_epochs`` epochs over
        repeated calls.

        Args:
            dataset: A map-style dataset (``len`` and ``[i]``) of dict samples.
            durations: Seconds per sample. (Default: measured from the samples)

        Returns:
            The epoch's mean loss per unit.
        """
        sampler = self.make_sampler(dataset, durations=durations)
        if self.scheduler is None:
            per_epoch = math.ceil(len(sampler) / self.accumulation_steps)
            self.scheduler = warmup_schedule(
                getattr(self.optimizer, "optimizer", self.optimizer),
                self.config.warmup_steps,
                math.ceil(self.config.num_train_epochs * per_epoch),
            )
        return self.train(sampler, dataset=dataset, epochs=self.epoch + 1).mean_loss

    def preflight(self) -> list[PreflightResult]:
        """Run the pessimistic batches (forward + backward, no step), then lower the limits of
        buckets that held more than predicted (:mod:`asrfit.train.preflight_limits`); what
        changed, and passes far from the plan's time, go to :attr:`preflight_notes`.

        Raises:
            BatchTooLargeError: One ran out of memory (saved to ``out_dir``).
        """
        self.preflight_results = preflight_trainer(self)
        self.preflight_notes = apply_preflight(self, self.preflight_results)
        return self.preflight_results

    def _loop(
        self,
        data: Any,
        sampler: Any,
        epochs: float,
        total: int | None,
        resume: tuple[int, bool] | None,
    ) -> TrainSummary:
        acc = self.accelerator
        start_step = self.global_step
        report = ProgressReport(
            total_steps=total,
            initial_step=start_step,
            show_bar=self.progress and acc.is_local_main_process,
            log=acc.is_main_process,
            listeners=self.listeners if acc.is_main_process else (),
            log_every_steps=self.log_every_steps,
            durations=self.info.durations,
        )
        n_epochs = None if math.isinf(epochs) else math.ceil(epochs)
        done = total is not None and self.global_step >= total
        while not done and (n_epochs is None or self.epoch < n_epochs):
            skip, restored = resume if resume is not None else (0, False)
            resume = None
            if self.batches_in_epoch == 0:
                self.epoch_loss_total, self.epoch_units_total = 0.0, 0
            if sampler is None:
                micro_batches: Iterator[MicroBatch] = skip_batches(data, skip)
            else:
                set_dataset_epoch(self.dataset, self.epoch)
                if not restored:
                    if callable(getattr(sampler, "set_epoch", None)):
                        sampler.set_epoch(self.epoch)
                    if not ckpt.tracks_consumed(sampler):
                        state_dict = getattr(sampler, "state_dict", None)
                        self.epoch_start_state = state_dict() if callable(state_dict) else None
                micro_batches = (
                    MicroBatch(batch, indices, bucket)
                    for indices, batch, bucket in load_batches(
                        self.dataset,
                        SkipFirst(sampler, skip),
                        self.collate_fn,
                        num_workers=self.config.dataloader_num_workers,
                    )
                )
            for window in windows(micro_batches, self.accumulation_steps):
                record, memory = self._stepper.run(window)
                self.batches_in_epoch += len(window)
                self.history.append(record)
                self.epoch_loss_total += record.loss * record.units
                self.epoch_units_total += record.units
                report.update(record, memory=memory)
                if ckpt.save_due(self):
                    self.save_checkpoint()
                self._stop_if_signalled()
                if total is not None and self.global_step >= total:
                    done = True
                    break
            epoch_batches = length_of(sampler if sampler is not None else data)
            if not done or (epoch_batches is not None and self.batches_in_epoch >= epoch_batches):
                self.epoch, self.batches_in_epoch = self.epoch + 1, 0
        saved_now = self._last_saved_step == self.global_step
        if self.out_dir is not None and self.global_step > start_step and not saved_now:
            self.save_checkpoint()
        return report.finish(
            steps=self.global_step,
            epochs=self.epoch,
            peak_memory_bytes=int(self.monitor.summary()["peak_reserved_bytes"]),
            oom_recoveries=len(self.oom_events),
        )

    # ------------------------------------------------------------------ checkpoints
    def _stop_if_signalled(self) -> None:
        """After a step: when Ctrl-C or a stop signal reached any process (every process
        agrees, :meth:`~asrfit.train.interrupt.InterruptRequest.agreed`), checkpoint this
        step (unless just done) and raise :class:`TrainingInterrupted` on every process."""
        stop = self.interrupts.agreed(self.accelerator) if self.out_dir is not None else 0
        if stop:
            saved = self._last_saved_step == self.global_step
            path = self._last_saved_path if saved else self.save_checkpoint()
            raise TrainingInterrupted(self.global_step, path, stop)

    def end_training(self) -> None:
        """Leave the process group (Accelerate's ``end_training``) once no trainer of this
        process trains again. gloo's worker threads outlive it: one of several processes
        exits last with :func:`asrfit.utils.process_exit.exit_process`, not ``sys.exit``."""
        self.accelerator.end_training()

    def save_checkpoint(self) -> Path | None:
        """Checkpoint the current step into ``out_dir/checkpoints`` (every process must call it).

        Returns:
            The file (on the main process; None on the others).

        Raises:
            ConfigError: The trainer has no ``out_dir``.
        """
        path = ckpt.save_trainer_checkpoint(self)
        self._last_saved_step, self._last_save_time = self.global_step, time.monotonic()
        self._last_saved_path = path
        return path


__all__ = ["MemoryEfficientTrainer", "MissingDependencyError", "TrainSummary"]
