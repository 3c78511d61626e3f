"""Write one marked section of docs/benchmarks.md, keeping the others."""

from __future__ import annotations

from pathlib import Path

from asrfit.utils.io import atomic_write_text


def write_section(path: Path, name: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- name:start -->`` and ``<!-- name:end -->``.

    Other sections of the file are left as they are, so several benchmarks share one file.
    """
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    atomic_write_text(path, text)
