"""Is a traced step a tape: the same allocations at every batch shape, each size an exact
function of batch, input length and label length?

Question (2026-11-28): a cold plan spends most of its time tracing one setup at several batch
shapes. If the traces of one setup allocate the same sequence of storages at every shape, and
each storage's size is an exact function of (B, T, U) found from a few traces, the other shapes'
peaks could be replayed from that tape instead of traced. Does that hold for the planner's
models, and how many traces pin the functions down?

Answer: not as recorded. From batch 2 on, every trace of one setup (wav2vec2-base,
hubert-large, conformer-ctc-small; fp16, the planner's lengths at batches 2-6) has the same
number of allocation and free events, but not in the same order, so the tapes do not align
event by event; batch 1 takes another path (two events fewer in wav2vec2-base and
conformer-ctc-small; hubert-large's batch-1 traces differ by length too). Not yet explained:
one candidate is the cyclic collector, which frees fake tensors held in reference cycles at
moments set by allocation counts. A replay needs a canonical order first (collect cycles at
fixed points of the trace, or align by op sequence), and the planner's coarse traces at
batch 1 would have to move to batch 2. Measured with ``--planner`` and the default mode
(docs/history.md, "Finished investigations"). Follow-up (2026-11-29): only simultaneous frees
differ in order (autocast's cast cache, freed in dict order); sorted within each run of
frees the tapes align, and ``asrfit.memory.tape`` replays them.

Method: each model is traced (``simulate_step``, one step, forward and backward, no optimizer
step: the planner's activation trace) at a base shape, one shape with another batch, one with
other labels, and three with other input lengths; then at two check shapes that differ from
the base in every dimension at once. The tapes (allocation and free events, each block's
shape, dtype and byte count) are compared event by event. Each dimension of each block is
explained from the six fitting traces as ``B^a x F(T) x G(U)``: ``a`` 0 or 1; ``G`` constant or
``U + d``; ``F`` constant, or ``m x (floor((T - K) / S) + 1) + e`` for small integers
(a strided convolution chain's length, the ceiling of a division, ``2 T' - 1`` of relative
positions); a block with no recorded shape (a workspace, a held block) by its byte count the
same way. Every check shape's tape is then predicted from the rules, replayed as
``asrfit.memory.simulate`` replays a trace (512-byte blocks, peak of the last step), and
compared with its real trace.

Run: ``PYTHONPATH=src python -m bench investigations.trace_tapes [--models wav2vec2-base
whisper-small] [--precision fp16]``.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import dataclass

from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import Precision, Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.trace.eventlog import round_block
from asrfit.plan.costs import coarse_shapes


@dataclass
class Tape:
    """One trace's storages in creation order, and its events as indices into them."""

    shapes: list[tuple[int, ...] | None]  # None: no recorded shape (workspace, held block)
    nbytes: list[int]
    itemsize: list[int]
    events: list[tuple[int, int]]
    host: list[bool]
    step: list[int]
    peak: int  # the simulator's own forward/backward peak of this trace


def record(adapter, batch: BatchShape, setup: Setup) -> Tape:
    """Trace ``batch`` as the planner's activation fit does and keep its tracker's log."""
    trackers = []
    memory = simulate_step(
        adapter,
        batch,
        setup,
        steps=1,
        optimizer_step=False,
        prune=lambda _model, tracker: trackers.append(tracker),
    )
    log = trackers[0].log
    order = {key: i for i, key in enumerate(log.blocks)}
    blocks = list(log.blocks.values())
    return Tape(
        shapes=[b.shape if b.shape else None for b in blocks],
        nbytes=[b.nbytes for b in blocks],
        itemsize=[b.dtype.itemsize if b.dtype is not None and b.shape else 0 for b in blocks],
        events=[(order[key], sign) for key, sign in log.events],
        host=[b.tag == "host" for b in blocks],
        step=[b.step for b in blocks],
        peak=memory.forward_backward_peak_bytes,
    )


def replay_peak(tape: Tape, nbytes: list[int]) -> int:
    """The largest rounded live sum over the tape's events (host blocks aside)."""
    live = best = 0
    for index, sign in tape.events:
        if tape.host[index]:
            continue
        live += sign * round_block(nbytes[index])
        best = max(best, live)
    return best


def _t_rule(ts: list[int], ws: list[int]) -> tuple | None:
    """``w = m (floor((T - K) / S) + 1) + e`` through every point, or None; the first found
    with the smallest S, m in (1, 2) and e in (0, -1, 1)."""
    if len(set(ws)) == 1:
        return ("const", ws[0])
    for m in (1, 2):
        for e in (0, -1, 1):
            frames = [(w - e) / m for w in ws]
            if any(f != int(f) for f in frames):
                continue
            frames = [int(f) for f in frames]
            spread = (max(ts) - min(ts)) / max(max(frames) - min(frames), 1)
            for s in sorted(range(1, 4097), key=lambda s: abs(s - spread))[:64]:
                # floor((T - K) / S) + 1 = f  <=>  T - S f < K <= T - S (f - 1)
                low = max(t - s * f for t, f in zip(ts, frames, strict=True)) + 1
                high = min(t - s * (f - 1) for t, f in zip(ts, frames, strict=True))
                if low <= high:
                    return ("frames", m, e, s, low, high)
    return None


def _t_value(rule: tuple, t: int) -> set[int]:
    """Every value the rule allows at ``t`` (more than one where K is not pinned down)."""
    if rule[0] == "const":
        return {rule[1]}
    _, m, e, s, low, high = rule
    return {m * ((t - k) // s + 1) + e for k in range(low, high + 1)}


def explain(values: dict[str, int], fit: dict[str, BatchShape]) -> tuple | None:
    """A rule ``B^a x F(T) x G(U)`` for one dimension seen at the fitting shapes, or None."""
    base, b_var, u_var = fit["base"], fit["batch"], fit["labels"]
    v0 = values["base"]
    if values["batch"] == v0:
        a = 0
    elif values["batch"] * base.batch_size == v0 * b_var.batch_size:
        a = 1
    else:
        return None
    per = {name: values[name] // (fit[name].batch_size ** a) for name in values}
    if any(per[n] * fit[n].batch_size ** a != values[n] for n in values):
        return None
    if per["labels"] == per["base"]:
        u_shift = None
    elif per["labels"] - per["base"] == u_var.label_length - base.label_length:
        u_shift = per["base"] - base.label_length  # U + d (in T: the base's other factor)
    else:
        return None
    t_names = ["base"] + [n for n in fit if n.startswith("length")]
    if u_shift is not None:  # labels-dependent: must not move with T at a fixed U
        if len({per[n] for n in t_names}) != 1:
            return None
        return (a, ("const", 0), u_shift)
    rule = _t_rule([fit[n].input_length for n in t_names], [per[n] for n in t_names])
    return None if rule is None else (a, rule, None)


def predict(rule: tuple, shape: BatchShape) -> set[int]:
    a, t_rule, u_shift = rule
    scale = shape.batch_size**a
    if u_shift is not None:
        return {scale * (shape.label_length + u_shift)}
    return {scale * v for v in _t_value(t_rule, shape.input_length)}


def study(model: str, precision: Precision, base: BatchShape) -> dict:
    """Fit the tape's rules on six traces of ``model`` and check them on two other shapes."""
    adapter, _ = resolve_adapter(model)
    setup = Setup(precision=precision)
    b, t, u = base.batch_size, base.input_length, base.label_length
    fit = {
        "base": base,
        "batch": BatchShape(b + 1, t, u),
        "labels": BatchShape(b, t, u + 7),
        "length1": BatchShape(b, t + t // 3 + 1, u),
        "length2": BatchShape(b, 2 * t - 3, u),
        "length3": BatchShape(b, 3 * t + 11, u),
    }
    checks = {
        "check1": BatchShape(3 * b, 2 * t + 5, 2 * u + 1),
        "check2": BatchShape(2 * b + 1, 4 * t - 7, 3 * u),
    }
    started = time.process_time()
    tapes = {name: record(adapter, shape, setup) for name, shape in {**fit, **checks}.items()}
    seconds = (time.process_time() - started) / len(tapes)
    first = tapes["base"]
    aligned = all(
        tape.events == first.events
        and [s is None for s in tape.shapes] == [s is None for s in first.shapes]
        and [len(s or ()) for s in tape.shapes] == [len(s or ()) for s in first.shapes]
        for tape in tapes.values()
    )
    result = {
        "model": model,
        "precision": precision.value,
        "blocks": len(first.nbytes),
        "events": len(first.events),
        "cpu_s_per_trace": round(seconds, 2),
        "aligned": aligned,
    }
    if not aligned:
        lengths = {name: len(tape.events) for name, tape in tapes.items()}
        result["events_per_trace"] = lengths
        return result
    rules: list[list[tuple | None] | tuple | None] = []
    unexplained = 0
    for i, shape in enumerate(first.shapes):
        dense = shape is not None and all(
            tapes[n].itemsize[i] * math.prod(tapes[n].shapes[i]) == tapes[n].nbytes[i] for n in fit
        )
        if not dense:  # no shape, or a storage that is not its shape's: by byte count
            rule = explain({n: tapes[n].nbytes[i] for n in fit}, fit)
            unexplained += rule is None
            rules.append(rule)
            continue
        dims = [explain({n: tapes[n].shapes[i][d] for n in fit}, fit) for d in range(len(shape))]
        unexplained += any(r is None for r in dims)
        rules.append(dims)
    result["blocks_unexplained"] = unexplained
    for name, shape in checks.items():
        real = tapes[name]
        predicted, ambiguous, wrong = [], 0, 0
        for i, rule in enumerate(rules):
            if rule is None:
                guess = {first.nbytes[i]}
            elif isinstance(rule, tuple):
                guess = predict(rule, shape)
            else:
                dims = [predict(r, shape) if r else {0} for r in rule]
                guess = {first.itemsize[i] * math.prod(v) for v in _product(dims)}
            ambiguous += len(guess) > 1
            value = max(guess)  # the largest the rules allow
            wrong += real.nbytes[i] not in guess
            predicted.append(value)
        replayed = replay_peak(real, predicted)
        result[name] = {
            "shape": [shape.batch_size, shape.input_length, shape.label_length],
            "blocks_wrong": wrong,
            "blocks_ambiguous": ambiguous,
            "replayed_peak": replayed,
            "real_replayed_peak": replay_peak(real, real.nbytes),
            "simulator_peak": real.peak,
            "error": (replayed - real.peak) / real.peak,
        }
    return result


def study_planner(model: str, precision: Precision, max_input: int, labels_per_unit: float) -> dict:
    """The planner's case: its four coarse shapes (``asrfit.plan.costs.coarse_shapes``, labels
    by rate) fix each block as ``B^a x F(T)`` at their three lengths; its refinement shapes
    are other batches at those same lengths. Predict three such shapes and check them."""
    adapter, _ = resolve_adapter(model)
    setup = Setup(precision=precision)

    def shape(b: int, t: int) -> BatchShape:
        return BatchShape(b, t, max(1, round(t * labels_per_unit)))

    t = max_input
    coarse = {(b, n): shape(b, n) for b, n in coarse_shapes(t)}
    # batch 1 may take another path than larger batches: the same lengths at batch 2 and 4
    fit = {(2, t // 4): shape(2, t // 4), (2, t // 2): shape(2, t // 2), (4, t): shape(4, t)}
    checks = {(5, t // 4): shape(5, t // 4), (3, t // 2): shape(3, t // 2), (6, t): shape(6, t)}
    started = time.process_time()
    every = {**coarse, **fit, **checks}
    tapes = {key: record(adapter, s, setup) for key, s in every.items()}
    seconds = (time.process_time() - started) / len(tapes)
    first = tapes[(2, t)]
    events = {str(k): len(v.events) for k, v in tapes.items()}
    aligned = all(tape.events == first.events for k, tape in tapes.items() if k[0] >= 2)
    result = {
        "model": model,
        "precision": precision.value,
        "mode": "planner shapes",
        "blocks": len(first.nbytes),
        "cpu_s_per_trace": round(seconds, 2),
        "events_per_trace": events,
        "aligned_from_batch_2": aligned,
    }
    if not aligned:
        return result
    # per block: a from (2, t) and (4, t); F at each length from a batch-2 trace there
    powers: list[int | None] = []
    for i in range(len(first.nbytes)):
        two, four = first.nbytes[i], tapes[(4, t)].nbytes[i]
        powers.append(0 if two == four else 1 if four == 2 * two else None)
    seen = {t // 4: (2, tapes[(2, t // 4)]), t // 2: (2, tapes[(2, t // 2)]), t: (2, first)}
    result["blocks_not_linear_in_batch"] = sum(a is None for a in powers)
    for (b, n), real in ((k, tapes[k]) for k in checks):
        at_b, tape = seen[n]
        predicted = []
        for i, a in enumerate(powers):
            if a is None or tape.nbytes[i] % (at_b**a):
                predicted.append(tape.nbytes[i])  # no rule: keep what was seen
            else:
                predicted.append(tape.nbytes[i] // at_b**a * b**a)
        wrong = sum(x != y for x, y in zip(predicted, real.nbytes, strict=True))
        replayed = replay_peak(real, predicted)
        result[f"check {b}x{n}"] = {
            "blocks_wrong": wrong,
            "replayed_peak": replayed,
            "simulator_peak": real.peak,
            "real_replayed_peak": replay_peak(real, real.nbytes),
            "error": (replayed - real.peak) / real.peak,
        }
    return result


def _product(options: list[set[int]]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for values in options:
        out = [(*prefix, v) for prefix in out for v in sorted(values)]
    return out


DEFAULT_BASES = {
    "wav2vec2-base": BatchShape(2, 32_000, 12),
    "hubert-large": BatchShape(2, 32_000, 12),
    "whisper-small": BatchShape(2, 3_000, 12),
    "conformer-ctc-small": BatchShape(2, 200, 12),
    "parakeet-ctc-0.6b": BatchShape(2, 400, 12),
}
# The planner's longest input (24.5 s: the LibriSpeech-like manifest's) and labels per input
# unit (15.5 characters per second), per model's input units.
PLANNER_SHAPES = {
    "wav2vec2-base": (392_000, 15.5 / 16_000),
    "hubert-large": (392_000, 15.5 / 16_000),
    "whisper-small": (3_000, 15.5 / 100),
    "conformer-ctc-small": (2_450, 15.5 / 100),
    "parakeet-ctc-0.6b": (2_450, 15.5 / 100),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_BASES))
    parser.add_argument("--precision", default="fp16", choices=[p.value for p in Precision])
    parser.add_argument(
        "--planner", action="store_true", help="the planner's coarse and refinement shapes"
    )
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    for model in args.models:
        if args.planner:
            result = study_planner(model, Precision(args.precision), *PLANNER_SHAPES[model])
        else:
            result = study(model, Precision(args.precision), DEFAULT_BASES[model])
        print(result, flush=True)


if __name__ == "__main__":
    main()
