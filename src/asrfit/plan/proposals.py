"""When nothing fits: what would, checked by the simulator with the safety margin kept.

When batch 1 of the longest bucket is over the usable memory with every memory saving the
planner tries (checkpointing, the smallest optimizer state, ZeRO with offload where there
are GPUs to shard over), the plan error proposes:

- **a chunk length**: the longest audio whose batch of 1 fits with the most frugal setup
  (bisection on the fitted cost model, then a fresh two-step simulation at that length,
  shortened by 10 % until its predicted reserved bytes are within usable memory). Longer
  utterances are then chunked at quiet points (``--max-seconds``, :mod:`asrfit.plan.long_audio`).
- **for asrfit's Conformer** (the built-in family), the largest configuration of the same
  family, by parameter count, over ``d_model`` (multiples of 64 whose per-head width is a
  multiple of 8) and the layer count (all, 3/4, 1/2, 1/4 of them), that trains at the
  target batch at the longest bucket on that GPU: each candidate is a fresh two-step
  simulation of the setup the planner's fitted costs put lowest at that batch, whose
  predicted reserved bytes must stay within usable memory (the margin is already taken off
  usable memory). Memory grows with both, so ``d_model`` is bisected per layer count. The
  per-head width matters: PyTorch's fused attention kernels need it a multiple of 8, and
  without them attention keeps its batch x heads x frames x frames scores (a Conformer of
  d_model 1216 with 16 heads and 6 layers, fp16 and Adafactor without checkpointing, was
  predicted to reserve 20.0 GiB on a T4 at 16 x 24.5 s, where one of 1152 reserved 12.4),
  so memory would not grow monotonically with ``d_model`` and bisection would miss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asrfit.memory.cuda.allocator import predict_cuda
from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape

GIB = 2**30
MIN_CHUNK_SECONDS = 1.0


def reserved_by_simulation(
    adapter: Any, batch: BatchShape, setup: Setup, architecture: str | None, expandable: bool
) -> int:
    """Predicted ``max_memory_reserved`` of a fresh two-step simulation (no fitted model)."""
    from asrfit.memory.simulate import simulate_step  # imports torch: only when nothing fits

    step = simulate_step(adapter, batch, setup)
    return predict_cuda(
        step.peak_bytes,
        step.segment_bytes(expandable),
        architecture=architecture,
        expandable_segments=expandable,
    ).reserved_bytes


@dataclass
class Shape:
    """Seconds of audio to model-input steps and labels."""

    input_frames_per_second: float
    labels_per_second: float

    def batch(self, batch_size: int, seconds: float) -> BatchShape:
        """The padded batch of ``batch_size`` utterances of ``seconds``."""
        t = max(1, round(seconds * self.input_frames_per_second))
        return BatchShape(batch_size, t, max(1, math.ceil(seconds * self.labels_per_second)))


def chunk_seconds(
    costs: list[Any],
    usable_bytes: int,
    shape: Shape,
    longest_seconds: float,
    check: Callable[[Setup, BatchShape], int],
) -> tuple[float, Setup] | None:
    """The longest chunk whose batch of 1 fits, and the setup it fits with (None: none does).

    Args:
        costs: The planner's fitted :class:`asrfit.plan.costs.SetupCosts` of every setup tried.
        usable_bytes: Usable memory (the safety margin already taken off).
        shape: Seconds to input steps and labels.
        longest_seconds: The longest bucket edge that did not fit.
        check: ``(setup, batch) -> reserved bytes`` of a fresh simulation.
    """

    def fits(c: Any, seconds: float) -> bool:
        b = shape.batch(1, seconds)
        return c.reserved_bytes(1, b.input_length, b.label_length) <= usable_bytes

    best: tuple[float, Any] | None = None
    for c in costs:
        if not fits(c, MIN_CHUNK_SECONDS):
            continue
        lo, hi = MIN_CHUNK_SECONDS, longest_seconds
        while hi - lo > 0.1:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if fits(c, mid) else (lo, mid)
        if best is None or lo > best[0]:
            best = (lo, c)
    if best is None:
        return None
    seconds, c = math.floor(best[0] * 10) / 10, best[1]
    for _ in range(4):  # the fit is checked by a fresh simulation
        if seconds < MIN_CHUNK_SECONDS:
            return None
        if check(c.setup, shape.batch(1, seconds)) <= usable_bytes:
            return seconds, c.setup
        seconds = math.floor(seconds * 9) / 10
    return None


def _params(d_model: int, layers: int) -> int:
    """Encoder weights of a Conformer block stack, up to the shared constant factor."""
    return layers * d_model * d_model


def largest_conformer(
    config: Any,
    setup: Setup,
    batch: BatchShape,
    usable_bytes: int,
    architecture: str | None,
    expandable: bool = True,
    check: Callable[[Any], int] | None = None,
) -> tuple[Any, int] | None:
    """The largest Conformer of ``config``'s family that fits ``batch`` under ``setup``.

    Args:
        config: A :class:`asrfit.models.conformer.ConformerCTCConfig` that does not fit.
        setup: The most frugal setup that the planner tried.
        batch: The target batch at the longest bucket.
        usable_bytes: Usable memory (the safety margin already taken off).
        architecture: GPU architecture (allocator model).
        expandable: Whether the run uses expandable segments.
        check: ``config -> reserved bytes`` (Default: a fresh two-step simulation).

    Returns:
        ``(config, reserved bytes)`` of the largest that fits, or None when even the
        smallest (64 wide) does not.
    """
    heads = int(config.encoder_attention_heads)
    step = math.lcm(64, 8 * heads)  # multiples of 64 with a per-head width a multiple of 8
    top = max(step, int(config.d_model) // step * step)
    layers0 = int(config.encoder_layers)

    def resized(d_model: int, layers: int) -> Any:
        new = config.__class__.from_dict(
            {**config.to_dict(), "d_model": d_model, "encoder_layers": layers}
        )
        new.architectures = list(getattr(config, "architectures", None) or ["ConformerForCTC"])
        return new

    def reserved(cfg: Any) -> int:
        if check is not None:
            return check(cfg)
        from asrfit.memory.models.adapters import hf_adapter

        return reserved_by_simulation(hf_adapter(cfg), batch, setup, architecture, expandable)

    best: tuple[int, Any, int] | None = None
    for layers in sorted(
        {layers0, max(1, layers0 * 3 // 4), max(1, layers0 // 2), max(1, layers0 // 4)},
        reverse=True,
    ):
        if best is not None and _params(top, layers) <= best[0]:
            continue  # even the widest at this depth is smaller than the best found
        lo, hi, found = 1, top // step, None  # widths lo*step .. hi*step
        while lo <= hi:
            mid = (lo + hi) // 2
            cfg = resized(mid * step, layers)
            got = reserved(cfg)
            if got <= usable_bytes:
                found, lo = (cfg, got), mid + 1
            else:
                hi = mid - 1
        if found is not None:
            size = _params(int(found[0].d_model), layers)
            if best is None or size > best[0]:
                best = (size, found[0], found[1])
    return None if best is None else (best[1], best[2])


def frugal_setup(costs: list[Any], batch: BatchShape) -> Setup:
    """The setup whose fitted costs reserve least at ``batch`` (the target batch, not batch 1:
    there the model states decide, and a setup without checkpointing could win).

    On a tie, the one that checkpoints: for a model whose states are far over the budget the
    optimizer step's peak hides the activations in every fitted cost, and the smaller model
    the proposal looks for will have activations that checkpointing frees.
    """
    shape = (batch.batch_size, batch.input_length, batch.label_length)
    return min(
        costs, key=lambda c: (c.reserved_bytes(*shape), not c.setup.gradient_checkpointing)
    ).setup


def nothing_fits_proposals(
    *,
    adapter: Any,
    profile: Any,
    costs: list[Any],
    usable_bytes: int,
    shape: Shape,
    longest_seconds: float,
    target_batch: int,
    architecture: str | None,
    expandable: bool,
    gpu: str,
) -> list[str]:
    """One line per proposal that the simulator checked (see the module doc)."""

    def check(setup: Setup, batch: BatchShape) -> int:
        return reserved_by_simulation(adapter, batch, setup, architecture, expandable)

    lines = []
    costs = [c for c in costs if c.setup.zero_stage == 0]  # a fresh simulation does not shard
    chunk = chunk_seconds(costs, usable_bytes, shape, longest_seconds, check)
    if chunk is None:
        lines.append(
            f"no chunk length helps: one {MIN_CHUNK_SECONDS:g} s utterance does not fit either "
            "(the model states alone are over the budget)"
        )
    else:
        lines.append(
            f"chunk long audio to {chunk[0]:g} s (--max-seconds {chunk[0]:g}): batch 1 then "
            f"fits with {chunk[1].describe()} (checked by a fresh simulation)"
        )
    if getattr(profile, "family", None) == "asrfit_conformer" and costs:
        config = adapter_config(profile)
        b = shape.batch(target_batch, longest_seconds)
        setup = frugal_setup(costs, b)
        found = largest_conformer(config, setup, b, usable_bytes, architecture, expandable)
        if found is None:
            lines.append(
                f"no Conformer of this family trains {target_batch} x {longest_seconds:g} s on {gpu}"
            )
        else:
            cfg, reserved = found
            lines.append(
                f"a smaller Conformer: d_model {cfg.d_model}, {cfg.encoder_layers} layers "
                f"(was d_model {config.d_model}, {config.encoder_layers}) trains "
                f"{target_batch} x {longest_seconds:g} s ({b.input_length} input steps, "
                f"{b.label_length} labels) on {gpu} with {setup.describe()}, "
                f"predicted to reserve {reserved / GIB:.2f} of {usable_bytes / GIB:.2f} GiB usable "
                "(a fresh simulation; the safety margin kept)"
            )
    return lines


def adapter_config(profile: Any) -> Any:
    """The Conformer config of a model profile."""
    from asrfit.models.conformer import ConformerCTCConfig

    data = {k: v for k, v in dict(profile.config).items() if k != "asrfit_meta"}
    config = ConformerCTCConfig.from_dict(data)
    config.architectures = ["ConformerForCTC"]
    return config
