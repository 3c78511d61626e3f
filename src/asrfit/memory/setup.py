"""A *setup*: precision, checkpointing, optimizer, ZeRO stage, offload and world size."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from asrfit.errors import ConfigError
from asrfit.utils.serialization import JsonDataclass


class Precision(str, Enum):
    """How the step computes. ``bf16``/``fp16`` are autocast over fp32 weights."""

    FP32 = "fp32"
    BF16 = "bf16"  # autocast to bfloat16, fp32 master weights
    FP16 = "fp16"  # autocast to float16 with a GradScaler, fp32 master weights
    PURE_BF16 = "pure_bf16"  # weights, grads and optimizer state all in bfloat16


class OptimizerKind(str, Enum):
    """Optimizers whose state the simulator knows."""

    ADAMW = "adamw"
    ADAMW_8BIT = "adamw8bit"
    ADAFACTOR = "adafactor"
    SGD = "sgd"


@dataclass(frozen=True)
class Setup(JsonDataclass):
    """One training setup. Everything the memory of a step depends on, except the batch."""

    precision: Precision = field(
        default=Precision.FP32, metadata={"help": "fp32, bf16, fp16 or pure_bf16"}
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward"}
    )
    checkpoint_layers: int = field(
        default=0,
        metadata={
            "help": "checkpoint only the first k encoder layers (0: none; not with "
            "gradient_checkpointing, which checkpoints every layer)"
        },
    )
    optimizer: OptimizerKind = field(
        default=OptimizerKind.ADAMW, metadata={"help": "adamw, adamw8bit, adafactor, sgd"}
    )
    freeze_feature_encoder: bool = field(
        default=True, metadata={"help": "freeze wav2vec2-style conv encoders"}
    )
    zero_stage: int = field(
        default=0, metadata={"help": "DeepSpeed ZeRO stage 0-3 (model states by formula)"}
    )
    offload_optimizer: bool = field(
        default=False, metadata={"help": "ZeRO: optimizer state on CPU"}
    )
    offload_params: bool = field(default=False, metadata={"help": "ZeRO-3: parameters on CPU"})
    world_size: int = field(default=1, metadata={"help": "data-parallel processes"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", _coerce(Precision, self.precision, "precision"))
        object.__setattr__(self, "optimizer", _coerce(OptimizerKind, self.optimizer, "optimizer"))
        if (
            isinstance(self.checkpoint_layers, bool)
            or not isinstance(self.checkpoint_layers, int)
            or self.checkpoint_layers < 0
        ):
            raise ConfigError(
                f"checkpoint_layers={self.checkpoint_layers!r}: use an integer of 0 or more "
                "(the first k encoder layers are checkpointed)."
            )
        if self.checkpoint_layers and self.gradient_checkpointing:
            raise ConfigError(
                f"checkpoint_layers={self.checkpoint_layers} with gradient_checkpointing=True: "
                "gradient_checkpointing already checkpoints every layer; set one of them."
            )
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage={self.zero_stage!r}: use 0, 1, 2 or 3.")
        if self.world_size < 1:
            raise ConfigError(f"world_size={self.world_size!r}: use 1 or more processes.")
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError(
                "offload_params needs zero_stage=3 (DeepSpeed offloads parameters only in ZeRO-3)."
            )
        if self.offload_optimizer and self.zero_stage == 0:
            raise ConfigError("offload_optimizer needs zero_stage >= 1 (ZeRO-Offload).")

    def describe(self) -> str:
        """A short human-readable label, e.g. ``bf16+ckpt adamw zero2x4``.

        ``+ckpt`` checkpoints every layer, ``+ckpt4`` the first 4 encoder layers; ZeRO's
        ``+offload`` keeps the optimizer state on the CPU, ``+offload-params`` the parameters.
        """
        parts = [
            self.precision.value
            + ("+ckpt" if self.gradient_checkpointing else "")
            + (f"+ckpt{self.checkpoint_layers}" if self.checkpoint_layers else ""),
            self.optimizer.value,
        ]
        if self.zero_stage:
            off = "+offload" if self.offload_optimizer else ""
            off += "+offload-params" if self.offload_params else ""
            parts.append(f"zero{self.zero_stage}{off}x{self.world_size}")
        elif self.world_size > 1:
            parts.append(f"ddp x{self.world_size}")
        return " ".join(parts)


def _coerce(enum: type[Enum], value: object, name: str) -> Enum:
    if isinstance(value, enum):
        return value
    try:
        return enum(
            str(value).lower().replace("-", "_") if enum is Precision else str(value).lower()
        )
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise ConfigError(f"{name}={value!r} is not known; use one of: {choices}.") from None
