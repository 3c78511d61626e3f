"""What ``asrfit train`` was asked (:class:`RunConfig`) and what it did (:class:`RunReport`).

:mod:`asrfit.recipes.run` fills these; ``report.json`` and ``report.md`` are written from
:class:`RunReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asrfit.data.validate import ValidationPolicy
from asrfit.errors import ConfigError
from asrfit.recipes.evaluate import EvalResult
from asrfit.recipes.run_safety import parse_save_every
from asrfit.train.interrupt import parse_stop_signals
from asrfit.utils.serialization import JsonDataclass


@dataclass
class RunConfig(JsonDataclass):
    """What ``asrfit train`` was asked to do.

    Attributes:
        model: Model spec (bundled name, Hub id, folder).
        train: Training data (manifest, audio folder).
        out_dir: Where the run writes.
        dev: Dev data, scored every epoch. (Default: none)
        test: Test data, scored once with the best model. (Default: none)
        gpu: GPU name, or "auto" to detect (CPU when there is none).
        plan: A saved plan to train with instead of planning; refused when it was made for
            another model, GPU or dataset (its fingerprints), unless ``force_plan``.
        force_plan: Train with ``plan`` even when its fingerprints differ (logged).
        target_batch: Utterances per optimizer step.
        precision: The plan's precision ("fp32", "bf16", "fp16", "pure_bf16"); None: the
            planner's choice for the hardware (:func:`asrfit.plan.search.candidate_setups`).
            Not used with ``plan`` (a saved plan keeps its own).
        epochs: Epochs per stage.
        max_steps: Optimizer steps per stage (wins over ``epochs``).
        learning_rate: Peak LR. (Default: 1e-3 for random weights, 5e-5 for pretrained ones)
        warmup_steps: Linear warm-up. (Default: 10% of the stage's steps)
        stages: Fractions of the training data, trained in turn.
        spec_augment: Mask features of the built-in model while training.
        random_init: Never load weights.
        model_overrides: Config fields to change.
        seed: Seeds sampling, masks and initialisation.
        resume: Continue from the latest checkpoints in ``out_dir``.
        eval_batch_size: Utterances per evaluation batch.
        lowercase, remove_punctuation: Transcript normalisation.
        push_to_hub: A Hub repo id to push the best model to (needs a configured token).
        tensorboard: Write TensorBoard scalars to ``out_dir/tensorboard`` when the
            ``tensorboard`` package is installed.
        max_skipped: Above this share of skipped training utterances the run stops.
        duration_tolerance: Seconds a declared duration may differ from the audio header
            (or 2 % of it, whichever is larger).
        save_every: Checkpoint every N steps ("500") or minutes ("30m"); every epoch end too.
        max_seconds: Chunk (or, with a plan that says so, filter) audio above this. (Default:
            the long-audio rule, :func:`long_audio_cap_seconds`)
        keep_checkpoints: Checkpoints kept per stage, newest first (resume falls back to an
            older one when the newest fails its checksum). (Default: 2)
        stop_signals: Signals that, like Ctrl-C, stop training after the step in progress
            with a checkpoint; comma-separated names, or "none". (Default: SIGTERM,SIGUSR1)
    """

    model: str
    train: str
    out_dir: str
    dev: str | None = None
    test: str | None = None
    gpu: str = "auto"
    plan: str | None = None
    force_plan: bool = False
    target_batch: int = 32
    precision: str | None = None
    epochs: float = 10.0
    max_steps: int | None = None
    learning_rate: float | None = None
    warmup_steps: int | None = None
    stages: list[float] = field(default_factory=lambda: [1.0])
    spec_augment: bool = True
    random_init: bool = False
    model_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    resume: bool = False
    eval_batch_size: int = 16
    lowercase: bool = True
    remove_punctuation: bool = True
    push_to_hub: str | None = None
    tensorboard: bool = True
    max_skipped: float = 0.05
    duration_tolerance: float = 0.1
    save_every: str = "30m"
    max_seconds: float | None = None
    keep_checkpoints: int = 2
    stop_signals: str = "SIGTERM,SIGUSR1"

    def __post_init__(self) -> None:
        parse_save_every(self.save_every)
        parse_stop_signals(self.stop_signals)
        if self.keep_checkpoints < 1:
            raise ConfigError(
                f"keep_checkpoints={self.keep_checkpoints}: keep at least 1 (2 lets a resume "
                "fall back to the previous checkpoint when the newest is damaged)."
            )
        ValidationPolicy(
            max_skipped_fraction=self.max_skipped,
            duration_tolerance_seconds=self.duration_tolerance,
        )
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ConfigError(f"max_seconds={self.max_seconds}: give a positive number of seconds.")
        if (
            not self.stages
            or any(not 0 < f <= 1 for f in self.stages)
            or sorted(self.stages) != self.stages
        ):
            raise ConfigError(
                f"stages={self.stages}: give increasing fractions in (0, 1], e.g. 0.1,0.5,1.0."
            )
        if self.epochs <= 0 or (self.max_steps is not None and self.max_steps < 1):
            raise ConfigError(
                f"epochs={self.epochs}, max_steps={self.max_steps}: must be positive."
            )
        if self.target_batch < 1:
            raise ConfigError(f"target_batch={self.target_batch}: must be at least 1.")


CPU_PEAK_KIND = (
    "process RSS (CPU): the whole process, its interpreter, libraries and cached inputs too; "
    "the prediction is the training step's tensors alone"
)
"""What a CPU run's measured peak is (:attr:`RunReport.measured_peak_kind`): not the predicted
quantity, so the report names both (``bench/memory_accuracy.py`` compares the two at the
allocator)."""


@dataclass
class EpochRecord(JsonDataclass):
    """One epoch: where, how long (measured, and as the plan predicted it), and the dev scores.

    ``predicted_seconds`` is the epoch's audio over the plan's predicted audio seconds per second
    (:func:`predicted_epoch_seconds`); None when the plan was made for another kind of device.
    ``epoch`` counts from 1: the epoch the record ends (or, for one that ``max_steps`` cut
    short, stops in); ``fraction`` is the share of that epoch's batches trained by then.
    """

    stage: int
    epoch: int
    steps: int
    train_loss: float
    wall_seconds: float
    audio_seconds: float
    dev: EvalResult | None = None
    predicted_seconds: float | None = None
    fraction: float = 1.0


@dataclass
class RunReport(JsonDataclass):
    """What a run did and measured.

    ``preflight`` holds what the pre-flight changed or found: each bucket limit it lowered,
    with the figures, and each pass whose time differs from the plan's step time by more than
    25 % (:mod:`asrfit.train.preflight_limits`).
    """

    config: RunConfig
    model_class: str
    parameters: int
    trainable_parameters: int
    pretrained: bool
    gpu: str
    device: str
    plan_summary: list[list[str]]
    predicted_peak_bytes: int
    measured_peak_bytes: int
    measured_peak_kind: str
    predicted_audio_seconds_per_second: float
    measured_audio_seconds_per_second: float
    skipped: dict[str, int]
    epochs: list[EpochRecord]
    best_dev_cer: float | None
    best_dev_wer: float | None
    test: EvalResult | None
    wall_seconds: float
    best_dir: str
    utterances_total: int = 0
    skipped_total: int = 0
    nonfinite_steps: int = 0
    preflight: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """A short human-readable report."""
        lines = [
            f"# asrfit run: {self.config.model}",
            "",
            f"{self.model_class}, {self.parameters / 1e6:.2f} M parameters "
            f"({self.trainable_parameters / 1e6:.2f} M trainable), "
            f"{'pretrained' if self.pretrained else 'random'} weights; trained on {self.device}.",
            "",
            "## Plan",
            "",
        ]
        lines += [f"- {k}: {v}" for k, v in self.plan_summary]
        lines += [
            "",
            "## Memory and speed",
            "",
            f"- predicted peak (largest bucket, plan for {self.gpu}): {self.predicted_peak_bytes / 2**30:.2f} GiB",
            f"- measured peak ({self.measured_peak_kind}): {self.measured_peak_bytes / 2**30:.2f} GiB",
            f"- throughput: predicted {self.predicted_audio_seconds_per_second:.1f}, measured "
            f"{self.measured_audio_seconds_per_second:.1f} audio s per s",
            "",
        ]
        if self.preflight:
            lines += ["## Pre-flight", "", *(f"- {note}" for note in self.preflight), ""]
        lines += [
            "## Epochs",
            "",
            "| stage | epoch | steps | train loss | dev WER | dev CER | s | predicted s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for e in self.epochs:
            wer = f"{100 * e.dev.wer:.1f} %" if e.dev else "-"
            cer = f"{100 * e.dev.cer:.1f} %" if e.dev else "-"
            epoch = str(e.epoch) if e.fraction >= 1 else f"{e.epoch} ({e.fraction:.0%} of it)"
            lines.append(
                f"| {e.stage} | {epoch} | {e.steps} | {e.train_loss:.3f} | {wer} | {cer} | {e.wall_seconds:.0f} | "
                f"{'-' if e.predicted_seconds is None else f'{e.predicted_seconds:.0f}'} |"
            )
        if self.test is not None:
            lines += [
                "",
                f"Test (best model): WER {100 * self.test.wer:.1f} %, CER {100 * self.test.cer:.1f} %",
            ]
        if self.skipped:
            lines += [
                "",
                "## Skipped",
                "",
                f"{self.skipped_total} of {self.utterances_total} training "
                "utterances skipped or replaced (each in skipped.jsonl and the log):",
                "",
            ]
            lines += [f"- {k}: {v}" for k, v in sorted(self.skipped.items())]
        return "\n".join(lines) + "\n"


def predicted_epoch_seconds(plan: Any, device_type: str, audio_seconds: float) -> float | None:
    """Seconds the plan predicts for training on ``audio_seconds`` of audio on this device.

    Args:
        plan: The run's :class:`~asrfit.plan.plan.Plan`.
        device_type: ``torch.device.type`` the run trains on (``"cpu"``, ``"cuda"``).
        audio_seconds: Audio the epoch trained on.

    Returns:
        ``audio_seconds`` over the plan's predicted audio seconds per second, or None when the plan
        was made for another kind of device (a GPU plan run on the CPU says nothing about its time).
    """
    rate = plan.predicted_throughput_seconds_per_second
    if (plan.gpu == "cpu-only") != (device_type == "cpu") or not rate > 0:
        return None
    return audio_seconds / rate
