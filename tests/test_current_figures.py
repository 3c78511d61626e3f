"""The "Current figures" table of docs/benchmarks.md is read from its sections, never typed.

Run on the committed docs/benchmarks.md: every value is text of the section its row links to,
and a section without its table (or without the section at all) stops the table with an
error naming the section.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import current_figures
from bench._sections import MissingFigure, read_sections, slug

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
TEXT = DOC.read_text(encoding="utf-8")
BASES = {
    current_figures.HELD_OUT,
    current_figures.FITTED,
    current_figures.MEASURED,
    current_figures.NOT_STATED,
}


def _without_tables(text: str, name: str) -> str:
    """``text`` with every table line of section ``name`` removed."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, rest = text.split(start, 1)
    body, tail = rest.split(end, 1)
    kept = "\n".join(line for line in body.splitlines() if not line.startswith("|"))
    return head + start + kept + "\n" + end + tail


def test_every_value_is_text_of_the_section_it_links_to() -> None:
    sections = read_sections(TEXT)
    figures = current_figures.extract(TEXT)
    assert {name for name, _ in current_figures.PARSERS} == {f.section for f in figures}
    for figure in figures:
        assert figure.value in sections[figure.section].text, figure
        assert figure.basis in BASES, figure
        assert any(ch.isdigit() for ch in figure.value), figure


def test_both_held_out_and_fitted_rows_are_there() -> None:
    bases = {(f.section, f.basis) for f in current_figures.extract(TEXT)}
    for name in ("step-time-accuracy-cpu", "speech-demo"):
        assert (name, current_figures.HELD_OUT) in bases
        assert (name, current_figures.FITTED) in bases


def test_the_committed_table_is_the_one_the_sections_give() -> None:
    sections = read_sections(TEXT)
    assert current_figures.SECTION in sections, "run `python -m bench current_figures --out ...`"
    written = sections[current_figures.SECTION].text
    table = current_figures.render(TEXT).split("| metric |", 1)[1]
    assert table.strip() in written
    # the table comes right after the intro paragraph, before every other section
    first = re.search(r"<!-- ([\w.-]+):start -->", TEXT)
    assert first and first.group(1) == current_figures.SECTION


def test_links_name_each_sections_heading() -> None:
    sections = read_sections(TEXT)
    rows = current_figures.render(TEXT).splitlines()
    for figure in current_figures.extract(TEXT):
        section = sections[figure.section]
        assert section.anchor.startswith(slug(section.heading))
        assert any(f"](#{section.anchor})" in row for row in rows)


@pytest.mark.parametrize("name", [n for n, _ in current_figures.PARSERS if n != "simulator-speed"])
def test_a_section_without_its_table_raises(name: str) -> None:
    with pytest.raises(MissingFigure, match=re.escape(repr(name))):
        current_figures.extract(_without_tables(TEXT, name))


def test_a_renamed_section_raises() -> None:
    text = TEXT.replace("<!-- gpu-check:", "<!-- gpu-check-old:")
    with pytest.raises(MissingFigure, match="'gpu-check'"):
        current_figures.extract(text)


def test_a_changed_summary_line_raises() -> None:
    text = re.sub(r"wall time: \*\*([\d.]+ s)\*\*", r"wall time: \1", TEXT)
    assert text != TEXT
    with pytest.raises(MissingFigure, match="'simulator-speed'"):
        current_figures.extract(text)


def test_the_markers_go_after_the_intro(tmp_path: Path) -> None:
    text = "# Benchmarks\n\nIntro line one\nline two.\n\n<!-- a:start -->\n## A\n<!-- a:end -->\n"
    placed = current_figures.place_markers(text)
    assert placed.startswith("# Benchmarks\n\nIntro line one\nline two.\n\n<!-- current-figures")
    assert placed.endswith("<!-- a:start -->\n## A\n<!-- a:end -->\n")
    assert current_figures.place_markers(placed) == placed
