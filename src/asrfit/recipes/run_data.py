"""The data side of a run: validation and its skip limits, SpecAugment, the dataset profile
the plan is made from, and the plan itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from asrfit.data.audio import SpecAugment
from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.validate import SkipLog, ValidationPolicy, validate_utterances
from asrfit.recipes.asr_model import ASRModel
from asrfit.recipes.run_report import RunConfig
from asrfit.recipes.run_safety import write_clean_manifest

logger = logging.getLogger(__name__)


def spec_augment(cfg: RunConfig, asr: ASRModel) -> SpecAugment | None:
    """SpecAugment for ``(frames, mels)`` features; Whisper's ``(mels, frames)`` window gets none."""
    if not cfg.spec_augment or asr.frontend.input_key != "input_features":
        return None
    if asr.family == "whisper":
        logger.info("SpecAugment is off for Whisper (its features are a fixed, padded window).")
        return None
    return SpecAugment()


def dataset_profile(cfg: RunConfig, train_set: SpeechDataset) -> Any:
    """The profile a plan is made from: the utterances that passed validation."""
    from asrfit.profiles.dataset import DatasetProfile

    if all(isinstance(u.source, (str, Path)) for u in train_set.utterances):
        source: Any = write_clean_manifest(
            train_set.utterances, Path(cfg.out_dir) / "train.clean.jsonl"
        )
    else:  # embedded audio or lhotse cuts: profile the source itself
        source = cfg.train
    return DatasetProfile.from_source(source)


def plan_for(
    cfg: RunConfig, asr: ASRModel, train_set: SpeechDataset, cap: float | None
) -> tuple[Any, Any]:
    """Plan for the utterances that passed validation (profiled from ``train.clean.jsonl``)."""
    from asrfit.plan.search import plan as make_plan
    from asrfit.profiles.hardware import HardwareProfile

    hardware = HardwareProfile.resolve(cfg.gpu)
    dataset = dataset_profile(cfg, train_set)
    plan = make_plan(
        hardware,
        dataset,
        asr.config,
        target_effective_batch=cfg.target_batch,
        max_seconds=cap,
        precision=cfg.precision,
    )
    return plan, hardware


def prepare_data(cfg: RunConfig, out: Path) -> tuple[list[Any], SkipLog, ValidationPolicy]:
    """Read and validate the training data (see :mod:`asrfit.data.validate`)."""
    policy = ValidationPolicy(
        max_skipped_fraction=cfg.max_skipped, duration_tolerance_seconds=cfg.duration_tolerance
    )
    utterances, log = validate_utterances(
        utterances_from(cfg.train), policy, what=f"training data {cfg.train}"
    )
    return utterances, log, policy


def check_skips(
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


def check_unbatched(
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
