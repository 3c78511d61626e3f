"""How close is the step-time model to real training steps? (CPU)

Run: ``PYTHONPATH=src .venv/bin/python -m bench step_time_accuracy --out docs/benchmarks.md``

Each case (a tiny model of ``bench/_grid.py``, a setup and a padded batch) is simulated on
fake tensors (``target="cpu"``), and its :class:`~asrfit.memory.steptime.runtime.StepCost` is turned
into seconds by the roofline of :mod:`asrfit.memory.steptime.runtime` on this machine's rates
(:func:`asrfit.profiles.host.host_rates`, measured and cached per machine). Each case is
timed on its own, in a child process forked before any case is simulated, that builds only
its model (as a training run's process holds one model; children forked after the 74
traces ran their steps 8-15 % slower: ``bench/_timing.py``): ``--warmup`` (5) unmeasured
steps, then ``--steps`` (7) measured steps of the same model, as a training run repeats
one model (a model built afresh runs its first steps slower: the 10 `layout` cases timed
after 2 unmeasured steps came out a median 3 points slower than after 5); the whole pass
over the cases is repeated ``--rounds`` (5) times, and a case's figure is the median of its
round medians, so that a few minutes when neighbours on the shared machine slow it fall on
one or two rounds of a case, not on most (with 3 rounds, the 04:55 run of 2026-11-27
measured whisper fp32+ckpt sgd 2x2s at 26.6 ms, 17.1 ms in the run just before; in one
round-per-family run the same wavlm case measured 20.7 ms, and 11.8 ms alone minutes later:
``bench/step_kinds.py``). Alternating the steps of several models instead leaves each step
cold in the caches (all cases at once: that wavlm case 25.8 ms; the 13 cases of one family
at once, as until 2026-11-27 03:55: a parakeet-ctc case 21.5 ms against 16.5-17.9 alone;
the runs are in docs/benchmarks.md). The 1-minute load average is recorded before and
after the timed steps.

The cases come in groups of four per family: a base setup, the same with checkpointing,
the same with 3x the batch, and the same in bf16 (parakeet-tdt: no bf16 on this CPU); so each group gives the three pairs the
planner compares (checkpointing on/off at one batch: step time; two batch sizes: audio
seconds per second; fp32 vs bf16: step time).

``FITTED`` groups (wav2vec2, whisper, parakeet-ctc) were used to set the two per-kernel
factor of :mod:`asrfit.profiles.host_kernels` (``MODULE_FACTOR``: ``--fit`` prints it); the ``HELD_OUT`` groups
(hubert, wavlm, parakeet-tdt: other families) were added after the model was final.

Runs single-threaded (``torch.set_num_threads(1)``, host rates at 1 thread): the machine
is 2 cores shared by several people, and OpenMP threads spinning on oversubscribed cores
make multi-threaded timings meaningless there.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
from pathlib import Path

import numpy as np
import torch

from asrfit.memory.steptime.runtime import step_seconds
from asrfit.profiles.host import host_rates, stream_bandwidth
from bench import _grid
from bench._report import write_section
from bench._timing import Timed, time_cases
from bench.cases import cases as case_list
from bench.cases import sets_of

SECTION = "step-time-accuracy-cpu"
COMMAND = "PYTHONPATH=src .venv/bin/python -m bench step_time_accuracy --out docs/benchmarks.md"


def _families(rows: list[Timed]) -> list[list[Timed]]:
    groups: dict[str, list[Timed]] = {}
    for r in rows:
        groups.setdefault(r.case.arch, []).append(r)
    return list(groups.values())


def pairs(rows: list[Timed]) -> list[tuple[str, Timed, Timed, str]]:
    """(label, a, b, measure) for each group of four: ckpt, batch and precision pairs."""
    out = []
    for group in _families(rows):
        base, ckpt, big = group[:3]
        arch = base.case.arch
        out.append((f"{arch}: checkpointing off vs on", base, ckpt, "step"))
        out.append((f"{arch}: batch 2 vs 6", base, big, "throughput"))
        if len(group) > 3:
            out.append((f"{arch}: fp32 vs bf16", base, group[3], "step"))
    return out


def _faster(a: Timed, b: Timed, measure: str, predicted: bool) -> str:
    if measure == "step":
        ta = a.predicted_seconds if predicted else a.measured_seconds
        tb = b.predicted_seconds if predicted else b.measured_seconds
        return "a" if ta <= tb else "b"
    ra = a.predicted_audio_per_second if predicted else a.audio_per_second
    rb = b.predicted_audio_per_second if predicted else b.audio_per_second
    return "a" if ra >= rb else "b"


def fit_factors(rows: list[Timed], rates) -> tuple[float, float]:  # noqa: ANN001
    """Least-squares multiplier of the per-module cost on ``rows``.

    Returns ``(gamma, residual)``: what to multiply ``rates.module_seconds`` by so that
    kernels (their measured per-kind fixed costs and roofline) plus module calls best match
    the measured steps. Multiply :data:`asrfit.profiles.host_kernels.MODULE_FACTOR` by it.
    """
    a, y = [], []
    for r in rows:
        modules = r.cost.module_calls * rates.module_seconds
        a.append([modules])
        y.append(r.measured_seconds - (step_seconds(r.cost, rates) - modules))
    (gamma,), residual, *_ = np.linalg.lstsq(np.asarray(a), np.asarray(y), rcond=None)
    return float(gamma), float(residual[0]) if len(residual) else 0.0


def choices(rows: list[Timed]) -> list[str]:
    """Per family: the setup the model picks among base, checkpointing and bf16 at one batch,
    against the measured times of the ones it rejects (table rows)."""
    out = []
    for group in _families(rows):
        options = [group[0], group[1], *group[3:]]
        picked = min(options, key=lambda r: r.predicted_seconds)
        fastest = min(options, key=lambda r: r.measured_seconds)
        rejected = ", ".join(
            f"{r.case.setup.describe()} {r.measured_seconds * 1e3:.0f} ms"
            for r in options
            if r is not picked
        )
        loss = 100.0 * (picked.measured_seconds / fastest.measured_seconds - 1)
        out.append(
            f"| {group[0].case.arch} | {picked.case.setup.describe()} "
            f"{picked.measured_seconds * 1e3:.0f} ms | {rejected} | "
            f"{'yes' if picked is fastest else f'no, {loss:.0f} % slower'} |"
        )
    return out


def _error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def _as_priced_before(rates):  # noqa: ANN001, ANN202
    """The rates as priced before 2026-11-27: every kind scaled by ``add``'s curve, and every
    attention call at one FLOP rate."""
    curves = {k: v for k, v in rates.rate_curves.items() if not k.startswith("bandwidth:")}
    return dataclasses.replace(rates, rate_curves=curves, attention_seconds={})


def _summary_without(rows: list[Timed], rates) -> str:  # noqa: ANN001
    without = _as_priced_before(rates)
    errors = [abs(_error_pct(step_seconds(r.cost, without), r.measured_seconds)) for r in rows]
    return f"median |error| {statistics.median(errors):.1f} %, max {max(errors):.1f} %"


def _summary(rows: list[Timed]) -> str:
    errors = [abs(r.error_pct) for r in rows]
    fastest = [abs(r.fastest_error_pct) for r in rows]
    return (
        f"vs the median step: median |error| {statistics.median(errors):.1f} %, max "
        f"{max(errors):.1f} %; vs the fastest step: median |error| "
        f"{statistics.median(fastest):.1f} %, max {max(fastest):.1f} % ({len(rows)} cases)"
    )


def _load_note(rows: list[Timed]) -> str:
    loads = [x for r in rows for x in (r.load_before, r.load_after)]
    if max(loads) > 2.0:
        return (
            f"**Taken under load.** The 1-minute load average reached {max(loads):.1f} on this "
            "2-core machine (columns `load`), so the measured steps are slower than on a quiet "
            "machine by a varying factor, while the host rates are best-of-repeats figures. "
            "Errors here mix model error with load."
        )
    return (
        f"Quiet machine: the 1-minute load average stayed between {min(loads):.1f} and "
        f"{max(loads):.1f} on 2 cores (columns `load`)."
    )


def _rates_line(rates) -> str:  # noqa: ANN001
    kinds = ", ".join(
        f"{kind} {f * 1e6:.1f}/{b * 1e6:.1f}"
        for kind, (f, b) in rates.kernel_seconds_by_kind.items()
    )
    return (
        f"host rates ({rates.name}): fp32 linear {rates.matmul_rate('fp32') / 1e9:.1f} GFLOP/s, "
        f"bf16 {rates.matmul_rate('bf16') / 1e9:.1f} GFLOP/s, fp32 conv "
        f"{rates.conv_rate('fp32') / 1e9:.1f} GFLOP/s, bandwidth "
        f"{rates.memory_bytes_per_second / 1e9:.1f} GB/s; fixed us per kernel, forward/backward: "
        f"{kinds}; integer index arithmetic {(rates.int_kernel_seconds or 0) * 1e6:.1f}; "
        f"optimizer {(rates.optimizer_kernel_seconds or 0) * 1e6:.1f} us per kernel; "
        f"{rates.module_seconds * 1e6:.1f} us per module call."
    )


def render(  # noqa: ANN001
    fitted: list[Timed],
    held: list[Timed],
    later: list[Timed],
    after: list[Timed],
    curve: list[Timed],
    attention: list[Timed],
    layout: list[Timed],
    rates,
    bandwidth: tuple[float, float],
    timing: tuple[int, int, int] = (5, 7, 5),
) -> str:
    """The markdown section."""
    everything = fitted + held + later + after + curve + attention + layout
    lines = [
        "## Step time: predicted vs measured (CPU)",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
        f"1 thread; {_rates_line(rates)}",
        "",
        _load_note(everything),
        "",
        f"Timing: each case alone, in a child process forked before any case was simulated "
        f"(`bench/_timing.py`), {timing[0]} unmeasured then {timing[1]} measured steps of its "
        f"model, {timing[2]} rounds over all cases; a case's figure is the median of its round "
        "medians.",
        "",
        f"Memory bandwidth (`torch.add` over 16 MiB, best of 5) measured at the start and the "
        f"end of this run: {bandwidth[0] / 1e9:.1f} and {bandwidth[1] / 1e9:.1f} GB/s, against "
        f"{rates.memory_bytes_per_second / 1e9:.1f} GB/s in the cached host rates: where they "
        "differ, neighbours on the shared machine are taking memory bandwidth and the "
        "memory-bound kernels run slower than the rates say.",
        "",
        "The model (docs/step_time.md): per kernel, a fixed cost measured for its kind "
        "(`asrfit.profiles.host_kernels`) plus its roofline; per `nn.Module` call, a measured bare "
        "module call times `MODULE_FACTOR`, the one fitted figure; the optimizer's kernels at "
        "their own measured cost. The held-out families' phase timings (forward, backward, "
        "optimizer of one step each) were looked at while choosing that form; nothing was "
        "fitted on them. The `later` cases were written after that model was final. Then "
        "one figure was added, found on the parakeet-tdt cases of both sets (over-predicted "
        "by 18-37 %): a forward kernel on integer or bool tensors only (a transducer loss's "
        "index arithmetic: thousands per step) costs its own measured figure "
        "(`int_kernel_seconds`: no autograd recording), not a float kernel's. The `after` "
        "cases were written after that change and before any run with it. On 2026-11-27 two "
        "changes: glibc keeps freed memory in the timed process, as `asrfit train` now does on "
        "a CPU (`asrfit.train.host_allocator`; `bench/host_allocator.py`), and layer norm, "
        "softmax, activations and dropout's generator are read off their own measured "
        "bandwidth curves instead of being scaled by `add`'s in-cache speed-up; the `curves` "
        "cases were written after both and before any run with them. Then a run showed "
        "the whisper bf16 cases under-predicted by 39-42 %, their CPU flash attention "
        "profiled at 7.0 ms (`python -m bench step_kinds whisper bf16 0 sgd 2 2 12`) where one FLOP "
        "rate priced 1.0 ms: each attention call is now priced "
        "at its own shape from a measured grid; the `attention` cases were written after that "
        "and before any run with it. Then a profile of the most under-predicted case "
        "(`python -m bench step_kinds wav2vec2 fp32 0 sgd 3 3 25`) showed 4-5 ms of `copy_` the "
        "trace had priced at 0.04 ms: layer norm and convolution copy their transposed inputs "
        "inside the kernel, below the dispatcher, and a transposing copy runs at 1.5-7 GB/s, "
        "not `add`'s 27-88 GB/s; those copies are in the trace now, at their own "
        "measured bandwidth (kind `layout`), and the host rates are the best of two passes "
        "(one pass of 03:47 had met a busy moment: every figure 1.3-1.5x slow); the `layout` "
        "cases were written after that and before any run with it. The module factor was "
        "fitted on another CPU (an AMD EPYC): on this one every case is held out from it.",
        "",
        f"- fitted (the per-module factor was set on these): {_summary(fitted)}",
        f"- held out (other families, not fitted): {_summary(held)}",
        f"- later (written after the per-kind model; its TDT cases led to the integer figure): "
        f"{_summary(later)}",
        f"- after (written after the integer figure): {_summary(after)}",
        f"- curves (written after the kind curves): {_summary(curve)}",
        f"- attention (written after the attention grid, held out from every change): "
        f"{_summary(attention)}",
        f"- layout (written after the layout copies and two-pass host rates, held out from "
        f"every change): {_summary(layout)}",
        f"- not fitted (every set but the fitted one): {_summary(everything[len(fitted) :])}",
        f"- all: {_summary(everything)}",
        f"- parakeet-tdt cases: median |error| "
        f"{statistics.median(abs(r.error_pct) for r in everything if r.case.arch == 'parakeet-tdt'):.1f} %",
        f"- the same cases priced as before 2026-11-27 (`add`'s curve for every kind, one "
        f"attention rate; same run, same measurements): "
        f"{_summary_without(everything, rates)}",
        "",
        "| set | case | predicted ms | measured ms (median) | error | fastest ms | error | "
        "error as priced before 2026-11-27 | round medians ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    without = _as_priced_before(rates)
    for label, rows in (
        ("fitted", fitted),
        ("held out", held),
        ("later", later),
        ("after", after),
        ("curves", curve),
        ("attention", attention),
        ("layout", layout),
    ):
        for r in rows:
            lines.append(
                f"| {label} | {r.case.name} | {r.predicted_seconds * 1e3:.1f} | "
                f"{r.measured_seconds * 1e3:.1f} | {r.error_pct:+.1f} % | "
                f"{min(r.steps_seconds) * 1e3:.1f} | {r.fastest_error_pct:+.1f} % | "
                f"{_error_pct(step_seconds(r.cost, without), r.measured_seconds):+.1f} % | "
                f"{_round_medians(r, timing[1])} |"
            )
    lines += ["", "Pairs the planner compares (faster one, predicted vs measured):", ""]
    lines += [
        "| set | pair | measure | predicted faster | measured faster | right |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in (("fitted", fitted), ("held out", held)):
        right = total = 0
        for name, a, b, measure in pairs(rows):
            p, m = _faster(a, b, measure, True), _faster(a, b, measure, False)
            right, total = right + (p == m), total + 1
            lines.append(
                f"| {label} | {name} | {measure} | {p} | {m} | {'yes' if p == m else 'no'} |"
            )
        lines.append(f"| {label} | **{right} of {total} right** | | | | |")
    lines += [
        "",
        "The setup the model picks at batch 2 among fp32, fp32 + checkpointing and bf16, "
        "measured against the ones it rejects:",
        "",
        "| family | picked (measured) | rejected (measured) | measured fastest? |",
        "|---|---|---|---|",
        *choices(fitted + held),
    ]
    return "\n".join(lines)


def _round_medians(row: Timed, steps: int) -> str:
    """The median step of each round, in milliseconds (a round far from the others was a
    slow minute of the shared machine)."""
    times = row.steps_seconds
    medians = [statistics.median(times[i : i + steps]) for i in range(0, len(times), steps)]
    return " / ".join(f"{m * 1e3:.1f}" for m in medians)


def _run(  # noqa: ANN001
    cases: list[_grid.Case], rates, warmup: int, steps: int, rounds: int
) -> list[Timed]:
    """Time the cases one by one, ``rounds`` times over."""
    rows = time_cases(cases, rates, warmup=warmup, steps=steps, rounds=rounds)
    for r in rows:
        print(
            f"{r.case.name:45s} {r.predicted_seconds * 1e3:8.1f} {r.measured_seconds * 1e3:8.1f} "
            f"{r.error_pct:+6.1f} %  load {r.load_after:.1f}",
            flush=True,
        )
    return rows


def main() -> None:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Write the section here.")
    parser.add_argument("--fit", action="store_true", help="Only fitted cases; print the factor.")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rates = host_rates(1)
    bandwidth_before = stream_bandwidth()
    if args.fit:
        gamma, _ = fit_factors(
            _run(case_list("step-time-fit"), rates, args.warmup, args.steps, args.rounds), rates
        )
        print(f"multiply MODULE_FACTOR by {gamma:.3f}")
        return
    # the fitted set, then every held-out set in the order written (bench/cases.py)
    sets = [list(case_set.cases) for case_set in sets_of("step-time")]
    rows = _run([c for cases in sets for c in cases], rates, args.warmup, args.steps, args.rounds)
    split, start = [], 0
    for cases in sets:
        split.append(rows[start : start + len(cases)])
        start += len(cases)
    timing = (args.warmup, args.steps, args.rounds)
    text = render(*split, rates, (bandwidth_before, stream_bandwidth()), timing)
    print(text)
    if args.out is not None:
        write_section(args.out, SECTION, text)


if __name__ == "__main__":
    main()
