"""Partial activation checkpointing: recompute the first ``k`` of a model's encoder layers.

``gradient_checkpointing_enable()`` (transformers) checkpoints every layer. Between none
(most memory, no recompute) and all (least memory, about one extra forward pass), the first
``k`` of ``L`` encoder layers trade one layer's saved activations for one layer's recompute
each.

Which layers: **the first k**. Every encoder layer of these models keeps the same saved
activations for a batch (same frames, same width), so any ``k`` layers save the same bytes
at the end of the forward pass. They differ in when the recompute happens: the backward
pass reaches the first layers last, when the activations of the layers above them are
already freed, so re-running a first layer adds its activations on top of little. Re-running
a *last* layer happens at the start of the backward pass, on top of the saved activations of
every non-checkpointed layer below it: that adds one layer's activations to the peak.

How: the chosen layers' own per-layer flag. transformers' ``GradientCheckpointingLayer``
(every encoder layer of wav2vec2, HuBERT, WavLM, Whisper and Parakeet in transformers 5)
checkpoints its ``forward`` when its instance has ``gradient_checkpointing = True``; asrfit's
Conformer encoder (``per_layer_checkpointing = True``) reads the same flag per block. Both
run ``torch.utils.checkpoint`` non-reentrant, as the simulator does.
"""

from __future__ import annotations

import functools
import sys

from torch import nn
from torch.utils.checkpoint import checkpoint

from asrfit.errors import ConfigError


def _flag_checkpointable(owner: nn.Module, layers: nn.ModuleList) -> bool:
    if getattr(owner, "per_layer_checkpointing", False):
        return True
    # Looked up, not imported: importing transformers' modelling code costs about 2 s, and
    # when it was never imported no layer can be one of its classes (a warm plan needs it not).
    module = sys.modules.get("transformers.modeling_layers")
    layer_class = getattr(module, "GradientCheckpointingLayer", None)
    return layer_class is not None and all(isinstance(m, layer_class) for m in layers)


def encoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's encoder layer stack: ``(dotted name, layers)``.

    The stack is the longest ``ModuleList`` of per-layer-checkpointable blocks whose name
    says "encoder" (or the only such list when none does).

    Raises:
        ConfigError: When the model has no such stack.
    """
    found: list[tuple[str, nn.ModuleList]] = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        owner = modules.get(name.rpartition(".")[0], model)
        if _flag_checkpointable(owner, module):
            found.append((name, module))
    named = [f for f in found if "encoder" in f[0] and "decoder" not in f[0]]
    pool = named or (found if len(found) == 1 else [])
    if not pool:
        seen = ", ".join(n for n, _ in found) or "none"
        raise ConfigError(
            f"{type(model).__name__}: no encoder layer stack to checkpoint layer by layer "
            f"(checkpointable layer lists: {seen}); set checkpoint_layers to 0 and use "
            "gradient_checkpointing (every layer) instead."
        )
    return max(pool, key=lambda f: len(f[1]))


def encoder_layer_count(model: nn.Module) -> int:
    """Number of encoder layers that :func:`checkpoint_first_layers` can checkpoint."""
    return len(encoder_layers(model)[1])


def checkpoint_first_layers(model: nn.Module, count: int) -> list[str]:
    """Checkpoint the first ``count`` encoder layers (the rest keep their activations).

    Args:
        model: A model with an encoder layer stack (see :func:`encoder_layers`).
        count: Layers to checkpoint, from the first; 0 turns per-layer checkpointing off.

    Returns:
        The dotted names of the checkpointed layers.

    Raises:
        ConfigError: When ``count`` is negative or more than the encoder has layers.
    """
    name, layers = encoder_layers(model)
    if not 0 <= count <= len(layers):
        raise ConfigError(
            f"checkpoint_layers={count!r}: {type(model).__name__} has {len(layers)} encoder "
            f"layers ({name}); use 0 to {len(layers)}."
        )
    func = functools.partial(checkpoint, use_reentrant=False)
    chosen = []
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i < count
        if i < count:
            layer._gradient_checkpointing_func = func
            chosen.append(f"{name}.{i}")
    return chosen


def layer_is_checkpointed(layer: nn.Module) -> bool:
    """Whether ``layer`` recomputes its forward in backward (its per-layer flag, in training)."""
    return bool(getattr(layer, "gradient_checkpointing", False)) and layer.training


__all__ = [
    "checkpoint_first_layers",
    "encoder_layer_count",
    "encoder_layers",
    "layer_is_checkpointed",
]
