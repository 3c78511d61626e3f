"""The "Current figures" table at the top of docs/benchmarks.md, read from the sections below it.

Run: ``PYTHONPATH=src .venv/bin/python -m bench current_figures --out docs/benchmarks.md``
(the last step of ``make bench``; without ``--out`` it prints the table).

Nothing here is a number: each headline figure is read from its section's own generated
table or summary line by a small parser per section (``PARSERS``), and each row's "held out
or fitted" comes from a phrase of that section, which the parser also requires. A section
that is missing, renamed, or no longer has the table or line a parser reads raises
:class:`MissingFigure` naming it, so a stale table cannot be written. Only the marked
(``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``) sections are read; prose between them is not.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asrfit.utils.io import atomic_write_text
from bench._report import write_section
from bench._sections import (
    MissingFigure,
    Section,
    bare,
    find_column,
    find_row,
    find_table,
    read_sections,
    require,
    search,
    table_header,
)

SECTION = "current-figures"
DOC = Path("docs/benchmarks.md")

HELD_OUT = "held out"
FITTED = "fitted"
# A measurement with no prediction checked in it (a timing, a ratio, an error rate), or a plan's
# output.
MEASURED = "n/a"
# A prediction checked against a measurement whose cases the section does not call either.
NOT_STATED = "not stated"


@dataclass(frozen=True)
class Figure:
    """One row of the table: ``value`` is verbatim text of the section named ``section``."""

    metric: str
    value: str
    basis: str
    section: str


# --- one parser per section ---------------------------------------------------------------

# |error| median **0.00 %**, max **0.45 %**, worst under-prediction **-0.45 %**
_MEMORY_LINE = (
    r"\((?P<n>\d+) of \d+ cases compared[^)]*\): \|error\| median \*\*(?P<median>[-+\d.]+ %)\*\*, "
    r"max \*\*(?P<max>[-+\d.]+ %)\*\*, worst under-prediction \*\*(?P<under>[-+\d.]+ %)\*\*"
)


def _memory_summary(section: Section, label: str, what: str, basis: str) -> list[Figure]:
    """The three figures of one summary line of the held-out memory bench."""
    find_table(section, "case")  # the per-case table the summary line sums up
    m = search(section, re.escape(label) + r"[^\n]*?" + _MEMORY_LINE, f"summary line {label!r}")
    return [
        Figure(f"Memory, CPU: median |error|, {m['n']} {what}", m["median"], basis, section.name),
        Figure(f"Memory, CPU: max |error|, {m['n']} {what}", m["max"], basis, section.name),
        Figure(
            f"Memory, CPU: worst under-prediction, {m['n']} {what}", m["under"], basis, section.name
        ),
    ]


def memory_heldout(section: Section) -> list[Figure]:
    """Memory, CPU: the steps written after the final rules, all held-out groups together."""
    require(section, "### Held out:")
    return _memory_summary(
        section,
        "**All cases written after the final rules**",
        "held-out steps written after the final rules",
        HELD_OUT,
    )


def memory_scale(section: Section) -> list[Figure]:
    """Memory, CPU: the real-scale steps (published layouts), held out."""
    require(section, "### Held out:")
    return _memory_summary(
        section,
        "**All cases written after the final rules**",
        "held-out real-scale steps",
        HELD_OUT,
    )[:2]


def memory_diagnosis(section: Section) -> list[Figure]:
    """Memory, CPU: the steps the rules were written on."""
    require(section, "the steps the rules were written on")
    return _memory_summary(
        section, "Rule-writing (diagnosis) cases", "steps the rules were written on", FITTED
    )[:2]


def memory_grid(section: Section) -> list[Figure]:
    """Memory, CPU: the 30-case grid, on which one scratch choice was made."""
    require(section, "one choice was made on this grid")
    find_table(section, "case")
    m = search(
        section,
        r"Simulator \|error\| over (?P<n>\d+) cases: \*\*median (?P<median>[\d.]+ %), "
        r"max (?P<max>[\d.]+ %)\*\*",
        "'Simulator |error| over N cases' line",
    )
    what = f"{m['n']}-case grid (one scratch rule chosen on it)"
    return [
        Figure(f"Memory, CPU: median |error|, {what}", m["median"], FITTED, section.name),
        Figure(f"Memory, CPU: max |error|, {what}", m["max"], FITTED, section.name),
    ]


def step_time_cpu(section: Section) -> list[Figure]:
    """Step time, CPU: the fitted set, all the others, the last set written (vs the median step)."""
    find_table(section, "set")  # the per-case table the bullets sum up
    figures = []
    for prefix, basis, what in (
        ("fitted (the per-module factor was set on these)", FITTED, "cases the factor was set on"),
        ("not fitted (every set but the fitted one)", HELD_OUT, "cases not fitted"),
        ("layout (written after", HELD_OUT, "cases written after the last change"),
    ):
        m = search(
            section,
            r"^- " + re.escape(prefix) + r"[^\n]*?: vs the median step: median \|error\| "
            r"(?P<median>[\d.]+ %), max (?P<max>[\d.]+ %);[^\n]*\((?P<n>\d+) cases\)$",
            f"bullet {prefix!r}",
        )
        if basis == HELD_OUT:
            require(section, "held out")
        name = f"Step time, CPU: median |error| (vs the median step), {m['n']} {what}"
        figures.append(Figure(name, m["median"], basis, section.name))
        figures.append(
            Figure(name.replace("median |error|", "max |error|"), m["max"], basis, section.name)
        )
    return figures


def sampler(section: Section) -> list[Figure]:
    """Sampler: asrfit's and tuned lhotse's padding and fill on the LibriSpeech-like corpus."""
    require(section, "**(b) LibriSpeech train-clean-100-like**")
    corpus = section.text.split("**(b) LibriSpeech train-clean-100-like**", 1)[1]
    part = Section(section.name, section.heading, section.anchor, corpus)
    header = table_header(part, "sampler")
    rows = find_table(part, "sampler")
    figures = []
    for first, tag, who, basis in (
        ("asrfit MemoryBudgetSampler", "", "asrfit MemoryBudgetSampler", MEASURED),
        (
            "lhotse DynamicBucketingSampler",
            "(tuned: <= 0% over)",
            "lhotse, max_duration tuned on this corpus (<= 0% over)",
            FITTED,
        ),
    ):
        row = find_row(part, rows, first, tag)
        for column in ("padding", "mean fill", "over budget"):
            value = bare(row[find_column(part, header, column)])
            figures.append(
                Figure(f"Sampler, LibriSpeech-like: {column}, {who}", value, basis, section.name)
            )
    return figures


def plan_speed(section: Section) -> list[Figure]:
    """Planning: each case's median cold and warm wall seconds (whether each plan equals the
    exhaustive search's is in the section's table: a check, not a figure)."""
    header = table_header(section, "case")
    rows = find_table(section, "case")
    cold_name = next((h for h in header if h.startswith("cold wall s, median of ")), None)
    if cold_name is None:
        raise MissingFigure(f"section {section.name!r}: no 'cold wall s, median of' column")
    runs = cold_name.removeprefix("cold wall s, median of ").split()[0]
    cold = find_column(section, header, cold_name)
    warm = find_column(section, header, "warm wall s")
    figures = []
    for row in rows:
        median = bare(row[cold]).split(" (")[0]
        metric = f"Planning, cold, wall s (median of {runs}): {row[0]}"
        figures.append(Figure(metric, median, MEASURED, section.name))
    for row in rows:
        metric = f"Planning, warm, wall s: {row[0]}"
        figures.append(Figure(metric, bare(row[warm]), MEASURED, section.name))
    return figures


def profile_speed(section: Section) -> list[Figure]:
    """Profiling a big manifest: wall seconds per reader."""
    m = search(section, r"on a (?P<n>[\d,]+)-line JSONL manifest", "manifest size")
    figures = []
    for row in find_table(section, "reader"):
        metric = f"Profiling a {m['n']}-line manifest, {row[0]} reader, wall s"
        figures.append(Figure(metric, bare(row[1]), MEASURED, section.name))
    return figures


def simulator_speed(section: Section) -> list[Figure]:
    """Simulating one step of XLS-R 1B: wall time."""
    m = search(section, r"wall time: \*\*(?P<s>[\d.]+ s)\*\*", "'wall time' line")
    return [Figure("Simulating one XLS-R 1B step, wall", m["s"], MEASURED, section.name)]


def gpu_check(section: Section) -> list[Figure]:
    """GPU (H200): held-out steps' memory and step time, out-of-memory boundaries, the demo."""
    require(section, "#### Held-out steps (no rule was written on them)")
    find_table(section, "case")  # the held-out steps' table the summary lines below it sum up
    m = search(
        section,
        r"Allocated: median \|error\| (?P<a>[\d.]+ %), (?P<ar>[-+\d.]+ % to [-+\d.]+ %)\. "
        r"Reserved: median \|error\| (?P<r>[\d.]+ %), (?P<rr>[-+\d.]+ % to [-+\d.]+ %)\. "
        r"Step time on catalog figures: median \|error\| (?P<t>[\d.]+ %), [^;]*; "
        r"calibrated \(`asrfit calibrate`[^)]*\): median \|error\| (?P<c>[\d.]+ %)",
        "held-out steps' summary line",
    )
    find_table(section, "config")  # the boundaries' table
    b = search(
        section,
        r"Boundaries: median \|error\| (?P<b>[\d.]+ %), (?P<br>[-+\d.]+ % to [-+\d.]+ %); "
        r"(?P<above>\d+ of \d+) predicted above the largest batch that runs\. "
        r"Full-size step time \(catalog figures\): median \|error\| (?P<t>[\d.]+ %)",
        "boundaries' summary line",
    )
    d = search(
        section,
        r"test CER (?P<cer>[\d.]+ %); epoch (?P<measured>[\d.]+ s) measured, "
        r"(?P<predicted>[\d.]+ s) predicted",
        "demo run's line",
    )
    n = section.name
    return [
        Figure("Memory, GPU: allocated, median |error|", m["a"], HELD_OUT, n),
        Figure("Memory, GPU: allocated, error range", m["ar"], HELD_OUT, n),
        Figure("Memory, GPU: reserved, median |error|", m["r"], HELD_OUT, n),
        Figure("Memory, GPU: reserved, error range", m["rr"], HELD_OUT, n),
        Figure("Memory, GPU: out-of-memory boundary, median |error|", b["b"], NOT_STATED, n),
        Figure("Memory, GPU: out-of-memory boundary, error range", b["br"], NOT_STATED, n),
        Figure(
            "Memory, GPU: boundaries predicted above the largest batch that runs",
            b["above"],
            NOT_STATED,
            n,
        ),
        Figure("Step time, GPU: median |error|, catalog figures", m["t"], HELD_OUT, n),
        Figure(
            "Step time, GPU: median |error|, calibrated (`asrfit calibrate`)", m["c"], HELD_OUT, n
        ),
        Figure(
            "Step time, GPU: median |error|, full-size steps, catalog figures",
            b["t"],
            NOT_STATED,
            n,
        ),
        Figure("Demo on the GPU (`asrfit train --gpu auto`): test CER", d["cer"], MEASURED, n),
        Figure("Demo on the GPU: epoch, measured", d["measured"], MEASURED, n),
        Figure("Demo on the GPU: epoch, predicted by the plan", d["predicted"], NOT_STATED, n),
    ]


def calibration_parts(section: Section) -> list[Figure]:
    """Calibration parts: each part's median |error| on the held-out GPU steps."""
    require(section, "held-out GPU steps")
    header = table_header(section, "part")
    column = find_column(section, header, "median abs. error")
    return [
        Figure(
            f"Step time, GPU, calibration part {row[0]!r}: median |error|",
            bare(row[column]),
            HELD_OUT,
            section.name,
        )
        for row in find_table(section, "part")
    ]


def speech_demo(section: Section) -> list[Figure]:
    """Speech demo: the acoustic model's greedy CERs (test, held-out engine, dev), then with an LM."""
    require(section, "chosen on dev")
    header = table_header(section, "split")
    rows = find_table(section, "split")
    greedy = find_column(section, header, "greedy CER")
    greedy_wer = find_column(section, header, "greedy WER")
    lm_header = table_header(section, "split, with an n-gram")
    lm_rows = find_table(section, "split, with an n-gram")
    text_cer = find_column(section, lm_header, "+ 3-gram text CER")
    dev = find_row(section, rows, "dev (")
    test = find_row(section, rows, "test")
    heldout = find_row(section, rows, "held-out engine")
    m = search(section, r"training wall time (?P<t>[\d.]+ min)", "'training wall time'")
    n = section.name
    return [
        Figure("Speech demo: training wall time, 2 CPU cores", m["t"], MEASURED, n),
        Figure(
            "Speech demo: test CER, greedy (acoustic model alone)", bare(test[greedy]), HELD_OUT, n
        ),
        Figure("Speech demo: test WER, greedy", bare(test[greedy_wer]), HELD_OUT, n),
        Figure(
            "Speech demo: held-out engine (Festival) CER, greedy",
            bare(heldout[greedy]),
            HELD_OUT,
            n,
        ),
        Figure(
            "Speech demo: dev CER, greedy (best epoch chosen on dev)", bare(dev[greedy]), FITTED, n
        ),
        Figure(
            "Speech demo: test CER, 3-gram of the grammar's text",
            bare(find_row(section, lm_rows, "test")[text_cer]),
            HELD_OUT,
            n,
        ),
        Figure(
            "Speech demo: held-out engine CER, 3-gram of the grammar's text",
            bare(find_row(section, lm_rows, "held-out engine")[text_cer]),
            HELD_OUT,
            n,
        ),
    ]


def demo_training(section: Section) -> list[Figure]:
    """`make demo` (CPU): the test split's error rates on the synthetic corpus."""
    find_table(section, "stage")
    m = search(
        section, r"\*\*WER (?P<wer>[\d.]+ %), CER (?P<cer>[\d.]+ %)\*\*", "test split's line"
    )
    speed = search(
        section,
        r"throughput: predicted (?P<p>[\d.]+), measured (?P<m>[\d.]+) audio s per s",
        "throughput line",
    )
    return [
        Figure("`make demo`, CPU: test CER (synthetic corpus)", m["cer"], MEASURED, section.name),
        Figure("`make demo`, CPU: audio s per s trained", speed["m"], MEASURED, section.name),
        Figure("`make demo`, CPU: audio s per s predicted", speed["p"], NOT_STATED, section.name),
    ]


def _partial(model: str) -> Callable[[Section], list[Figure]]:
    def parse(section: Section) -> list[Figure]:
        find_table(section, "")  # the setups' table the ratio below comes from
        ratio = search(
            section,
            r"Throughput of partial over full checkpointing: \*\*(?P<x>[\d.]+x)\*\*",
            "throughput ratio line",
        )
        peak = search(
            section,
            r"Measured peak of the partial setup minus the predicted one: (?P<b>[-+]?\d+ bytes)",
            "measured-minus-predicted peak line",
        )
        return [
            Figure(
                f"Partial checkpointing, {model}: throughput, 2 of 16 layers over all 16",
                ratio["x"],
                MEASURED,
                section.name,
            ),
            Figure(
                f"Partial checkpointing, {model}: measured minus predicted peak",
                peak["b"],
                NOT_STATED,
                section.name,
            ),
        ]

    parse.__doc__ = f"Partial vs full checkpointing, {model}: throughput ratio and peak check."
    return parse


def cpu_step_kernels(section: Section) -> list[Figure]:
    """CPU step: all of asrfit's kernel choices together against the step before them."""
    header = table_header(section, "variant")
    rows = find_table(section, "variant")
    ratio = bare(rows[-1][find_column(section, header, "vs before")])
    changes = " ".join(row[0] for row in rows[1:])
    return [Figure(f"CPU step, {changes} over {rows[0][0]}", ratio, MEASURED, section.name)]


def _ratio_line(label: str, table: str, pattern: str) -> Callable[[Section], list[Figure]]:
    """A parser for a section whose table (first header ``table``) ends in one ratio line."""

    def parse(section: Section) -> list[Figure]:
        find_table(section, table)
        m = search(section, pattern, f"line {pattern!r}")
        return [Figure(label, m["x"], MEASURED, section.name)]

    parse.__doc__ = f"{label}."
    return parse


def nothing_fits(section: Section) -> list[Figure]:
    """When nothing fits on a T4: the proposed Conformer and its predicted reserved bytes."""
    find_table(section, "check")  # the checks of the proposal
    m = search(
        section,
        r"a smaller Conformer: (?P<shape>d_model \d+, \d+ layers) .*?predicted to reserve "
        r"(?P<gib>[\d.]+ of [\d.]+ GiB)",
        "proposal line",
    )
    return [
        Figure(
            "When nothing fits (T4): the proposed Conformer", m["shape"], MEASURED, section.name
        ),
        Figure(
            "When nothing fits (T4): the proposal, predicted reserved",
            m["gib"],
            NOT_STATED,
            section.name,
        ),
    ]


# The table's rows, in this order: section name and its parser.
PARSERS: tuple[tuple[str, Callable[[Section], list[Figure]]], ...] = (
    ("memory-accuracy-heldout", memory_heldout),
    ("memory-accuracy-scale", memory_scale),
    ("memory-accuracy-diagnosis", memory_diagnosis),
    ("memory-accuracy-cpu", memory_grid),
    ("gpu-check", gpu_check),
    ("calibration-parts-gpu", calibration_parts),
    ("step-time-accuracy-cpu", step_time_cpu),
    ("simulator-speed", simulator_speed),
    ("plan-speed", plan_speed),
    ("profile-speed", profile_speed),
    ("sampler-efficiency", sampler),
    ("demo-training", demo_training),
    ("speech-demo", speech_demo),
    ("partial-checkpointing-cpu", _partial("Conformer-CTC")),
    ("partial-checkpointing-cpu-parakeet-tdt", _partial("Parakeet-TDT")),
    ("cpu-step-kernels", cpu_step_kernels),
    (
        "cpu-dropout",
        _ratio_line(
            "CPU step, asrfit's dropout masks over PyTorch's",
            "dropout",
            r"Step with PyTorch's dropout / step with the fast mask: \*\*(?P<x>[\d.]+x)\*\*",
        ),
    ),
    (
        "host-allocator",
        _ratio_line(
            "CPU step, glibc keeping freed memory over its defaults",
            "malloc",
            r"Step with glibc defaults / step with freed memory kept: (?P<x>[\d.]+x)",
        ),
    ),
    ("nothing-fits-t4", nothing_fits),
)


def extract(text: str) -> list[Figure]:
    """Every row of the table, read from the marked sections of ``text`` (docs/benchmarks.md).

    Raises:
        MissingFigure: a section in ``PARSERS`` is missing, or lacks a figure its parser reads.
    """
    sections = read_sections(text)
    figures = []
    for name, parse in PARSERS:
        if name not in sections:
            raise MissingFigure(
                f"section {name!r} is not in the file (renamed or removed? "
                "update PARSERS in bench/current_figures.py)"
            )
        found = parse(sections[name])
        for figure in found:
            if figure.value not in sections[name].text:  # a parser's bug, not the section's
                raise MissingFigure(f"section {name!r}: {figure.value!r} is not its text")
        figures += found
    return figures


def render(text: str) -> str:
    """The section's body: heading, command, and the table of :func:`extract`."""
    sections = read_sections(text)
    lines = [
        "## Current figures",
        "",
        "Command: `PYTHONPATH=src .venv/bin/python -m bench current_figures "
        "--out docs/benchmarks.md` (the last step of `make bench`)",
        "",
        "Each figure is read from its section's own table or summary line below (the parsers: "
        "`bench/current_figures.py`), so it is as current as that section's stamp. *Held out*: "
        "cases no rule was written or fitted on, as the section says; *fitted*: the cases a rule "
        "or setting was chosen on; *n/a*: a measurement with no prediction checked in it, or a "
        "plan's output; *not stated*: a prediction whose section does not say which.",
        "",
        "| metric | value | held-out or fitted | section |",
        "|---|---:|---|---|",
    ]
    for figure in extract(text):
        section = sections[figure.section]
        link = f"[{section.heading.replace('|', '/')}](#{section.anchor})"
        metric = figure.metric.replace("|", "\\|")
        lines.append(f"| {metric} | {figure.value} | {figure.basis} | {link} |")
    return "\n".join(lines)


def place_markers(text: str) -> str:
    """``text`` with an empty section right after the intro paragraph, if it has none yet."""
    start, end = f"<!-- {SECTION}:start -->", f"<!-- {SECTION}:end -->"
    if start in text and end in text:
        return text
    title, _, rest = text.partition("\n\n")
    intro, _, after = rest.partition("\n\n")
    return f"{title}\n\n{intro}\n\n{start}\n{end}\n\n{after}"


def main() -> None:
    """Print the table, or write it into ``--out`` right after the file's intro paragraph."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="docs/benchmarks.md to update")
    parser.add_argument("--doc", type=Path, default=DOC, help="file to read (default: --out)")
    args = parser.parse_args()
    source = args.out if args.out is not None else args.doc
    text = source.read_text(encoding="utf-8")
    body = render(text)
    if args.out is None:
        print(body)
        return
    placed = place_markers(text)
    if placed != text:
        atomic_write_text(args.out, placed)
    write_section(args.out, SECTION, body)


if __name__ == "__main__":
    main()
