"""Write one marked section of docs/benchmarks.md, keeping the others."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

from asrfit.utils.io import atomic_write_text

STAMP_PREFIX = "<sub>Section written"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def section_stamp(now: datetime | None = None) -> str:
    """The line that ends every written section: when, and at which commit of this checkout
    (with a note when tracked files other than docs/ differ from it)."""
    now = now or datetime.now(timezone.utc)
    commit = _git("rev-parse", "--short=10", "HEAD")
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")
    where = f"commit `{commit}`" if commit else "an unknown commit (not a git checkout)"
    if changed:
        where += " with uncommitted changes"
    return f"{STAMP_PREFIX} {now:%Y-%m-%d %H:%M} UTC by its command, at {where}.</sub>"


def write_section(path: Path, name: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- name:start -->`` and ``<!-- name:end -->``,
    ending it with :func:`section_stamp` (date and commit).

    Other sections of the file are left as they are, so several benchmarks share one file.
    """
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip()}\n\n{section_stamp()}\n{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    atomic_write_text(path, text)
