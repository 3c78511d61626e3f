"""Marked sections of docs/benchmarks.md and the markdown tables in them, read back.

``read_sections`` finds each ``<!-- NAME:start -->`` ... ``<!-- NAME:end -->`` block with its
first heading and the anchor GitHub gives that heading; the helpers below find a table by its
first header, a row by its first cell, a line by a pattern, and raise :class:`MissingFigure`
naming the section when what they look for is not there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"^<!-- (?P<name>[\w.-]+):start -->$", re.MULTILINE)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


class MissingFigure(ValueError):
    """A section, or a figure in it, that a parser expected and did not find."""


@dataclass(frozen=True)
class Section:
    """One marked section: its name, its first heading, the anchor GitHub gives it, its text."""

    name: str
    heading: str
    anchor: str
    text: str


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before ``-1``, ``-2`` on repeats)."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _heading_anchors(text: str) -> dict[int, str]:
    """Line number -> anchor for every heading outside code fences, repeats numbered."""
    seen: dict[str, int] = {}
    found: dict[int, str] = {}
    fenced = False
    for number, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found[number] = base if count == 0 else f"{base}-{count}"
    return found


def read_sections(text: str) -> dict[str, Section]:
    """Every marked section of ``text`` by name, with its first heading and that heading's anchor."""
    anchors = _heading_anchors(text)
    lines = text.splitlines()
    sections: dict[str, Section] = {}
    for match in MARKER.finditer(text):
        name = match.group("name")
        end = f"<!-- {name}:end -->"
        stop = text.find(end, match.end())
        if stop < 0:
            raise MissingFigure(f"section {name!r} has no end marker {end}")
        first = text.count("\n", 0, match.end()) + 1
        last = text.count("\n", 0, stop)
        heading_line = next((n for n in range(first, last) if n in anchors), None)
        if heading_line is None:
            raise MissingFigure(f"section {name!r} has no heading")
        heading = HEADING.match(lines[heading_line]).group(2)
        sections[name] = Section(name, heading, anchors[heading_line], text[match.end() : stop])
    return sections


def require(section: Section, phrase: str) -> None:
    """Raise unless ``phrase`` (the wording a row's held-out/fitted label rests on) is there."""
    if phrase not in section.text:
        raise MissingFigure(f"section {section.name!r}: no longer says {phrase!r}")


def search(section: Section, pattern: str, what: str) -> re.Match[str]:
    """The first match of ``pattern`` (``^``/``$`` per line); ``what`` names it in the error."""
    match = re.search(pattern, section.text, re.MULTILINE)
    if match is None:
        raise MissingFigure(f"section {section.name!r}: no {what} (pattern {pattern!r})")
    return match


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def find_table(section: Section, first_header: str) -> list[list[str]]:
    """The body rows of the section's markdown table whose header starts with ``first_header``."""
    lines = section.text.splitlines()
    for number, line in enumerate(lines[:-1]):
        if line.startswith("|") and _cells(line)[0] == first_header:
            rows = []
            for row in lines[number + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            if rows:
                return rows
    raise MissingFigure(f"section {section.name!r}: no table headed {first_header!r}")


def find_row(section: Section, rows: list[list[str]], first_cell: str, tag: str = "") -> list[str]:
    """The row whose first cell (bold marks dropped) starts with ``first_cell`` and holds ``tag``."""
    for row in rows:
        if bare(row[0]).startswith(first_cell) and tag in row[0]:
            return row
    raise MissingFigure(f"section {section.name!r}: no table row {first_cell!r} {tag!r}".strip())


def find_column(section: Section, header: list[str], name: str) -> int:
    """The index of the column headed ``name``."""
    if name not in header:
        raise MissingFigure(f"section {section.name!r}: no table column {name!r}")
    return header.index(name)


def table_header(section: Section, first_header: str) -> list[str]:
    """The header cells of the table whose first header is ``first_header``."""
    for line in section.text.splitlines():
        if line.startswith("|") and _cells(line)[0] == first_header:
            return _cells(line)
    raise MissingFigure(f"section {section.name!r}: no table headed {first_header!r}")


def bare(cell: str) -> str:
    """A cell's text without bold marks."""
    return cell.replace("**", "").strip()
