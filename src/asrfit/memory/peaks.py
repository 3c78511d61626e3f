"""From a traced step's event log to its peaks and their breakdown (a :class:`StepMemory`).

:func:`asrfit.memory.simulate.simulate_step` traces a step and hands its log here;
:func:`asrfit.memory.tape.replayed_step` hands a replayed one. The log is replayed allocation by
allocation: each step's peak, each phase's and region's, the live storages at the last step's
peak by category, and the allocator's segments around them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from asrfit.memory.cuda.allocator import segment_overhead_bytes
from asrfit.memory.setup import Setup
from asrfit.memory.step import CATEGORIES, BatchShape, StepMemory
from asrfit.memory.trace.eventlog import Block, TraceLog, round_block


def _category(block: Block) -> str:
    if block.tag is not None:
        return "temporaries" if block.tag.startswith("workspace:") else block.tag
    if block.phase == "forward":
        return "activations"
    return "temporaries"


def analyse(
    log: TraceLog, steps: int, detail: dict | None = None
) -> tuple[int, int, dict[str, int], list[int], str, int, tuple[int, int], dict[str, int]]:
    """Replay the event log: peaks per step, and the breakdown at the last step's peak."""
    blocks = log.blocks
    live_rounded = live_raw = 0
    step_peaks = [0] * (steps + 1)
    phase_peaks: dict[str, int] = {}
    region_peaks: dict[str, int] = {}
    region_at: dict[str, int] = {}  # event index of each region's peak
    best = (-1, -1)  # (rounded peak within last step, event index)
    peak_raw = 0
    for i, (key, sign) in enumerate(log.events):
        b = blocks[key]
        if b.tag == "host":
            continue
        live_rounded += sign * round_block(b.nbytes)
        live_raw += sign * b.nbytes
        if sign > 0:
            s = b.step
            step_peaks[s] = max(step_peaks[s], live_rounded)
            if s == steps:
                phase_peaks[b.phase] = max(phase_peaks.get(b.phase, 0), live_rounded)
                where = f"{b.phase}@{b.region}"
                if live_rounded > region_peaks.get(where, -1):
                    region_peaks[where] = live_rounded
                    region_at[where] = i
            if s == steps:  # the raw peak (a CPU allocator's) may fall at another instant
                peak_raw = max(peak_raw, live_raw)
            if s == steps and live_rounded > best[0]:
                best = (live_rounded, i)
    peak, at = best
    breakdown, sizes = live_at(log, at)
    if detail is not None:  # the same at each phase@region's peak (asrfit.memory.fit.depth)
        at_block = blocks[log.events[at][0]]
        detail.update(
            regions={w: (region_peaks[w], *live_at(log, i)) for w, i in region_at.items()},
            peak_region=f"{at_block.phase}@{at_block.region}",
        )
    transients = [b.nbytes for b in blocks.values() if b.tag and b.tag.startswith("workspace:")]
    phase = blocks[log.events[at][0]].phase
    return (
        peak,
        peak_raw,
        breakdown,
        step_peaks[1:],
        phase,
        max(transients, default=0),
        (
            peak + segment_overhead_bytes(sizes),
            peak + segment_overhead_bytes(sizes, expandable=True),
        ),
        phase_peaks,
    )


def live_at(log: TraceLog, at: int) -> tuple[dict[str, int], list[int]]:
    """Bytes by category and the rounded block sizes live just after event ``at``."""
    blocks = log.blocks
    # Count each block's events up to the instant exactly as the running sum of _analyse does
    # (the in-place accumulation rewrite of asrfit.memory.trace.engine may move a free before its
    # block's allocation), so that the breakdown adds up to the live bytes.
    # A rewrite's two blocks are one storage (TraceLog.merged): counted together, in the
    # category of what the storage became (a tied weight's first gradient contribution is the
    # gradient once the second is added into it), so that no category goes negative where the
    # later block's free was counted and the earlier block's was dropped.
    merged = log.merged

    def storage(key: int) -> int:
        while key in merged:
            key = merged[key]
        return key

    counts: dict[int, int] = {}
    for key, sign in log.events[: at + 1]:
        root = storage(key)
        counts[root] = counts.get(root, 0) + sign
    became = {storage(key): key for key in sorted(merged)}  # the latest block of each storage
    breakdown = dict.fromkeys(CATEGORIES, 0)
    live: Counter[int] = Counter()
    for key, n in counts.items():
        b = blocks[key]
        if n and b.tag != "host":
            breakdown[_category(blocks[became.get(key, key)])] += n * round_block(b.nbytes)
            live[round_block(b.nbytes)] += n
    # The sizes add up to the running sum, as the breakdown does (a storage counted once).
    sizes = [size for size, n in sorted(live.items()) for _ in range(max(n, 0))]
    return breakdown, sizes


def step_memory(
    log: TraceLog,
    model: str,
    setup: Setup,
    target: str,
    batch: BatchShape,
    steps: int,
    detail: dict | None,
    *,
    cost: Any,
    seconds: float,
    flops: int,
    traced_calls: int,
    state_bytes: int,
    assumptions: list[str],
    layer_costs: list | None = None,
    layer_events: list[tuple[int, int]] | None = None,
) -> StepMemory:
    """A traced (or replayed) log's peaks and breakdown, as a :class:`StepMemory`
    (``layer_costs`` and ``layer_events``: each encoder layer's recompute and the events of its
    forward pass, :mod:`asrfit.memory.steptime.layer_span`)."""
    from asrfit.memory.steptime.layer_span import left_live_bytes

    peak, peak_raw, breakdown, step_peaks, phase, transient, segments, phase_peaks = analyse(
        log, steps, detail
    )
    assumptions = list(assumptions)
    if target == "cpu" and setup.checkpoint_layers:
        # torch.utils.checkpoint keeps the CPU generator's state (a tensor made outside the
        # dispatcher, unseen by the tracker) per checkpointed layer until its recompute;
        # counted as live at the peak (pessimistic where the peak is after the recomputes).
        # On a GPU run it is host memory.
        state_bytes_each = torch.get_rng_state().numel()
        rounded = setup.checkpoint_layers * round_block(state_bytes_each)
        peak, peak_raw = peak + rounded, peak_raw + setup.checkpoint_layers * state_bytes_each
        breakdown["activations"] = breakdown.get("activations", 0) + rounded
        assumptions.append(
            f"checkpoint: {setup.checkpoint_layers} x CPU RNG state live at the peak"
        )
    return StepMemory(
        model=model,
        setup=setup,
        target=target,
        batch=batch,
        peak_bytes=peak,
        peak_raw_bytes=peak_raw,
        breakdown_bytes=breakdown,
        step_peaks_bytes=step_peaks,
        peak_phase=phase,
        largest_transient_bytes=transient,
        peak_segment_bytes=segments[0],
        peak_expandable_bytes=segments[1],
        phase_peaks_bytes=phase_peaks,
        optimizer_state_bytes=state_bytes,
        flops=flops,
        assumptions=assumptions,
        trace_seconds=seconds,
        cost=cost,
        traced_calls=traced_calls,
        layer_costs=list(layer_costs or []),
        layer_left_bytes=[
            left_live_bytes(log, first, end, round_block) for first, end in layer_events or []
        ],
    )
