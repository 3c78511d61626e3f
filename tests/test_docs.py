"""README.md stays short, and the links of README.md and docs/*.md lead somewhere.

A relative link must name a file of the repository; an anchor (``#...``) must match a
heading of its target file as GitHub makes anchors from headings (lower case, punctuation
dropped, spaces as hyphens, ``-1``, ``-2`` ... on repeats).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 200
MAX_LINE_CHARS = 200

# [text](target) and ![alt](target); the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (code may show link-like text)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of ``path``."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: Path) -> list[str]:
    """The link targets in ``path``'s prose (not in code blocks)."""
    found = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        found += LINK.findall(line)
    return found


def test_slug_matches_github() -> None:
    assert _slug("Step time: predicted vs measured (CPU)") == "step-time-predicted-vs-measured-cpu"
    assert _slug("`asrfit train --gpu auto` on the demo corpus") == (
        "asrfit-train---gpu-auto-on-the-demo-corpus"
    )
    assert _slug("Calibration on the machine that trains (`asrfit calibrate`)") == (
        "calibration-on-the-machine-that-trains-asrfit-calibrate"
    )


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters (line, length): {long}"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{path.name}: broken links:\n" + "\n".join(broken)


def test_api_names_documented() -> None:
    """The public names the README points at are findable in docs/api.md."""
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    names = [
        "create_optimal_config",
        "ASRConfigManager",
        "HardwareProfile",
        "DatasetProfile",
        "ModelProfile",
        "TrainingConfig",
        "MemoryEfficientTrainer",
        "AdaptiveMemoryCallback",
    ]
    missing = [name for name in names if name not in api]
    assert not missing, f"docs/api.md does not mention {missing}"
    assert "docs/api.md" in README.read_text(encoding="utf-8")
