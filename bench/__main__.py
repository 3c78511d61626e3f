"""``python -m bench NAME [args...]``: run ``bench/NAME.py``'s ``main()`` with ``args``.

``python -m bench --list`` lists the benchmarks (and the finished investigations, as
``investigations.NAME``), each with its docstring's first line. ``python -m bench headline``
runs the headline set (what ``make bench`` runs), in order, each in a fresh interpreter;
``python -m bench headline --dry-run`` prints those commands instead.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent

# The benchmarks that write docs/benchmarks.md's headline sections, in the order they run.
HEADLINE: tuple[tuple[str, ...], ...] = (
    ("memory_accuracy", "--out", "docs/benchmarks.md"),
    ("sampler_efficiency", "--out", "docs/benchmarks.md"),
    ("plan_speed", "--out", "docs/benchmarks.md"),
    ("step_time_accuracy", "--out", "docs/benchmarks.md"),
    ("host_allocator", "--out", "docs/benchmarks.md"),
    ("profile_speed", "--out", "docs/benchmarks.md"),
    ("demo_training", "--out", "docs/benchmarks.md"),
    # Last: the "Current figures" table, read from the sections the steps above wrote.
    ("current_figures", "--out", "docs/benchmarks.md"),
)


def names() -> list[str]:
    """Every runnable module: ``bench/NAME.py`` and ``investigations.NAME``, sorted."""
    found = [p.stem for p in sorted(BENCH.glob("*.py")) if not p.stem.startswith("_")]
    folder = BENCH / "investigations"
    found += [
        f"investigations.{p.stem}"
        for p in sorted(folder.glob("*.py"))
        if not p.stem.startswith("_")
    ]
    return [n for n in found if n != "cases"]


def summary(name: str) -> str:
    """The first line of the module's docstring, read without importing it."""
    path = BENCH.joinpath(*name.split(".")).with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def run(name: str, args: list[str]) -> None:
    """Import ``bench.NAME`` and call its ``main()`` with ``args`` as the command line."""
    if name not in names():
        raise SystemExit(f"no benchmark {name!r}; `python -m bench --list` lists them")
    module = importlib.import_module(f"bench.{name}")
    sys.argv = [f"python -m bench {name}", *args]
    module.main()


def headline(dry_run: bool) -> None:
    """Run the headline set in order, each in a fresh interpreter; stop at the first failure."""
    for name, *args in HEADLINE:
        command = [sys.executable, "-m", "bench", name, *args]
        print("$ python -m bench " + " ".join([name, *args]), flush=True)
        if not dry_run:
            code = subprocess.call(command)
            if code:
                raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default: the command line) and run what it names."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if argv[0] == "--list":
        width = max(len(n) for n in [*names(), "headline"])
        print(f"{'headline':{width}s}  the headline set (`make bench`), in order")
        for name in names():
            print(f"{name:{width}s}  {summary(name)}")
        return
    if argv[0] == "headline":
        headline(dry_run="--dry-run" in argv[1:])
        return
    run(argv[0], argv[1:])


if __name__ == "__main__":
    main()
