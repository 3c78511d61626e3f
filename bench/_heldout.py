"""Running and reporting the held-out splits of the memory-accuracy benchmark (issue 11).

The cases are the memory sets of ``bench/cases.py`` (each with the date it was written and
what it was held out from); this runs each against a plain real CPU step counted at the
allocator (``bench/_truth.py``) and renders the sections of ``docs/benchmarks.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import cases as case_sets
from bench._configs import HeldOutCase

# -- running and reporting -------------------------------------------------------------------

SECTIONS = {
    "held": "memory-accuracy-heldout",
    "diag": "memory-accuracy-diagnosis",
    "scale": "memory-accuracy-scale",
}
# The figures each split is judged by: (median |error|, max |error|, worst under-prediction).
TARGETS = {"held": (0.5, 3.0, -1.0), "diag": (0.5, 3.0, -1.0), "scale": (0.1, 3.0, -0.5)}
COMMAND = (
    "PYTHONPATH=src .venv/bin/python -m bench memory_accuracy --heldout --split {split} "
    "--out docs/benchmarks.md"
)


@dataclass
class HeldOutRow:
    """One case's prediction against the plain step."""

    name: str
    predicted_bytes: int | None
    measured_bytes: int
    seconds: float
    failure: str = ""

    @property
    def error_pct(self) -> float | None:
        """Signed error, percent of the measured peak."""
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def run(case: HeldOutCase) -> HeldOutRow:
    """Simulate ``case`` (target cpu) and measure its plain CPU step."""
    import time

    from asrfit.memory.models.generic import speech_adapter as hf_adapter
    from asrfit.memory.simulate import simulate_step
    from bench import _truth

    started = time.perf_counter()
    failure = ""
    try:
        sim = simulate_step(hf_adapter(case.make_config()), case.batch, case.setup, target="cpu")
        predicted: int | None = sim.peak_raw_bytes
    except Exception as exc:  # reported in the table
        predicted, failure = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
    try:
        measured = _truth.measure_adapter_step(
            hf_adapter(case.make_config()), case.batch, case.setup
        ).peak_bytes
    except Exception as exc:  # the real step itself cannot run on this CPU
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
        return HeldOutRow(
            case.name,
            predicted,
            0,
            time.perf_counter() - started,
            f"the real step cannot run on this CPU (a CPU kernel limitation, not a simulator "
            f"failure; nothing to compare): {reason}",
        )
    return HeldOutRow(case.name, predicted, measured, time.perf_counter() - started, failure)


def summary(rows: list[HeldOutRow]) -> dict[str, float]:
    """Median and max |error|, and the worst under-prediction (percent)."""
    import statistics

    errors = [r.error_pct for r in rows if r.error_pct is not None]
    if not errors:
        return {"median": float("nan"), "max": float("nan"), "worst_under": float("nan")}
    return {
        "median": statistics.median(abs(e) for e in errors),
        "max": max(abs(e) for e in errors),
        "worst_under": min(0.0, min(errors)),
    }


@dataclass(frozen=True)
class Group:
    """A group of cases reported with its own table and summary line."""

    heading: str
    summary: str  # opens the summary line, e.g. "Held out"
    case_set: str  # the name of a memory set of bench/cases.py
    final: bool = False  # written after the final rules: part of the held-out figures

    def cases(self) -> list[HeldOutCase]:
        """The cases of the group's set."""
        return list(case_sets.case_set(self.case_set).cases)


GROUPS = {
    "held": (
        Group(
            "Held out: 8 larger steps written 2026-11-24 at 04:48 UTC, after both fixes",
            "Held out (8 larger steps written 2026-11-24 at 04:48 UTC, after both fixes;",
            "memory-5",
            final=True,
        ),
        Group(
            "Held out: 30 cases written 2026-11-24 at 04:32 UTC, after both fixes",
            "Held out (30 cases written 2026-11-24 at 04:32 UTC, after both fixes;",
            "memory-4",
            final=True,
        ),
        Group(
            "Held out: 9 cases written 2026-11-24, after both fixes",
            "Held out (9 cases written 2026-11-24, after both fixes;",
            "memory-3",
            final=True,
        ),
        Group(
            "Written 2026-11-24 after the first (_safe_softmax) fix, then used to find the "
            "second (in-place composites): diagnosis cases for the second",
            "Cases written after the first fix, used to find the second (",
            "memory-2",
        ),
        Group(
            "Earlier held-out cases (written 2026-11-23), used to find the first fix: "
            "diagnosis cases for it",
            "Earlier held-out cases, used to find the first fix (",
            "memory-1",
        ),
    ),
    "diag": (Group("Rule-writing cases", "Rule-writing (diagnosis) cases (", "memory-rules"),),
    "scale": (
        Group(
            "Held out: 10 real-scale steps, written before the shared-parameter rule",
            "Real-scale held out (10 steps written before the shared-parameter rule;",
            "memory-scale",
            final=True,
        ),
        Group(
            "The step the shortfall was reported on, used to find the rule: diagnosis",
            "Real-scale diagnosis (",
            "memory-scale-rules",
        ),
    ),
}


def _targets(split: str) -> str:
    median, largest, under = TARGETS[split]
    return (
        f"(targets: median <= {median:g} %, max <= {largest:g} %, no under-prediction worse "
        f"than {under:g} %)"
    )


def render_groups(
    groups: list[tuple[Group, list[HeldOutRow]]], split: str, environment: str
) -> str:
    """The markdown section of one split: the header, then a table and summary per group."""
    parts = [header_text(split, environment)]
    parts += [render(rows, split, environment, group, header=False) for group, rows in groups]
    final = [r for group, rows in groups if group.final for r in rows]
    if final:
        s_ = summary(final)
        ok = sum(r.error_pct is not None for r in final)
        parts.insert(
            1,
            f"**All cases written after the final rules** ({ok} of {len(final)} cases "
            f"compared, the held-out groups below together): |error| median "
            f"**{s_['median']:.2f} %**, max **{s_['max']:.2f} %**, worst under-prediction "
            f"**{s_['worst_under']:+.2f} %** {_targets(split)}.",
        )
    return "\n\n".join(parts)


_HISTORY = (
    "The 41 cases written on 2026-11-23 were "
    "then used to find why one missed (wav2vec2-bert, -1.76 %: `_safe_softmax`'s inner "
    "buffers, and other kernels measured since, `asrfit.memory.trace.cpu_kernels`); the 9 cases "
    "written after that fix were used to find why two bf16 wav2vec2-bert cases "
    "over-predicted (+5 %, +9 %: composite ATen code that runs in place in a plain step "
    "runs out of place under a dispatch mode, `asrfit.memory.trace.engine.plain_composites`). "
    "Both groups are reported below as diagnosis cases for those fixes. The held-out "
    "cases are the 9 written after both fixes (`bench/cases.py`, set memory-3), 30 more "
    "written later the same day and 8 larger steps written after those had run "
    "(sets memory-4 and memory-5), each group before any of its cases was run; no "
    "simulator rule changed after any of them. Every group is re-measured in each run; the "
    "earlier groups' byte counts differ from their first run on both sides alike (on "
    "this venv their first run's code, commit 74b637e, measures the same bytes as this "
    "run: the environment changed, not the code), their errors by at most 0.25 points. "
    "Measured with the truth before its fix (the table's fp32 copy, made before the profile "
    "and replaced in step 1, stayed counted), wav2vec2-conformer h64 relative "
    "bf16+ckpt read -36.9 % (6.630 MiB measured): the gap is the 9999 x 64 x 4 B table; "
    "the fix follows the allocator's reporting and a closed-form test "
    "(`tests/test_memory_truth.py`), not that case, and changes no simulator rule. A plain "
    "run without the profiler agrees (`bench/investigations/cast_buffer_check.py`: glibc's bytes in use "
    "over the first step, net of the optimizer state, fall by 1.16 MB; about -1.28 MB if "
    "the fp32 table is freed, +1.28 MB if it stays). "
)


_SCALE_NOTE = (
    "The real-scale cases (`bench/cases.py`, set memory-scale) use published widths and "
    "vocabularies, so vocabulary-sized buffers (a tied embedding's gradient) weigh as in "
    "real training; they were written before the rule for parameters used twice "
    "(`asrfit.memory.trace.engine`: a gradient that reaches the engine's input buffer as a view "
    "keeps its base alive, so the engine sums out of place) and are reported apart from "
    "the small split. "
)


def header_text(split: str, environment: str) -> str:
    """The section's title, command, run line and definitions."""
    return render([], split, environment, None, header=True, header_only=True)


def render(
    rows: list[HeldOutRow],
    split: str,
    environment: str,
    group: Group | None = None,
    *,
    header: bool = True,
    header_only: bool = False,
) -> str:
    """The markdown of one group of cases of a split ("held" or "diag"), with the header."""
    mib = 2**20
    title = {
        "held": "held-out steps",
        "diag": "the steps the rules were written on",
        "scale": "real-scale steps (published layouts, full vocabulary and width)",
    }[split]
    lines = [
        f"## Memory accuracy on {title} (CPU, plain step at the allocator)",
        "",
        f"Command: `{COMMAND.format(split=split)}`  ",
        f"Run: {environment}.",
        "",
        '*Predicted*: `simulate_step(..., target="cpu").peak_raw_bytes`: fake tensors; '
        "gradients summed in place as a plain step does (`asrfit.memory.trace.engine`); each CPU "
        "kernel's scratch and workspace measured on this CPU once per shape "
        "(`asrfit.memory.trace.cpu_kernels`). *Measured*: two real CPU training steps with no "
        "dispatch mode active, the second step's peak replayed from the c10 CPU allocator's "
        "profiler memory events (`bench/_truth.py`, checked against closed-form counts in "
        "`tests/test_memory_truth.py`; the parameters and buffers are copied to fresh storages "
        "inside the profile and the harness holds no reference to them, so a buffer that a "
        "module replaces in forward is freed as in a plain run; 8-bit AdamW is the real "
        "`bitsandbytes.optim.AdamW8bit`). The held-out cases (`bench/cases.py`) were written "
        "after the rules were final; the *diagnosis* cases are the steps used while writing "
        "them, reported apart in their own section. "
        + {"held": _HISTORY, "scale": _SCALE_NOTE}.get(split, "")
        + "Error = (predicted - measured) / measured. "
        "A case whose real step cannot run on this CPU is listed and left out of the figures.",
    ]
    if header_only:
        return "\n".join(lines)
    if not header:
        lines = []
    if group is not None:
        lines += ["", f"### {group.heading}"]
    lines += [
        "",
        "| case | predicted MiB | measured MiB | error |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        pred = "-" if r.predicted_bytes is None else f"{r.predicted_bytes / mib:.3f}"
        err = "failed" if r.error_pct is None else f"{r.error_pct:+.2f} %"
        meas = f"{r.measured_bytes / mib:.3f}" if r.measured_bytes else "-"
        lines.append(f"| {r.name} | {pred} | {meas} | {err} |")
    opening = group.summary if group is not None else "Held out ("
    opening = opening if opening.endswith("(") else opening + " "
    s_ = summary(rows)
    ok = sum(r.error_pct is not None for r in rows)
    lines += [
        "",
        f"{opening}{ok} of {len(rows)} cases compared): |error| median **{s_['median']:.2f} %**, "
        f"max **{s_['max']:.2f} %**, worst under-prediction **{s_['worst_under']:+.2f} %** "
        f"{_targets(split)}.",
    ]
    failed = [r for r in rows if r.failure]
    if failed:
        lines += ["", "Failed (simulation or real step):"] + [
            f"- {r.name}: `{r.failure}`" for r in failed
        ]
    return "\n".join(lines)
