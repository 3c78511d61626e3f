"""``TrainingConfig``: the trainer's knobs, made from a :class:`~asrfit.plan.plan.Plan`.

Its field names are Hugging Face ``TrainingArguments``' (plus the seed trainer's own), so
``TrainingArguments(output_dir=..., **config.to_training_arguments())`` works. The seed
documents' entry points (:func:`asrfit.seed.create_optimal_config`,
:class:`asrfit.seed.ASRConfigManager`) build it; the planner decides, this module converts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import InitVar, dataclass, field
from typing import Any

from asrfit.errors import ConfigError
from asrfit.memory.setup import OptimizerKind, Precision
from asrfit.plan.plan import Plan
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

GIB = 2**30
_FEATURE_ENCODER_FAMILIES = ("wav2vec2", "hubert", "wavlm")

#: ``TrainingArguments.optim`` name of each optimizer the planner knows.
HF_OPTIMIZERS = {
    OptimizerKind.ADAMW: "adamw_torch",
    OptimizerKind.ADAMW_8BIT: "adamw_bnb_8bit",
    OptimizerKind.ADAFACTOR: "adafactor",
    OptimizerKind.SGD: "sgd",
}

# Fields that TrainingArguments takes under the same name.
_SAME_NAME_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "fp16",
    "bf16",
    "dataloader_num_workers",
    "learning_rate",
    "warmup_steps",
    "num_train_epochs",
    "max_grad_norm",
    "optim",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


@dataclass
class TrainingConfig(JsonDataclass):
    """The seed's training config: Hugging Face Trainer knobs plus the seed trainer's own.

    The seed trainer's two extra names are init-only aliases, readable and assignable as
    properties but not stored (so ``to_dict``, ``dataclasses.replace`` and equality see
    only the canonical fields):

    - ``accumulation_steps`` is ``gradient_accumulation_steps``. Give either to the
      constructor; giving both with different values is an error.
    - ``mixed_precision`` is ``fp16 or bf16``. ``mixed_precision=True`` alone means fp16
      (the default dtype of ``torch.autocast("cuda")``);
      ``mixed_precision=False`` with ``fp16`` or ``bf16`` set is an error. Assigning
      ``False`` later clears both flags; assigning ``True`` sets fp16 unless one is set.

    Attributes:
        per_device_train_batch_size: Fixed micro-batch per device; from a plan, the smallest
            bucket's batch (what a fixed-batch trainer can always fit).
        gradient_accumulation_steps: Micro-batches per optimizer step.
        fp16: Autocast to float16 with a gradient scaler.
        bf16: Autocast to bfloat16.
        gradient_checkpointing: Recompute activations in the backward pass.
        checkpoint_layers: Recompute only the first k encoder layers
            (:mod:`asrfit.models.checkpointing`); 0: none. Not with ``gradient_checkpointing``.
        dataloader_num_workers: Data-loader worker processes.
        learning_rate: Peak learning rate. (Default: 1e-4)
        warmup_steps: Linear warm-up steps. (Default: 500)
        num_train_epochs: Epochs. (Default: 3.0)
        max_grad_norm: Gradient clipping norm; 0 turns clipping off. (Default: 1.0)
        optim: ``TrainingArguments.optim`` name. (Default: "adamw_torch")
        group_by_length: Batch utterances of similar length. (Default: True)
        max_memory_gb: Seed trainer: memory budget per GPU in GiB (2**30 bytes, as torch
            reports it); from a plan, its usable bytes. None: no cap.
        accumulation_steps: Seed trainer's alias of ``gradient_accumulation_steps`` (init-only).
        mixed_precision: Seed trainer: ``fp16 or bf16`` (init-only).
        adaptive_batching: Seed trainer: let batch size follow utterance length (the plan's
            buckets). (Default: True)
        sequence_length_percentile: Seed trainer: duration percentile (0-100] that sized its
            batches. (Default: 95.0)
        alpha_constant: Seed trainer's analytic activation factor (activation bytes =
            alpha x an analytic count), kept for the analytic fallback when no simulation
            is possible. (Default: 1.2)
        bucket_duration_bins: Upper edges of the plan's duration buckets in seconds.
        bucket_batch_sizes: Batch limit per bucket, paired with ``bucket_duration_bins``.
        fixed_batch_accumulation_steps: Micro-batches per step when every micro-batch is
            ``per_device_train_batch_size`` (a plain Hugging Face ``Trainer``); from a plan,
            recomputed so that batch x accumulation x world size stays within half a
            micro-batch per process of the target. None: ``gradient_accumulation_steps``.
    """

    per_device_train_batch_size: int = field(default=8, metadata={"help": "micro-batch per device"})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "micro-batches per optimizer step"}
    )
    fp16: bool = field(default=False, metadata={"help": "float16 autocast + grad scaler"})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations"})
    checkpoint_layers: int = field(
        default=0, metadata={"help": "recompute only the first k encoder layers (0: none)"}
    )
    dataloader_num_workers: int = field(default=0, metadata={"help": "data-loader processes"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    warmup_steps: int = field(default=500, metadata={"help": "linear warm-up steps"})
    num_train_epochs: float = field(default=3.0, metadata={"help": "epochs"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip norm; 0 turns it off"})
    optim: str = field(default="adamw_torch", metadata={"help": "TrainingArguments.optim"})
    group_by_length: bool = field(default=True, metadata={"help": "length-grouped batches"})
    max_memory_gb: float | None = field(
        default=None, metadata={"help": "GiB per GPU; None: no cap"}
    )
    accumulation_steps: InitVar[int | None] = None  # alias, see the class docstring
    mixed_precision: InitVar[bool | None] = None  # fp16 or bf16, see the class docstring
    adaptive_batching: bool = field(default=True, metadata={"help": "batch follows length"})
    sequence_length_percentile: float = field(
        default=95.0, metadata={"help": "duration percentile in (0, 100]"}
    )
    alpha_constant: float = field(default=1.2, metadata={"help": "analytic activation factor"})
    bucket_duration_bins: list[float] = field(
        default_factory=list, metadata={"help": "bucket upper edges, seconds"}
    )
    bucket_batch_sizes: list[int] = field(
        default_factory=list, metadata={"help": "batch limit per bucket"}
    )
    fixed_batch_accumulation_steps: int | None = field(
        default=None, metadata={"help": "accumulation with the fixed per-device batch"}
    )

    def __post_init__(
        self, accumulation_steps: int | None = None, mixed_precision: bool | None = None
    ) -> None:
        if accumulation_steps is not None:
            if not _is_int(accumulation_steps) or accumulation_steps < 1:
                raise ConfigError(
                    f"TrainingConfig.accumulation_steps={accumulation_steps!r}: use an integer of "
                    "1 or more."
                )
            if self.gradient_accumulation_steps not in (1, accumulation_steps):
                raise ConfigError(
                    f"TrainingConfig.accumulation_steps={accumulation_steps!r} disagrees with "
                    f"gradient_accumulation_steps={self.gradient_accumulation_steps!r}; they are "
                    "the same setting, give only one of them."
                )
            self.gradient_accumulation_steps = accumulation_steps
        if mixed_precision is not None:
            if not isinstance(mixed_precision, bool):
                raise ConfigError(
                    f"TrainingConfig.mixed_precision={mixed_precision!r}: use true or false."
                )
            if mixed_precision and not (self.fp16 or self.bf16):
                self.fp16 = True
            elif not mixed_precision and (self.fp16 or self.bf16):
                flag = "fp16" if self.fp16 else "bf16"
                raise ConfigError(
                    f"TrainingConfig.mixed_precision=False contradicts {flag}=True; drop one of them."
                )
        self._validate()

    def _validate(self) -> None:
        def bad(name: str, what: str) -> ConfigError:
            return ConfigError(f"TrainingConfig.{name}={getattr(self, name)!r}: {what}")

        for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise bad(name, "use an integer of 1 or more.")
        for name in ("dataloader_num_workers", "warmup_steps", "checkpoint_layers"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise bad(name, "use an integer of 0 or more.")
        for name in (
            "fp16",
            "bf16",
            "gradient_checkpointing",
            "group_by_length",
            "adaptive_batching",
        ):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "use true or false.")
        if self.checkpoint_layers and self.gradient_checkpointing:
            raise ConfigError(
                f"TrainingConfig.checkpoint_layers={self.checkpoint_layers} with "
                "gradient_checkpointing=True: the latter checkpoints every layer; set one of them."
            )
        if self.fp16 and self.bf16:
            raise ConfigError(
                "TrainingConfig.fp16 and TrainingConfig.bf16 are both True; pick one precision "
                "(bf16 needs compute capability 8.0 or newer, e.g. A100, L4, H100)."
            )
        for name in ("learning_rate", "num_train_epochs", "alpha_constant"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise bad(name, "use a positive number.")
        if not _is_number(self.max_grad_norm) or self.max_grad_norm < 0:
            raise bad("max_grad_norm", "use a number of 0 (no clipping) or more.")
        if self.max_memory_gb is not None and (
            not _is_number(self.max_memory_gb) or self.max_memory_gb <= 0
        ):
            raise bad("max_memory_gb", "use a positive number of GiB, or None for no cap.")
        percentile = self.sequence_length_percentile
        if not _is_number(percentile) or not 0 < percentile <= 100:
            raise bad("sequence_length_percentile", "use a percentile above 0 and at most 100.")
        if not isinstance(self.optim, str) or not self.optim:
            raise bad("optim", "use a TrainingArguments optimizer name such as 'adamw_torch'.")
        self._validate_buckets()

    def _validate_buckets(self) -> None:
        bins, sizes = self.bucket_duration_bins, self.bucket_batch_sizes
        if len(bins) != len(sizes):
            raise ConfigError(
                f"TrainingConfig.bucket_duration_bins has {len(bins)} entries but "
                f"bucket_batch_sizes has {len(sizes)}; give one batch size per bucket."
            )
        if any(not _is_number(b) or b <= 0 for b in bins) or list(bins) != sorted(bins):
            raise ConfigError(
                f"TrainingConfig.bucket_duration_bins={bins!r}: use positive seconds in "
                "increasing order."
            )
        if any(not _is_int(s) or s < 1 for s in sizes):
            raise ConfigError(
                f"TrainingConfig.bucket_batch_sizes={sizes!r}: every batch size must be an "
                "integer of 1 or more."
            )

    @classmethod
    def from_plan(cls, plan: Plan, **overrides: Any) -> TrainingConfig:
        """Convert a plan into the seed's config.

        ``per_device_train_batch_size`` is the plan's smallest bucket batch: the fixed batch a
        plain Hugging Face Trainer can use for any utterance up to the plan's longest. The
        buckets are kept in ``bucket_duration_bins``/``bucket_batch_sizes`` for asrfit's
        length-aware sampler. ``gradient_accumulation_steps`` is the plan's, which targets
        the effective batch of the bucketed batches; ``fixed_batch_accumulation_steps`` is
        :meth:`Plan.fixed_batch_accumulation_steps`, which keeps the same target with the
        fixed batch (``per_device_train_batch_size x accumulation x world size``).

        Args:
            plan: The plan.
            **overrides: Fields to set instead of the defaults (e.g. ``learning_rate``).

        Returns:
            The config.

        Raises:
            ConfigError: When an override is not a field or not valid.
        """
        setup = plan.setup
        if setup.precision is Precision.PURE_BF16:
            logger.warning(
                "plan %s uses pure bf16 weights; TrainingArguments(bf16=True) autocasts over fp32 "
                "weights instead, which needs more memory than the plan predicts.",
                plan.model,
            )
        values: dict[str, Any] = {
            "per_device_train_batch_size": plan.min_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "fp16": setup.precision is Precision.FP16,
            "bf16": setup.precision in (Precision.BF16, Precision.PURE_BF16),
            "gradient_checkpointing": setup.gradient_checkpointing,
            "checkpoint_layers": setup.checkpoint_layers,
            "dataloader_num_workers": plan.data.num_workers,
            "optim": HF_OPTIMIZERS[setup.optimizer],
            "max_memory_gb": plan.usable_bytes / GIB,
            "adaptive_batching": len(plan.buckets) > 1,
            # duration ranges only (a 2-D plan's smallest limit per range: safe for any transcript)
            "bucket_duration_bins": plan.duration_limits()[0],
            "bucket_batch_sizes": plan.duration_limits()[1],
            "fixed_batch_accumulation_steps": plan.fixed_batch_accumulation_steps(),
        }
        known = {f.name for f in dataclasses.fields(cls)} | {
            "accumulation_steps",
            "mixed_precision",
        }
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(
                f"TrainingConfig.from_plan: unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known fields are {', '.join(sorted(known))}."
            )
        values.update(overrides)
        if "accumulation_steps" in overrides and "gradient_accumulation_steps" not in overrides:
            values.pop("gradient_accumulation_steps")
        if "mixed_precision" in overrides and not overrides["mixed_precision"]:
            values.update(fp16=False, bf16=False)
        return cls(**values)

    def to_training_arguments(
        self, memory_budget_sampler: bool = False, length_column: str | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for ``transformers.TrainingArguments`` (without ``output_dir``).

        ``TrainingArguments(output_dir="out", **config.to_training_arguments())`` then
        ``Trainer(model, args, train_dataset=..., data_collator=...).train()`` trains the plan
        with a fixed batch of ``per_device_train_batch_size`` and
        ``fixed_batch_accumulation_steps``. With ``memory_budget_sampler=True`` (for
        :class:`asrfit.train.hf.MemoryBudgetTrainer`, whose batches follow the plan's
        buckets) the accumulation is the plan's ``gradient_accumulation_steps`` and length
        grouping is off (the sampler groups). ``remove_unused_columns`` is False: a speech
        collator needs the raw audio and text columns, which the model's ``forward`` does
        not name (the Trainer would drop them).

        Only names the installed transformers accepts are returned: gradient checkpointing
        goes to ``activation_checkpointing`` where that replaces ``gradient_checkpointing``
        (transformers 5), and length grouping to ``train_sampling_strategy="group_by_length"``
        where that replaces ``group_by_length``. The seed trainer's own fields are left out.

        Length grouping (``group_by_length``) needs a length per utterance, which transformers
        cannot infer from audio (it looks for ``input_ids``): it is turned on only with
        ``length_column``, a dataset column of lengths (samples or seconds;
        :func:`asrfit.train.hf.add_length_column` adds one), and is off otherwise (logged).

        Args:
            memory_budget_sampler: Whether asrfit's sampler forms the batches. (Default: False)
            length_column: The training dataset's column of utterance lengths, for
                length-grouped batches. (Default: none: batches are not grouped)

        Returns:
            The keyword arguments.

        Raises:
            ConfigError: When ``optim`` is not an optimizer name the installed transformers knows.
        """
        from transformers import TrainingArguments
        from transformers.training_args import OptimizerNames

        names = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
        choices = [o.value for o in OptimizerNames]
        if self.optim not in choices:
            raise ConfigError(
                f"TrainingConfig.optim={self.optim!r} is not a TrainingArguments optimizer; use one "
                f"of {', '.join(choices)}."
            )
        kwargs = {name: getattr(self, name) for name in _SAME_NAME_ARGUMENTS if name in names}
        if not memory_budget_sampler and self.fixed_batch_accumulation_steps is not None:
            kwargs["gradient_accumulation_steps"] = self.fixed_batch_accumulation_steps
        if "remove_unused_columns" in names:
            kwargs["remove_unused_columns"] = False
        group_by_length = self.group_by_length and not memory_budget_sampler
        if group_by_length and length_column is None:
            logger.info(
                "batches are not grouped by length: transformers cannot infer the length of an "
                "audio sample; pass length_column= with a column of lengths "
                "(asrfit.train.hf.add_length_column adds one) to group them."
            )
            group_by_length = False
        if group_by_length and "length_column_name" in names:
            kwargs["length_column_name"] = length_column
        if self.checkpoint_layers:
            logger.warning(
                "checkpoint_layers=%d has no TrainingArguments name: every layer is "
                "checkpointed instead (less memory than planned, slower). For the first %d "
                "only, call asrfit.models.checkpointing.checkpoint_first_layers(model, %d) and "
                "leave gradient checkpointing off in TrainingArguments.",
                self.checkpoint_layers,
                self.checkpoint_layers,
                self.checkpoint_layers,
            )
        every = self.gradient_checkpointing or self.checkpoint_layers > 0
        if "activation_checkpointing" in names:
            kwargs["activation_checkpointing"] = every
        elif "gradient_checkpointing" in names:
            kwargs["gradient_checkpointing"] = every
        if "group_by_length" in names:
            kwargs["group_by_length"] = group_by_length
        elif group_by_length and "train_sampling_strategy" in names:
            kwargs["train_sampling_strategy"] = "group_by_length"
        elif group_by_length:
            logger.warning(
                "this transformers has no length-grouped sampler; group_by_length is ignored."
            )
        return kwargs

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows for a table."""
        precision = "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"
        rows = [
            ("Batch per device", str(self.per_device_train_batch_size)),
            ("Gradient accumulation", str(self.gradient_accumulation_steps)),
            ("Precision", precision),
            ("Gradient checkpointing", _checkpointing_words(self)),
            (
                "Optimizer",
                f"{self.optim}, lr {self.learning_rate:g}, {self.warmup_steps} warm-up steps",
            ),
            ("Data-loader workers", str(self.dataloader_num_workers)),
            (
                "Memory budget",
                "-" if self.max_memory_gb is None else f"{self.max_memory_gb:.2f} GiB",
            ),
        ]
        if self.bucket_duration_bins:
            buckets = ", ".join(
                f"<={b:g} s: {s}"
                for b, s in zip(self.bucket_duration_bins, self.bucket_batch_sizes, strict=True)
            )
            rows.append(("Bucket batches", buckets))
        return rows


def _get_accumulation_steps(self: TrainingConfig) -> int:
    return self.gradient_accumulation_steps


def _set_accumulation_steps(self: TrainingConfig, value: int) -> None:
    self.gradient_accumulation_steps = value


def _get_mixed_precision(self: TrainingConfig) -> bool:
    return bool(self.fp16 or self.bf16)


def _set_mixed_precision(self: TrainingConfig, value: bool) -> None:
    if not value:
        self.fp16 = self.bf16 = False
    elif not (self.fp16 or self.bf16):
        self.fp16 = True


# The init-only aliases become properties once the dataclass has read their defaults.
TrainingConfig.accumulation_steps = property(  # type: ignore[assignment]
    _get_accumulation_steps, _set_accumulation_steps, doc="Alias of gradient_accumulation_steps."
)
TrainingConfig.mixed_precision = property(  # type: ignore[assignment]
    _get_mixed_precision, _set_mixed_precision, doc="fp16 or bf16; False clears both."
)
# ``dataclasses.replace`` re-passes every InitVar in the field table, read back from the
# object: a stale alias would then contradict the field being replaced. The aliases are for
# the constructor only, so they leave the table (the generated ``__init__`` keeps them).
for _alias in ("accumulation_steps", "mixed_precision"):
    del TrainingConfig.__dataclass_fields__[_alias]


__all__ = ["HF_OPTIMIZERS", "TrainingConfig"]


def _checkpointing_words(config: TrainingConfig) -> str:
    if config.checkpoint_layers:
        return f"first {config.checkpoint_layers} encoder layers"
    return "on" if config.gradient_checkpointing else "off"
