"""Write one marked section of docs/benchmarks.md, keeping the others."""

from __future__ import annotations

import re
from pathlib import Path

HEADER = "# Benchmarks\n\nEvery figure below comes from the command printed beside it.\n"


def write_section(path: Path, key: str, title: str, body: str) -> None:
    """Replace (or append) the section between ``<!-- key:start -->`` and ``<!-- key:end -->``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    block = f"<!-- {key}:start -->\n## {title}\n\n{body.rstrip()}\n<!-- {key}:end -->"
    pattern = re.compile(rf"<!-- {re.escape(key)}:start -->.*?<!-- {re.escape(key)}:end -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
