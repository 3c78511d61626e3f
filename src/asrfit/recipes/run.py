"""A training run end to end: profile, plan, train (optionally in growing stages), score, save.

``out_dir`` holds::

    plan.json            the plan the run trained with
    vocab.json, ...      the character vocabulary (a Wav2Vec2CTCTokenizer)
    stage1/checkpoints   the trainer's checkpoints of each stage (``--resume`` continues them)
    best/                the best model on dev: save_pretrained + tokenizer + feature
                         extractor config + plan.json (AutoModelForCTC, or for Whisper
                         AutoModelForSpeechSeq2Seq and for Parakeet-TDT AutoModelForTDT, and
                         AutoTokenizer load it; the built-in Conformer's, with its code, loads
                         without asrfit too: models/hub.py)
    run_config.json      the RunConfig (written first, so a running run can be reported)
    report.json, report.md
    steps.jsonl          every step (loss, LR, audio s/s, memory predicted and measured) and
                         every dev score, for ``asrfit report``
    tensorboard/         the same as TensorBoard scalars (when tensorboard is installed)

The model's family decides the loss the trainer normalises (:mod:`asrfit.models.losses`), the
labels (:meth:`~asrfit.recipes.asr_model.ASRModel.label_rules`) and the decoding that scores dev
and test (:func:`~asrfit.recipes.evaluate.transcribe`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.text import CharVocabulary, TextNormalizer
from asrfit.recipes.asr_model import auto_class_for, build_asr_model
from asrfit.recipes.evaluate import evaluate
from asrfit.recipes.run_checks import check_loaded_plan, check_resumed_model, push_to_hub
from asrfit.recipes.run_data import (
    check_skips,
    check_unbatched,
    dataset_profile,
    plan_for,
    prepare_data,
    spec_augment,
)
from asrfit.recipes.run_events import run_listeners
from asrfit.recipes.run_report import (
    CPU_PEAK_KIND,
    EpochRecord,
    RunConfig,
    RunReport,
    predicted_epoch_seconds,
)
from asrfit.recipes.run_safety import (
    RunState,
    long_audio_cap_seconds,
    parse_save_every,
    recover_best,
    save_best,
)
from asrfit.train.events import RunListener
from asrfit.utils.io import atomic_write_text, remove_stale_temporaries

logger = logging.getLogger(__name__)


class AsrRun:
    """One ``asrfit train`` run, a method per stage: :meth:`prepare` (data, vocabulary, model,
    plan), :meth:`train_stage` for each of ``cfg.stages`` (resuming through the trainer's
    checkpoints), :meth:`score` after each epoch, and :meth:`finish` (test set and report).

    Args:
        cfg: What to do.
        listeners: Told about every step and dev score, steps numbered across stages.
    """

    def __init__(self, cfg: RunConfig, listeners: list[RunListener] | None = None) -> None:
        self.cfg = cfg
        self.listeners = list(listeners or [])
        self.started = time.perf_counter()
        self.out = Path(cfg.out_dir)
        self.best_cer: float | None = None
        self.best_wer: float | None = None
        self.epochs: list[EpochRecord] = []
        self.previous: Path | None = None  # the last stage's final checkpoint
        self.peak, self.audio_seconds, self.train_seconds, self.nonfinite = 0, 0.0, 0.0, 0
        self.preflight: list[str] = []  # what each stage's pre-flight lowered or found
        self.trainer: Any = None

    def prepare(self) -> None:
        """Validate the data, build the vocabulary, the model and the datasets; plan (or check
        the plan given); load the run's state when resuming."""
        import transformers

        cfg, out = self.cfg, self.out
        transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars
        torch.manual_seed(cfg.seed)
        out.mkdir(parents=True, exist_ok=True)
        if cfg.resume:
            check_resumed_model(cfg, out)
        atomic_write_text(out / "run_config.json", cfg.to_json())  # for `asrfit report` mid-run
        for stale in remove_stale_temporaries(out):
            logger.info("removed %s left by an interrupted write", stale)
        recover_best(out / "best")
        if not cfg.resume:
            (out / "data_events.jsonl").unlink(missing_ok=True)
        self.save_steps, self.save_minutes = parse_save_every(cfg.save_every)
        train_utts, self.skip_log, policy = prepare_data(cfg, out)
        normalizer = TextNormalizer(cfg.lowercase, cfg.remove_punctuation)
        if cfg.resume and (out / "vocab.json").is_file():
            vocab = CharVocabulary.load(out)
        else:
            vocab = CharVocabulary.build((u.text for u in train_utts), normalizer)
            vocab.save(out)
        asr = build_asr_model(
            cfg.model, vocab, pretrained=not cfg.random_init, overrides=cfg.model_overrides
        )
        if asr.vocab is not None:  # a pretrained Whisper / Parakeet-TDT may bring its own
            vocab = asr.vocab
        self.asr, self.vocab = asr, vocab
        self.window = asr.frontend.max_seconds  # Whisper's fixed input window, else None
        loaded_plan = None
        if cfg.plan is not None:
            from asrfit.plan.plan import Plan

            loaded_plan = Plan.load(cfg.plan)
            cap, mode = loaded_plan.data.max_seconds, loaded_plan.data.long_utterances
        else:
            cap, reason = (
                (cfg.max_seconds, "--max-seconds")
                if cfg.max_seconds
                else long_audio_cap_seconds([u.duration_seconds for u in train_utts])
            )
            mode = "chunk"
            if cap is not None:
                logger.warning("long audio: %s", reason)
        window = self.window
        self.train_set = SpeechDataset(
            train_utts,
            vocab,
            asr.frontend,
            **asr.label_rules(),
            max_seconds=cap if window is None else min(cap or window, window),
            long_utterances=mode,
            spec_augment=spec_augment(cfg, asr),
            seed=cfg.seed,
            event_log=out / "data_events.jsonl",
        )
        check_skips(self.skip_log, self.train_set, policy, cfg, out)
        if loaded_plan is not None:
            check_loaded_plan(cfg, asr, dataset_profile(cfg, self.train_set), loaded_plan)
            self.plan = loaded_plan
        else:
            self.plan, _ = plan_for(cfg, asr, self.train_set, cap)
        self.plan.save(out / "plan.json")
        check_unbatched(self.skip_log, self.train_set, self.plan, policy, cfg, out)
        self.train_set.set_cache(self.plan.data.cache_decoded_audio)
        self.dev_set = None
        if cfg.dev is not None:
            self.dev_set = SpeechDataset(
                utterances_from(cfg.dev),
                vocab,
                asr.frontend,
                **asr.label_rules(scoring=True),
                max_seconds=window,
                long_utterances="chunk",
                cache=True,
                keep_unknown=True,
            )
        self.learning_rate = cfg.learning_rate or (5e-5 if asr.pretrained else 1e-3)
        self.order = np.random.default_rng(cfg.seed).permutation(len(self.train_set))
        self.events = run_listeners(cfg, out, self.listeners)
        self.state = RunState.load(out / "run_state.json") if cfg.resume else RunState()
        self.epochs = [EpochRecord.from_dict(e) for e in self.state.epochs]
        if cfg.resume and (out / "best" / "scores.json").is_file():
            scores = json.loads((out / "best" / "scores.json").read_text(encoding="utf-8"))
            self.best_cer, self.best_wer = scores["dev_cer"], scores["dev_wer"]

    def score(self, stage: int, sampler: Any, loss: float, wall: float, audio: float) -> None:
        """Score the epoch just trained on dev, record it, and save the best model when dev
        improved (an epoch scored before a resume keeps its record)."""
        trainer, cfg = self.trainer, self.cfg
        if self.state.is_scored(stage, trainer.global_step):
            # resumed from a checkpoint before an epoch already scored (a damaged newer one
            # passed over): that epoch was trained again to the same weights; its record stands
            logger.info(
                "stage %d step %d: already scored before the resume", stage, trainer.global_step
            )
            return
        # numbered from 1; an epoch that --max-steps cut short has not moved trainer.epoch on
        into = trainer.batches_in_epoch / max(1, len(sampler))
        epoch = trainer.epoch + (1 if into else 0)
        dev = None
        if self.dev_set is not None:
            dev = evaluate(
                trainer.unwrapped_model,
                self.dev_set,
                self.asr.output_frames,
                batch_size=cfg.eval_batch_size,
                device=trainer.accelerator.device,
            )
            logger.info(
                "stage %d epoch %d: dev WER %.1f %%, CER %.1f %%",
                stage,
                epoch,
                100 * dev.wer,
                100 * dev.cer,
            )
            self.events.on_eval(trainer.global_step, {"wer": dev.wer, "cer": dev.cer})
        predicted = predicted_epoch_seconds(self.plan, trainer.accelerator.device.type, audio)
        record = EpochRecord(
            stage, epoch, trainer.global_step, loss, wall, audio, dev, predicted, into or 1.0
        )
        if predicted:  # an epoch resumed at its end trains on no audio
            logger.info(
                "stage %d epoch %d: trained in %.0f s, the plan predicted %.0f s "
                "(measured/predicted %.2f)",
                stage,
                epoch,
                wall,
                predicted,
                wall / predicted,
            )
        self.epochs.append(record)
        if dev is None or self.best_cer is None or dev.cer < self.best_cer:
            self.best_cer, self.best_wer = (dev.cer, dev.wer) if dev else (None, None)
            save_best(
                self.asr,
                self.vocab,
                self.plan,
                self.out / "best",
                {
                    "dev_cer": self.best_cer,
                    "dev_wer": self.best_wer,
                    "stage": stage,
                    "step": record.steps,
                },
            )
        self.state.add(stage, record.steps, record.to_dict())
        self.state.save(self.out / "run_state.json")

    def train_stage(self, stage: int, fraction: float) -> None:
        """Train one stage (the first ``fraction`` of the shuffled data) epoch by epoch,
        scoring each; resume it from its newest good checkpoint under ``--resume``."""
        from asrfit.train.checkpoint import latest_good_checkpoint, load_checkpoint
        from asrfit.train.config import TrainingConfig
        from asrfit.train.schedule import warmup_schedule
        from asrfit.train.trainer import MemoryEfficientTrainer

        cfg, plan, events, train_set = self.cfg, self.plan, self.events, self.train_set
        indices = sorted(self.order[: max(1, math.ceil(fraction * len(train_set)))].tolist())
        subset = torch.utils.data.Subset(train_set, indices)
        durations = [train_set.durations[i] for i in indices]
        labels = [train_set.label_lengths[i] for i in indices]
        stage_dir = self.out / f"stage{stage}"
        training = TrainingConfig.from_plan(
            plan, learning_rate=self.learning_rate, num_train_epochs=cfg.epochs
        )
        trainer = self.trainer = MemoryEfficientTrainer(
            self.asr.model,
            training,
            plan=plan,
            out_dir=stage_dir,
            loss_fn=self.asr.loss_fn,
            units_fn=self.asr.units_fn,
            seed=cfg.seed,
            progress=False,
            keep_last=cfg.keep_checkpoints,
            stop_signals=cfg.stop_signals,
            save_every_steps=self.save_steps,
            save_every_minutes=self.save_minutes,
            listeners=[events],
        )
        sampler = trainer.make_sampler(subset, durations=durations, label_lengths=labels)
        per_epoch = math.ceil(len(sampler) / trainer.accumulation_steps)
        total = math.ceil(cfg.epochs * per_epoch)
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        events.offset = events.total_steps
        events.total_steps += total
        events.on_train_begin(events.total_steps, events.offset)  # the total grows per stage
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, total // 10)
        inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        trainer.scheduler = warmup_schedule(inner, warmup, total)
        resume_from = latest_good_checkpoint(stage_dir / "checkpoints") if cfg.resume else None
        if resume_from is None and self.previous is not None:
            load_checkpoint(self.previous, model=trainer.unwrapped_model)
            logger.info("stage %d starts from %s", stage, self.previous)
        step, batches_done, trained = trainer.global_step, 0, False
        if resume_from is not None:
            step, batches_done = self._resume_stage(stage, sampler, resume_from, total)
        while step < total:
            # one epoch per call (the rest of it after a resume), then score dev
            epoch_end = step + math.ceil((len(sampler) - batches_done) / trainer.accumulation_steps)
            summary = trainer.train(
                sampler,
                dataset=subset,
                resume_from=resume_from,
                max_steps=min(total, epoch_end),
                durations=durations,
                label_lengths=labels,
            )
            step, batches_done, resume_from, trained = trainer.global_step, 0, None, True
            self.peak = max(self.peak, summary.peak_memory_bytes)
            self.audio_seconds += summary.audio_seconds
            self.train_seconds += summary.wall_seconds
            # the epoch's mean loss, the steps before a resume included
            self.score(
                stage, sampler, trainer.epoch_mean_loss, summary.wall_seconds, summary.audio_seconds
            )
        self.nonfinite += trainer.nonfinite.skipped_steps
        self.preflight += [f"stage {stage}: {note}" for note in trainer.preflight_notes]
        # a stage that had finished before a resume keeps its checkpoint as it is
        self.previous = (
            trainer.save_checkpoint()
            if trained
            else latest_good_checkpoint(stage_dir / "checkpoints")
        )

    def _resume_stage(
        self, stage: int, sampler: Any, resume_from: Path, total: int
    ) -> tuple[int, int]:
        """Where a resumed stage stands: ``(step, batches done in its epoch)``. An epoch whose
        checkpoint was written but not scored is scored now; a finished stage's weights are
        taken as they are."""
        from asrfit.train.checkpoint import read_checkpoint, restore_weights

        trainer = self.trainer
        saved = read_checkpoint(resume_from)
        step, batches_done = int(saved["step"]), int(saved["extra"].get("batches_in_epoch", 0))
        self.events.resumed_at(self.events.offset + step)  # the steps after it come again
        if batches_done == 0 and not self.state.is_scored(stage, step):
            # killed after the epoch's checkpoint, before its score was saved: score it now
            restore_weights(trainer, saved, position=True)
            logger.warning(
                "stage %d step %d: its epoch was not scored before the run stopped; scoring it now",
                stage,
                step,
            )
            loss_total, units_total = saved["extra"].get("epoch_loss", (math.nan, 1))
            loss = loss_total / units_total if units_total else math.nan
            self.score(stage, sampler, loss, 0.0, 0.0)
        if step >= total:  # the stage had finished: take its weights and move on
            restore_weights(trainer, saved)
        return step, batches_done

    def finish(self) -> RunReport:
        """Score the best model on the test set; write ``report.json`` and ``report.md``;
        push the best model when asked."""
        cfg, asr, plan, trainer = self.cfg, self.asr, self.plan, self.trainer
        self.events.on_train_end()
        test = None
        if cfg.test is not None:
            best = auto_class_for(asr.family).from_pretrained(self.out / "best")
            test_set = SpeechDataset(
                utterances_from(cfg.test),
                self.vocab,
                asr.frontend,
                **asr.label_rules(scoring=True),
                max_seconds=self.window,
                long_utterances="chunk",
                keep_unknown=True,
            )
            test = evaluate(best, test_set, asr.output_frames, batch_size=cfg.eval_batch_size)
        device = str(trainer.accelerator.device)
        # not_batched: counted before training, over the whole training set (check_unbatched)
        skipped = {
            **dict(self.skip_log.counts),
            **{f"replaced_{k}": v for k, v in self.train_set.replacements().items()},
        }
        report = RunReport(
            config=cfg,
            model_class=type(asr.model).__name__,
            parameters=asr.num_parameters,
            trainable_parameters=sum(p.numel() for p in asr.model.parameters() if p.requires_grad),
            pretrained=asr.pretrained,
            gpu=plan.gpu,
            device=device,
            plan_summary=[[k, v] for k, v in plan.summary_rows()],
            predicted_peak_bytes=max(b.predicted_peak_bytes for b in plan.buckets),
            measured_peak_bytes=self.peak,
            measured_peak_kind="torch.cuda.max_memory_reserved"
            if device.startswith("cuda")
            else CPU_PEAK_KIND,
            predicted_audio_seconds_per_second=plan.predicted_throughput_seconds_per_second,
            measured_audio_seconds_per_second=self.audio_seconds / self.train_seconds
            if self.train_seconds
            else 0.0,
            skipped=skipped,
            epochs=self.epochs,
            best_dev_cer=self.best_cer,
            best_dev_wer=self.best_wer,
            test=test,
            wall_seconds=time.perf_counter() - self.started,
            best_dir=str(self.out / "best"),
            utterances_total=self.skip_log.total,
            skipped_total=sum(skipped.values()),
            nonfinite_steps=self.nonfinite,
            preflight=self.preflight,
        )
        atomic_write_text(self.out / "report.json", report.to_json())
        atomic_write_text(self.out / "report.md", report.markdown())
        if cfg.push_to_hub:
            push_to_hub(self.out / "best", cfg.push_to_hub)
        return report


def train_asr(cfg: RunConfig, listeners: list[RunListener] | None = None) -> RunReport:
    """Profile, plan, train and score; see the module docstring for what is written.

    Args:
        cfg: What to do.
        listeners: Told about every step and dev score (e.g. a progress display), with
            steps numbered across stages. (Default: none)

    Raises:
        ConfigError: On unusable data or arguments (naming them), or more skipped data than
            ``max_skipped`` allows.
        PlanError: When nothing fits the GPU.
    """
    run = AsrRun(cfg, listeners)
    try:
        run.prepare()
        for stage, fraction in enumerate(cfg.stages, start=1):
            run.train_stage(stage, fraction)
        return run.finish()
    finally:  # also when stopped by a signal: the checkpoint is written by then
        if run.trainer is not None:
            run.trainer.end_training()


def load_report(out_dir: str | Path) -> dict[str, Any]:
    """The ``report.json`` of a finished run, as a dict."""
    return json.loads((Path(out_dir) / "report.json").read_text(encoding="utf-8"))
