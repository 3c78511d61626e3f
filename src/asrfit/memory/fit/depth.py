"""A step's memory at full depth from traces at a few reduced depths.

Repeated blocks (encoder layers, decoder layers) add the same storages per layer, so each
quantity of a traced step that is a sum over live blocks (each phase's peak, each category at
the peak, parameters, gradients, optimizer state, FLOPs, the count of each kernel cost row, the
count of each block size live at the peak) is linear in the number of layers of each kind.
The step's peak is the max over phases, so each phase's peak is extrapolated separately and
the max taken.

The layers of a model are grouped: per layer stack (a ``ModuleList`` of checkpointable layers,
outside the convolutional feature encoder), layers identical to the stack's most common one
(same class, same parameter and buffer shapes) are the repeated part, split by whether the
layer recomputes its forward (partial checkpointing: the first ``k`` checkpointed, the rest
plain). Every other layer (e.g. WavLM's first layer with its relative position bias) and every
module outside the stacks is kept as it is, and so is a group of fewer than 3 layers. With
``n`` groups of ``L_i >= 3`` layers, the step is traced with every group at ``b`` layers (2,
or 1 for a lone group of 3), with each group at ``b + 1`` in turn (``n + 1`` traces, the
linear model) and once more as a check (every group at ``b + 1``, or ``b + 2`` when
``n = 1``); the check trace must equal the linear model's prediction within ``tolerance``,
else the full model is traced (``assumptions`` says which).

Each reduced trace builds the model at the depth it needs, not whole and then pruned, where
the adapter has a config, and checks the build against the full model's layout
(:mod:`asrfit.memory.fit.reduced`); a build that differs is traced from the full build instead.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import torch
from torch import nn

from asrfit.memory.cuda.allocator import segment_overhead_bytes
from asrfit.memory.fit.reduced import (
    Layout,
    Mismatch,
    build_depths,
    config_values,
    depth_fields,
    full_layout,
    is_prefix,
    layer_groups,
    layout,
)
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import StepMemory, simulate_step
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.steptime.roofline import StepCost

BASE = 2  # layers per group in the smallest trace (at 1, the peak may sit in another phase)
TOLERANCE = 1e-6  # relative, on each checked quantity (exact for identical layers)
COST_TOLERANCE = 1e-2  # on the kernel rows whose count is not linear (time model only)


def _first_grad_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.requires_grad else None
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_grad_tensor(v)
            if t is not None:
                return t
    if isinstance(value, dict):
        return _first_grad_tensor(list(value.values()))
    return None


def _label_regions(model: nn.Module, stacks: list[nn.ModuleList], tracker: Any) -> None:
    """Move ``tracker.region`` along the model: before, inside and after each layer stack,
    in the forward pass (module hooks) and in the backward pass (hooks on the gradients of
    each stack's input and output), and at each passage between checkpointed and plain
    layers inside a stack. The labels do not depend on the depth, so each region's peak is at
    the same instant of the step at every depth."""

    def label(name: str) -> Any:
        def hook(_grad: torch.Tensor) -> None:
            tracker.region = name

        return hook

    def root(_module: nn.Module, _args: Any) -> None:
        if tracker.phase == "forward":
            tracker.region = "pre"

    model.register_forward_pre_hook(root)
    for k, stack in enumerate(stacks):

        def enter(_m: nn.Module, args: Any, kwargs: Any, k: int = k) -> None:
            if tracker.phase == "forward":
                tracker.region = f"s{k}"
                t = _first_grad_tensor((args, kwargs))
                if t is not None:
                    t.register_hook(label(f"below{k}"))

        def leave(_m: nn.Module, _args: Any, output: Any, k: int = k) -> None:
            if tracker.phase == "forward":
                tracker.region = f"post{k}"
                t = _first_grad_tensor(output)
                if t is not None:
                    t.register_hook(label(f"bwd-s{k}"))

        stack[0].register_forward_pre_hook(enter, with_kwargs=True)
        stack[-1].register_forward_hook(leave)
        # Where the stack passes from checkpointed layers to plain ones (partial
        # checkpointing), a region of its own: the backward of the plain layers and the
        # recompute of the checkpointed ones peak at different instants, each linear in the
        # layer counts, their max is not.
        flags = [bool(getattr(m, "gradient_checkpointing", False)) for m in stack]
        cuts = [i for i in range(1, len(stack)) if flags[i] != flags[i - 1]]
        for j, i in enumerate(cuts, start=1):

            def cross(_m: nn.Module, args: Any, kwargs: Any, name: str = f"s{k}.{j}") -> None:
                if tracker.phase == "forward":
                    tracker.region = name
                    t = _first_grad_tensor((args, kwargs))
                    if t is not None:
                        t.register_hook(label(f"bwd-{name}"))

            stack[i].register_forward_pre_hook(cross, with_kwargs=True)


def _pruner(counts: dict[str, int], full: Layout, depths: dict[str, int]) -> Any:
    """Keep the first ``counts[group]`` layers of each group; check a reduced build first."""

    def prune(model: nn.Module, tracker: Any) -> None:
        if depths and not is_prefix(layout(model, list(full.stacks)), full, depths):
            raise Mismatch(", ".join(f"{n} at {d}" for n, d in depths.items()))
        modules = dict(model.named_modules())
        drop: dict[str, set[int]] = {n: set() for n in full.stacks}
        for key, idx in full.groups:
            drop[key.rpartition(":")[0]].update(idx[counts[key] :])
        for stack, gone in drop.items():
            ml = modules[stack]
            kept = [m for i, m in enumerate(ml) if i not in gone]
            ml._modules.clear()
            for i, m in enumerate(kept):
                ml._modules[str(i)] = m
        _label_regions(model, [modules[name] for name in drop], tracker)

    return prune


def _lin(points: list[float], design: list[list[int]], real: list[int]) -> tuple[float, float]:
    """Linear prediction at ``real`` from base + unit steps, and the check point's residual."""
    base, first = points[0], design[0]
    slopes = [points[i + 1] - base for i in range(len(real))]

    def at(x: list[int]) -> float:
        return base + sum(s * (xi - f) for s, xi, f in zip(slopes, x, first, strict=True))

    check = design[-1]
    return at(real), points[-1] - at(check)


class Nonlinear(Exception):
    """A quantity's check trace departs from the linear model."""


def scaled_step(
    adapter: StepAdapter,
    batch: BatchShape,
    setup: Setup | None = None,
    *,
    target: str = "cuda",
    steps: int = 2,
    tolerance: float = TOLERANCE,
    min_saving: int = 2,
    worth: float = 0.0,
    optimizer_step: bool = True,
    forward_backward: bool = True,
    keep_tape: list | None = None,
    rows: Any = None,
) -> StepMemory:
    """:func:`asrfit.memory.simulate.simulate_step` from traces at reduced depths.

    Falls back to the full trace (and says so in ``assumptions``) when the model has no
    repeated layers, when the reduced traces would not save ``min_saving`` layers, when the
    repeated layers are fewer than ``worth`` times the layers of all reduced traces together
    (each reduced trace also repeats every other part of the model: the planner asks for 2),
    or when the check trace is not on the linear model; and, after a first scaled step whose
    reduced traces made more kernel calls than the full model's trace would, for every later
    step of the same adapter and setup. A full trace appends its tape to ``keep_tape``
    (:mod:`asrfit.memory.tape`); a step from reduced traces has none, but each reduced trace
    is first asked of ``rows`` (``rows.replayed(row, detail)``: replayed from two tapes of
    that reduced model at other batches, or None) and, when traced, handed to it
    (``rows.keep(row, tape)``); a row is a reduced model's layer counts and how it was built.
    """
    setup = setup or Setup()

    def run(tapes: list | None = keep_tape, **reduced: Any) -> StepMemory:  # the full trace
        return simulate_step(
            adapter,
            batch,
            setup,
            target=target,
            steps=steps,
            optimizer_step=optimizer_step,
            forward_backward=forward_backward,
            keep_tape=tapes,
            **reduced,
        )

    full = full_layout(adapter, batch, setup, target)
    groups = full.groups
    # A group of 3 or more layers is a variable, traced at ``b`` and ``b + 1`` layers (and
    # ``b + 2`` in the check when it is the only one); a smaller group is kept whole (as a
    # variable, two checkpointed layers would be traced at one, where the backward peak sits
    # in another place: not linear, and a full trace).
    counts = {k: len(idx) for k, idx in groups}
    keys = [k for k in counts if counts[k] >= 3]
    n = len(keys)
    real = [counts[k] for k in keys]
    bases = [min(BASE, r - (2 if n == 1 else 1)) for r in real]
    check = [b + 1 for b in bases] if n >= 2 else [b + 2 for b in bases]
    design = [bases] + [[b + (j == i) for j, b in enumerate(bases)] for i in range(n)] + [check]
    traced = max((sum(d) for d in design), default=0)
    fixed = {k: c for k, c in counts.items() if k not in keys}
    total = sum(sum(d) for d in design)
    if not n or sum(real) - traced < min_saving or sum(real) < worth * total:
        step = run()
        step.assumptions.append("depth: full trace (no repeated layers to scale)")
        return step
    memo = (id(adapter), repr(setup), forward_backward)
    if memo in _WHOLE_CHEAPER:
        reduced, whole = _WHOLE_CHEAPER[memo][1:]
        step = run()
        step.assumptions.append(
            f"depth: full trace (the reduced traces made {reduced:,} kernel calls, the full "
            f"model {whole:,})"
        )
        return step
    fields = depth_fields(adapter, batch, setup, target)

    def trace(counts: dict[str, int], depths: dict[str, int], detail: dict) -> StepMemory:
        row = (tuple(sorted(counts.items())), bool(depths))
        step = None if rows is None else rows.replayed(row, detail)
        if step is not None:
            return step
        tapes: list = []
        with config_values([(*fields[k], v) for k, v in depths.items()]):
            step = run(tapes, prune=_pruner(counts, full, depths), detail=detail)
        if rows is not None and tapes:
            rows.keep(row, tapes[0])
        return step

    runs, details = [], []
    built = "at reduced depth" if fields else "whole (no config attribute sets a stack's depth)"
    for d in design:
        layer_counts = {**fixed, **dict(zip(keys, d, strict=True))}
        depths = {
            k: v
            for k, v in build_depths(full, layer_counts, setup.checkpoint_layers).items()
            if k in fields
        }
        s: dict = {}
        try:
            step = trace(layer_counts, depths, s)
        except Mismatch as e:  # this setup builds otherwise at reduced depth: build whole
            built, fields, s = f"whole (a reduced build differed: {e})", {}, {}
            step = trace(layer_counts, {}, s)
        runs.append(step)
        details.append(s)
    try:
        step = _extrapolate(runs, details, design, real, keys, tolerance)
    except Nonlinear as e:
        step = run()
        step.assumptions.append(f"depth: full trace ({e} is not linear in the layer count)")
        step.trace_seconds += sum(r.trace_seconds for r in runs)
        return step
    step.assumptions.append(f"depth: reduced traces built {built}")
    # A trace costs about its traced kernel calls, which are linear in the layer counts too:
    # where everything outside the stacks outweighs them, one full trace is cheaper than the
    # reduced ones, from then on.
    calls = [r.traced_calls or sum(row[6] for row in r.cost.rows) for r in runs]
    whole = round(_lin(calls, design, real)[0])
    if sum(calls) > whole:
        _WHOLE_CHEAPER[memo] = (adapter, sum(calls), whole)
    return step


# Per (adapter, setup), this process (keeping the adapter alive, so that its id stays its
# own): the reduced traces made more kernel calls than the full trace would.
_WHOLE_CHEAPER: dict[tuple, tuple[StepAdapter, int, int]] = {}


def whole_cheaper(adapter: StepAdapter) -> list[tuple[str, bool, int, int]]:
    """What this process learned about ``adapter``'s scaled steps: ``(setup repr,
    forward_backward, reduced traces' kernel calls, the full trace's)`` for each setup traced
    whole from now on (for a trace worker to hand back: :func:`learn_whole_cheaper`)."""
    return [
        (key[1], key[2], value[1], value[2])
        for key, value in _WHOLE_CHEAPER.items()
        if key[0] == id(adapter)
    ]


def learn_whole_cheaper(adapter: StepAdapter, entries: list[tuple[str, bool, int, int]]) -> None:
    """Take :func:`whole_cheaper` entries learned in another process for ``adapter``."""
    for setup_repr, forward_backward, reduced, whole in entries:
        _WHOLE_CHEAPER.setdefault(
            (id(adapter), setup_repr, bool(forward_backward)), (adapter, int(reduced), int(whole))
        )


def _row_key(row: list) -> tuple:
    """A cost row without its count: its six figures and, for an attention row, its shape."""
    return (*row[:6], tuple(row[7]) if len(row) > 7 else None)


def _extrapolate(
    runs: list[StepMemory],
    details: list[dict],
    design: list[list[int]],
    real: list[int],
    keys: list[str],
    tolerance: float,
) -> StepMemory:
    def value(name: str, points: list[float], tol: float = tolerance) -> int:
        v, residual = _lin(points, design, real)
        scale = max(abs(p) for p in points) or 1.0
        if abs(residual) > tol * scale:
            raise Nonlinear(name)
        return round(v)

    last = runs[-1]
    # Each region's peak is one instant of the step at every depth: linear. A phase's peak is
    # the max over its regions, the step's the max over all.
    regions = sorted(set().union(*(d["regions"] for d in details)))
    region_peaks = {
        w: value(f"the {w} peak", [d["regions"].get(w, (0,))[0] for d in details]) for w in regions
    }
    phase_peaks: dict[str, int] = {}
    for w, v in region_peaks.items():
        ph = w.partition("@")[0]
        phase_peaks[ph] = max(phase_peaks.get(ph, 0), v)
    where = max(region_peaks, key=region_peaks.get)
    peak_phase = where.partition("@")[0]
    if any(where not in d["regions"] for d in details):
        raise Nonlinear(f"the peak's place ({where})")
    # What a trace adds to its peak after the event log (the CPU RNG states of checkpointed
    # layers, asrfit.memory.simulate): the same at every depth.
    extra = {
        r.peak_bytes - max(v[0] for v in d["regions"].values())
        for r, d in zip(runs, details, strict=True)
    }
    if len(extra) != 1:
        raise Nonlinear("the bytes added after the trace")
    extra_bytes = extra.pop()
    at = [d["regions"][where] for d in details]
    breakdown = {
        c: value(f"category {c}", [b.get(c, 0) for _, b, _ in at]) for c in last.breakdown_bytes
    }
    breakdown["activations"] += extra_bytes
    peak = region_peaks[where] + extra_bytes
    step_peaks = [
        value(f"step {i + 1}'s peak", [r.step_peaks_bytes[i] for r in runs])
        for i in range(len(last.step_peaks_bytes) - 1)
    ] + [peak]
    counts = [Counter(sizes) for _, _, sizes in at]
    block_sizes: list[int] = []
    for size in sorted(set().union(*counts)):
        k = value(f"blocks of {size} bytes at the peak", [c.get(size, 0) for c in counts])
        block_sizes.extend([size] * k)
    try:
        raw = value("the raw peak", [r.peak_raw_bytes for r in runs])
    except Nonlinear:  # the unrounded peak (CPU allocators only) may sit elsewhere: bounded
        raw = peak
    rows: dict[tuple, list[int]] = {}
    for j, r in enumerate(runs):
        for row in r.cost.rows:
            rows.setdefault(_row_key(row), [0] * len(runs))[j] += row[6]
    cost_rows = []
    # Rows whose count is not linear (a kernel over all parameters at once, whose size grows
    # with the depth): per (phase, kind, dtype), their totals, extrapolated as one row.
    odd: dict[tuple, list[list[int]]] = {}
    odd_keys: set[tuple] = set()
    for key, cs in rows.items():
        try:
            c = value(f"kernel count {key[:2]}", cs)
        except Nonlinear:
            odd_keys.add(key)
            totals = odd.setdefault(key[:3], [[0] * len(runs) for _ in range(4)])
            for j, n in enumerate(cs):
                for t, f in enumerate((key[3], key[4], key[5], 1)):
                    totals[t][j] += f * n
            continue
        if c:
            cost_rows.append([*key[:6], c, *([list(key[6])] if key[6] else [])])
    unscaled = []
    for key, totals in odd.items():
        # (the bytes of a few backward copies vary between two traces of the same step: where
        # these totals are not linear, the deepest trace's rows are kept as they are)
        try:
            flops, nbytes, tensors, calls = (
                value(f"kernels {key[:2]}", t, COST_TOLERANCE) for t in totals
            )
        except Nonlinear:
            unscaled.append("/".join(key))
            cost_rows.extend(
                list(r)
                for r in runs[-1].cost.rows
                if tuple(r[:3]) == key and _row_key(r) in odd_keys
            )
            continue
        if calls > 0:
            cost_rows.append([*key, flops // calls, nbytes // calls, round(tensors / calls), calls])
    transient = {r.largest_transient_bytes for r in runs}
    if len(transient) != 1:
        raise Nonlinear("the largest workspace")
    layers = ", ".join(f"{k} x{n}" for k, n in zip(keys, real, strict=True))
    # the first encoder layer is itself at every depth: its kernels, where the traces agree
    # (the others' marks, and what any layer leaves live, do not scale to the full depth)
    first_layers = {json.dumps(r.layer_costs[0].rows) if r.layer_costs else "" for r in runs}
    return StepMemory(
        model=last.model,
        setup=last.setup,
        batch=last.batch,
        target=last.target,
        peak_bytes=peak,
        peak_raw_bytes=raw,
        breakdown_bytes=breakdown,
        step_peaks_bytes=step_peaks,
        peak_phase=peak_phase,
        largest_transient_bytes=transient.pop(),
        peak_segment_bytes=peak + segment_overhead_bytes(block_sizes),
        peak_expandable_bytes=peak + segment_overhead_bytes(block_sizes, expandable=True),
        phase_peaks_bytes=phase_peaks,
        optimizer_state_bytes=value("optimizer state", [r.optimizer_state_bytes for r in runs]),
        flops=value("FLOPs", [r.flops for r in runs]),
        assumptions=sorted(set().union(*(r.assumptions for r in runs)))
        + [f"depth: scaled from {len(runs)} traces at reduced depth to {layers}"]
        + [f"depth: kernel rows {', '.join(unscaled)} not scaled (time model)"] * bool(unscaled),
        trace_seconds=sum(r.trace_seconds for r in runs),
        cost=StepCost(cost_rows),
        layer_costs=runs[0].layer_costs[:1] if len(first_layers) == 1 else [],
    )


__all__ = ["Nonlinear", "layer_groups", "scaled_step"]
