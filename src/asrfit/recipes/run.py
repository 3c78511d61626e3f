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

from asrfit.data.audio import SpecAugment
from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.text import CharVocabulary, TextNormalizer
from asrfit.data.validate import SkipLog, ValidationPolicy, validate_utterances
from asrfit.recipes.asr_model import ASRModel, auto_class_for, build_asr_model
from asrfit.recipes.evaluate import evaluate
from asrfit.recipes.run_checks import check_loaded_plan, check_resumed_model, push_to_hub
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
    write_clean_manifest,
)
from asrfit.train.events import RunListener
from asrfit.utils.io import atomic_write_text, remove_stale_temporaries

logger = logging.getLogger(__name__)


def _spec_augment(cfg: RunConfig, asr: ASRModel) -> SpecAugment | None:
    """SpecAugment for ``(frames, mels)`` features; Whisper's ``(mels, frames)`` window gets none."""
    if not cfg.spec_augment or asr.frontend.input_key != "input_features":
        return None
    if asr.family == "whisper":
        logger.info("SpecAugment is off for Whisper (its features are a fixed, padded window).")
        return None
    return SpecAugment()


def _dataset_profile(cfg: RunConfig, train_set: SpeechDataset) -> Any:
    """The profile a plan is made from: the utterances that passed validation."""
    from asrfit.profiles.dataset import DatasetProfile

    if all(isinstance(u.source, (str, Path)) for u in train_set.utterances):
        source: Any = write_clean_manifest(
            train_set.utterances, Path(cfg.out_dir) / "train.clean.jsonl"
        )
    else:  # embedded audio or lhotse cuts: profile the source itself
        source = cfg.train
    return DatasetProfile.from_source(source)


def _plan(
    cfg: RunConfig, asr: ASRModel, train_set: SpeechDataset, cap: float | None
) -> tuple[Any, Any]:
    """Plan for the utterances that passed validation (profiled from ``train.clean.jsonl``)."""
    from asrfit.plan.search import plan as make_plan
    from asrfit.profiles.hardware import HardwareProfile

    hardware = HardwareProfile.resolve(cfg.gpu)
    dataset = _dataset_profile(cfg, train_set)
    return make_plan(
        hardware, dataset, asr.config, target_effective_batch=cfg.target_batch, max_seconds=cap
    ), hardware


def _prepare_data(cfg: RunConfig, out: Path) -> tuple[list[Any], SkipLog, ValidationPolicy]:
    """Read and validate the training data (see :mod:`asrfit.data.validate`)."""
    policy = ValidationPolicy(
        max_skipped_fraction=cfg.max_skipped, duration_tolerance_seconds=cfg.duration_tolerance
    )
    utterances, log = validate_utterances(
        utterances_from(cfg.train), policy, what=f"training data {cfg.train}"
    )
    return utterances, log, policy


def _check_skips(
    log: SkipLog, train_set: SpeechDataset, policy: ValidationPolicy, cfg: RunConfig, out: Path
) -> None:
    """Write ``skipped.jsonl``, then stop when too much of the data was skipped."""
    log.merge(dict(train_set.skipped))
    log.entries += train_set.skip_entries
    listing = log.write(out / "skipped.jsonl") if log.entries else None
    if log.counts:
        logger.warning(
            "training data: %d of %d utterances skipped (%s)%s",
            log.skipped,
            log.total,
            ", ".join(f"{k}: {v}" for k, v in sorted(log.counts.items())),
            f"; each listed in {listing}" if listing else "",
        )
    log.check(policy, f"training data {cfg.train}", str(listing) if listing else None)


def _check_unbatched(
    log: SkipLog,
    train_set: SpeechDataset,
    plan: Any,
    policy: ValidationPolicy,
    cfg: RunConfig,
    out: Path,
) -> None:
    """Utterances the plan's buckets cannot batch (the sampler would drop them) are skips too:
    listed in ``skipped.jsonl`` and counted against ``--max-skipped`` before training starts."""
    from asrfit.data.sampler import MemoryBudgetSampler

    probe = MemoryBudgetSampler(
        train_set.durations, plan, label_lengths=train_set.label_lengths, shuffle=False
    )
    if not probe.skipped_indices:
        return
    reason = "not_batched: " + "; ".join(sorted(probe.skipped))  # report.json's key, as before
    for index in probe.skipped_indices:
        log.add(reason, train_set.utterances[index].where)
    listing = log.write(out / "skipped.jsonl")
    logger.warning(
        "training data: %d utterance(s) the plan cannot batch (%s); each listed in %s",
        len(probe.skipped_indices),
        reason,
        listing,
    )
    log.check(policy, f"training data {cfg.train}", str(listing))


def _score_epoch(ctx: dict[str, Any], stage: int, record: EpochRecord) -> None:
    """Save the best model (with its score) when dev improved, then mark the epoch scored."""
    state: RunState = ctx["state"]
    dev = record.dev
    if dev is None or ctx["best_cer"] is None or dev.cer < ctx["best_cer"]:
        ctx["best_cer"], ctx["best_wer"] = (dev.cer, dev.wer) if dev else (None, None)
        save_best(
            ctx["asr"],
            ctx["vocab"],
            ctx["plan"],
            ctx["out"] / "best",
            {
                "dev_cer": ctx["best_cer"],
                "dev_wer": ctx["best_wer"],
                "stage": stage,
                "step": record.steps,
            },
        )
    state.add(stage, record.steps, record.to_dict())
    state.save(ctx["out"] / "run_state.json")


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
    import transformers

    from asrfit.train.checkpoint import latest_good_checkpoint, load_checkpoint, read_checkpoint
    from asrfit.train.config import TrainingConfig
    from asrfit.train.schedule import warmup_schedule
    from asrfit.train.trainer import MemoryEfficientTrainer

    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bars per epoch
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.resume:
        check_resumed_model(cfg, out)
    atomic_write_text(out / "run_config.json", cfg.to_json())  # for `asrfit report` mid-run
    for stale in remove_stale_temporaries(out):
        logger.info("removed %s left by an interrupted write", stale)
    recover_best(out / "best")
    if not cfg.resume:
        (out / "data_events.jsonl").unlink(missing_ok=True)
    save_steps, save_minutes = parse_save_every(cfg.save_every)
    train_utts, skip_log, policy = _prepare_data(cfg, out)
    normalizer = TextNormalizer(cfg.lowercase, cfg.remove_punctuation)
    if cfg.resume and (out / "vocab.json").is_file():
        vocab = CharVocabulary.load(out)
    else:
        vocab = CharVocabulary.build((u.text for u in train_utts), normalizer)
        vocab.save(out)
    asr = build_asr_model(
        cfg.model, vocab, pretrained=not cfg.random_init, overrides=cfg.model_overrides
    )
    if asr.vocab is not None:  # a pretrained Whisper / Parakeet-TDT may bring its own tokenizer
        vocab = asr.vocab
    window = asr.frontend.max_seconds  # Whisper's fixed input window, else None
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
    max_seconds = cap if window is None else min(cap or window, window)
    augment = _spec_augment(cfg, asr)
    train_set = SpeechDataset(
        train_utts,
        vocab,
        asr.frontend,
        **asr.label_rules(),
        max_seconds=max_seconds,
        long_utterances=mode,
        spec_augment=augment,
        seed=cfg.seed,
        event_log=out / "data_events.jsonl",
    )
    _check_skips(skip_log, train_set, policy, cfg, out)
    if loaded_plan is not None:
        check_loaded_plan(cfg, asr, _dataset_profile(cfg, train_set), loaded_plan)
        plan, hardware = loaded_plan, None
    else:
        plan, hardware = _plan(cfg, asr, train_set, cap)
    plan.save(out / "plan.json")
    _check_unbatched(skip_log, train_set, plan, policy, cfg, out)
    train_set.set_cache(plan.data.cache_decoded_audio)
    dev_set = None
    if cfg.dev is not None:
        dev_set = SpeechDataset(
            utterances_from(cfg.dev),
            vocab,
            asr.frontend,
            **asr.label_rules(scoring=True),
            max_seconds=window,
            long_utterances="chunk",
            cache=True,
            keep_unknown=True,
        )
    lr = cfg.learning_rate or (5e-5 if asr.pretrained else 1e-3)
    order = np.random.default_rng(cfg.seed).permutation(len(train_set))
    events = run_listeners(cfg, out, list(listeners or []))
    state = RunState.load(out / "run_state.json") if cfg.resume else RunState()
    epochs: list[EpochRecord] = [EpochRecord.from_dict(e) for e in state.epochs]
    ctx: dict[str, Any] = {
        "state": state,
        "asr": asr,
        "vocab": vocab,
        "plan": plan,
        "out": out,
        "best_cer": None,
        "best_wer": None,
    }
    if cfg.resume and (out / "best" / "scores.json").is_file():
        scores = json.loads((out / "best" / "scores.json").read_text(encoding="utf-8"))
        ctx["best_cer"], ctx["best_wer"] = scores["dev_cer"], scores["dev_wer"]
    previous: Path | None = None
    peak, audio_seconds, train_seconds, nonfinite = 0, 0.0, 0.0, 0
    preflight: list[str] = []  # what each stage's pre-flight lowered or found slow or fast
    trainer: Any = None

    def score(stage: int, loss: float, wall: float, audio: float) -> None:
        if state.is_scored(stage, trainer.global_step):
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
        if dev_set is not None:
            dev = evaluate(
                trainer.unwrapped_model,
                dev_set,
                asr.output_frames,
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
            events.on_eval(trainer.global_step, {"wer": dev.wer, "cer": dev.cer})
        predicted = predicted_epoch_seconds(plan, trainer.accelerator.device.type, audio)
        record = EpochRecord(
            stage, epoch, trainer.global_step, loss, wall, audio, dev, predicted, into or 1.0
        )
        if predicted:  # an epoch resumed at its end trains on no audio
            logger.info(
                "stage %d epoch %d: trained in %.0f s, the plan predicted %.0f s (measured/predicted %.2f)",
                stage,
                epoch,
                wall,
                predicted,
                wall / predicted,
            )
        epochs.append(record)
        _score_epoch(ctx, stage, record)

    for stage, fraction in enumerate(cfg.stages, start=1):
        indices = sorted(order[: max(1, math.ceil(fraction * len(train_set)))].tolist())
        subset = torch.utils.data.Subset(train_set, indices)
        durations = [train_set.durations[i] for i in indices]
        labels = [train_set.label_lengths[i] for i in indices]
        stage_dir = out / f"stage{stage}"
        training = TrainingConfig.from_plan(plan, learning_rate=lr, num_train_epochs=cfg.epochs)
        trainer = MemoryEfficientTrainer(
            asr.model,
            training,
            plan=plan,
            out_dir=stage_dir,
            loss_fn=asr.loss_fn,
            units_fn=asr.units_fn,
            seed=cfg.seed,
            progress=False,
            keep_last=cfg.keep_checkpoints,
            stop_signals=cfg.stop_signals,
            save_every_steps=save_steps,
            save_every_minutes=save_minutes,
            listeners=[events],
        )
        sampler = trainer.make_sampler(subset, durations=durations, label_lengths=labels)
        per_epoch = math.ceil(len(sampler) / trainer.accumulation_steps)
        total = math.ceil(cfg.epochs * per_epoch)
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        events.offset = events.total_steps
        events.total_steps += total
        events.on_train_begin(
            events.total_steps, events.offset
        )  # the display's total grows per stage
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, total // 10)
        inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        trainer.scheduler = warmup_schedule(inner, warmup, total)
        resume_from = latest_good_checkpoint(stage_dir / "checkpoints") if cfg.resume else None
        if resume_from is None and previous is not None:
            load_checkpoint(previous, model=trainer.unwrapped_model)
            logger.info("stage %d starts from %s", stage, previous)
        step, batches_done, trained = trainer.global_step, 0, False
        if resume_from is not None:
            saved = read_checkpoint(resume_from)
            step, batches_done = int(saved["step"]), int(saved["extra"].get("batches_in_epoch", 0))
            events.resumed_at(events.offset + step)  # steps.jsonl: the steps after it come again
            if batches_done == 0 and not state.is_scored(stage, step):
                # killed after the epoch's checkpoint, before its score was saved: score it now
                trainer.unwrapped_model.load_state_dict(saved["model"])
                trainer.global_step, trainer.epoch = step, int(saved["epoch"])
                logger.warning(
                    "stage %d step %d: its epoch was not scored before the run stopped; "
                    "scoring it now",
                    stage,
                    step,
                )
                loss_total, units_total = saved["extra"].get("epoch_loss", (math.nan, 1))
                score(stage, loss_total / units_total if units_total else math.nan, 0.0, 0.0)
            if step >= total:  # the stage had finished: take its weights and move on
                trainer.unwrapped_model.load_state_dict(saved["model"])
            del saved
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
            peak = max(peak, summary.peak_memory_bytes)
            audio_seconds += summary.audio_seconds
            train_seconds += summary.wall_seconds
            # the epoch's mean loss, the steps before a resume included
            score(stage, trainer.epoch_mean_loss, summary.wall_seconds, summary.audio_seconds)
        nonfinite += trainer.nonfinite.skipped_steps
        preflight += [f"stage {stage}: {note}" for note in trainer.preflight_notes]
        # a stage that had finished before a resume keeps its checkpoint as it is
        previous = (
            trainer.save_checkpoint()
            if trained
            else latest_good_checkpoint(stage_dir / "checkpoints")
        )
    events.on_train_end()
    test = None
    if cfg.test is not None:
        best = auto_class_for(asr.family).from_pretrained(out / "best")
        test_set = SpeechDataset(
            utterances_from(cfg.test),
            vocab,
            asr.frontend,
            **asr.label_rules(scoring=True),
            max_seconds=window,
            long_utterances="chunk",
            keep_unknown=True,
        )
        test = evaluate(best, test_set, asr.output_frames, batch_size=cfg.eval_batch_size)
    device = str(trainer.accelerator.device)
    # not_batched: counted before training, over the whole training set (_check_unbatched)
    skipped = {
        **dict(skip_log.counts),
        **{f"replaced_{k}": v for k, v in train_set.replacements().items()},
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
        measured_peak_bytes=peak,
        measured_peak_kind="torch.cuda.max_memory_reserved"
        if device.startswith("cuda")
        else CPU_PEAK_KIND,
        predicted_audio_seconds_per_second=plan.predicted_throughput_seconds_per_second,
        measured_audio_seconds_per_second=audio_seconds / train_seconds if train_seconds else 0.0,
        skipped=skipped,
        epochs=epochs,
        best_dev_cer=ctx["best_cer"],
        best_dev_wer=ctx["best_wer"],
        test=test,
        wall_seconds=time.perf_counter() - started,
        best_dir=str(out / "best"),
        utterances_total=skip_log.total,
        skipped_total=sum(skipped.values()),
        nonfinite_steps=nonfinite,
        preflight=preflight,
    )
    atomic_write_text(out / "report.json", report.to_json())
    atomic_write_text(out / "report.md", report.markdown())
    if cfg.push_to_hub:
        push_to_hub(out / "best", cfg.push_to_hub)
    return report


def load_report(out_dir: str | Path) -> dict[str, Any]:
    """The ``report.json`` of a finished run, as a dict."""
    return json.loads((Path(out_dir) / "report.json").read_text(encoding="utf-8"))
