"""Models built with fewer layers, for :mod:`asrfit.memory.fit.depth`.

A model's repeated layers come in groups (:func:`layer_groups`): per layer stack, the layers
identical to the stack's most common one, split by whether they recompute their forward.
A reduced trace needs the model with only a few of them. Building the whole model and
pruning it costs a full build per trace (a plan traced XLS-R-1B about 150 times), so where
the adapter has a config the model is built at the depth the trace needs: the config
attribute that sets a stack's length is found once per model (:func:`depth_fields`: a
candidate is an integer attribute equal to the stack's length, taken when the model built
with it one lower is the full model with that stack one layer shorter), and each reduced
build is checked against the full model's layout (:func:`is_prefix`) before it is traced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.models.checkpointing import _flag_checkpointable


def _signature(layer: nn.Module) -> tuple:
    return (
        type(layer).__name__,
        tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters()),
        tuple((n, tuple(b.shape)) for n, b in layer.named_buffers()),
    )


def layer_groups(model: nn.Module) -> list[tuple[str, list[int]]]:
    """The repeated layer groups of a model: ``(stack name + ":ckpt"/":plain", layer indices)``."""
    modules = dict(model.named_modules())
    groups = []
    for name, stack in modules.items():
        if not isinstance(stack, nn.ModuleList) or len(stack) < 2 or "conv" in name:
            continue
        owner = modules.get(name.rpartition(".")[0], model)
        if not _flag_checkpointable(owner, stack):
            continue
        sigs = [_signature(m) for m in stack]
        common, _ = Counter(sigs).most_common(1)[0]
        for flag in (True, False):
            idx = [
                i
                for i, m in enumerate(stack)
                if sigs[i] == common and bool(getattr(m, "gradient_checkpointing", False)) is flag
            ]
            if idx:
                groups.append((f"{name}:{'ckpt' if flag else 'plain'}", idx))
    return groups


@dataclass
class Layout:
    """What a built model looks like to depth scaling."""

    groups: list[tuple[str, list[int]]]  # layer_groups(model)
    stacks: dict[str, list[tuple]]  # per stack of a group: each layer's (signature, checkpointed)
    rest: tuple  # the parameters and buffers outside those stacks: (name, shape, dtype, grad)


def layout(model: nn.Module, names: list[str] | None = None) -> Layout:
    """The layout of ``model``; ``names``: the stacks to describe (default: those of its groups)."""
    groups = layer_groups(model)
    if names is None:
        names = sorted({key.rpartition(":")[0] for key, _ in groups})
    modules = dict(model.named_modules())
    stacks = {
        n: [(_signature(m), bool(getattr(m, "gradient_checkpointing", False))) for m in modules[n]]
        for n in names
    }
    inside = tuple(f"{n}." for n in names)
    rest = tuple(
        (n, tuple(t.shape), t.dtype, t.requires_grad)
        for n, t in itertools.chain(model.named_parameters(), model.named_buffers())
        if not n.startswith(inside)
    )
    return Layout(groups, stacks, rest)


def is_prefix(built: Layout, full: Layout, depths: dict[str, int]) -> bool:
    """Whether ``built`` is ``full`` with each stack cut to its first ``depths[stack]`` layers."""
    return built.rest == full.rest and all(
        built.stacks.get(n) == layers[: depths.get(n, len(layers))]
        for n, layers in full.stacks.items()
    )


class Mismatch(Exception):
    """A model built at reduced depth is not the full model's prefix."""


Field = tuple[Any, str]  # (config object, attribute name)


@contextlib.contextmanager
def config_values(values: list[tuple[Any, str, int]]) -> Iterator[None]:
    """Set config attributes while a step is built and traced; restore them after."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in values]
    try:
        for obj, attr, value in values:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def candidates(config: Any, length: int) -> list[Field]:
    """Integer attributes equal to ``length``, on the config and its sub-configs."""
    found, seen = [], set()
    todo = [config]
    while todo:
        obj = todo.pop(0)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            if type(value) is int and value == length:
                found.append((obj, attr))
            elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
                todo.append(value)  # a sub-config (e.g. Parakeet's encoder_config)
    return found


def build_depths(full: Layout, counts: dict[str, int], first_k: int = 0) -> dict[str, int]:
    """Per stack, the layers a build needs so that pruning to ``counts`` keeps the same layers:
    up to the last kept one (layers outside the groups are always kept), and at least the
    ``first_k`` layers a setup checkpoints by count (``Setup.checkpoint_layers``; the build
    checkpoints them before pruning, so it must have them, even when they are all)."""
    grouped: dict[str, set[int]] = {n: set() for n in full.stacks}
    kept: dict[str, set[int]] = {n: set() for n in full.stacks}
    for key, idx in full.groups:
        stack = key.rpartition(":")[0]
        grouped[stack].update(idx)
        kept[stack].update(idx[: counts[key]])
    depths = {}
    for stack, layers in full.stacks.items():
        others = set(range(len(layers))) - grouped[stack]
        flagged = sum(f for _, f in layers)
        need = max(kept[stack] | others, default=0) + 1
        if flagged < len(layers):  # the first k checkpointed: a build needs at least k layers
            need = max(need, flagged)
        if flagged and first_k:
            need = max(need, min(first_k, len(layers)))
        if need < len(layers):
            depths[stack] = need
    return depths


# Per (adapter, setup) and per adapter, this process; each entry keeps its adapter alive, so
# that its id stays its own.
_LAYOUTS: dict[tuple, tuple[StepAdapter, Layout]] = {}
_FIELDS: dict[int, tuple[StepAdapter, dict[str, Field]]] = {}


class _Probe(Exception):
    pass


def built_layout(
    adapter: StepAdapter,
    batch: BatchShape,
    setup: Setup,
    target: str,
    names: list[str] | None = None,
) -> Layout:
    """Build the model as a trace of ``setup`` would (fake mode, checkpointing flags), no trace."""
    found: list[Layout] = []

    def grab(model: nn.Module, _tracker: Any) -> None:
        found.append(layout(model, names))
        raise _Probe

    with contextlib.suppress(_Probe):
        simulate_step(adapter, batch, setup, target=target, steps=1, prune=grab)
    return found[0]


def full_layout(adapter: StepAdapter, batch: BatchShape, setup: Setup, target: str) -> Layout:
    """:func:`built_layout` of the whole model, once per (adapter, setup) in this process."""
    memo = (id(adapter), repr(setup))
    if memo not in _LAYOUTS:
        _LAYOUTS[memo] = (adapter, built_layout(adapter, batch, setup, target))
    return _LAYOUTS[memo][1]


def depth_fields(
    adapter: StepAdapter, batch: BatchShape, setup: Setup, target: str
) -> dict[str, Field]:
    """Per stack, the config attribute that sets its length (stacks without one left out).

    A candidate is taken when the model built with it one lower is the full model with that
    stack one layer shorter (:func:`is_prefix`); a candidate whose build fails, or changes
    anything else, is not. Found once per adapter, without checkpointing (whose flags a
    shorter build may lack).
    """
    if id(adapter) in _FIELDS:
        return _FIELDS[id(adapter)][1]
    setup = dataclasses.replace(setup, gradient_checkpointing=False, checkpoint_layers=0)
    full = full_layout(adapter, batch, setup, target)
    fields: dict[str, Field] = {}
    config = getattr(adapter, "config", None)
    for stack, layers in full.stacks.items() if config is not None else ():
        length = len(layers)
        if length < 3:
            continue
        for obj, attr in candidates(config, length):
            if any(f == (obj, attr) for f in fields.values()):
                continue
            try:
                with config_values([(obj, attr, length - 1)]):
                    small = built_layout(adapter, batch, setup, target, list(full.stacks))
            except Exception:  # noqa: BLE001 - a build that fails rules the candidate out
                continue
            if is_prefix(small, full, {stack: length - 1}):
                fields[stack] = (obj, attr)
                break
    _FIELDS[id(adapter)] = (adapter, fields)
    return fields


__all__ = [
    "Layout",
    "Mismatch",
    "build_depths",
    "config_values",
    "depth_fields",
    "full_layout",
    "is_prefix",
    "layer_groups",
    "layout",
]
