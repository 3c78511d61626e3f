"""bench/ is a package with one runner: no path edits, no private imports, no import cycles.

Every benchmark runs as ``python -m bench NAME`` from the repository root; the modules import
each other as ``bench.x`` and the library through its public names only (what a benchmark
needs is promoted to public API, never reached by an underscore).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SRC = ROOT / "src"
PATH_EDITS = ("sys.path." + "insert", "sys.path." + "append")  # split: this file is scanned


def _bench_files() -> list[Path]:
    return sorted(BENCH.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(ROOT)])}


def test_no_file_edits_sys_path() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {edit}"
        for path in [*_bench_files(), *sorted((ROOT / "tests").glob("*.py"))]
        for edit in PATH_EDITS
        if edit in path.read_text(encoding="utf-8")
    ]
    assert not found, found


def _is_asrfit_module(name: str) -> bool:
    """Whether ``name`` (dotted) is a module or package of asrfit's source."""
    base = SRC.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _private_uses(path: Path) -> list[str]:
    """asrfit names starting with an underscore that ``path`` imports or reaches by attribute."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()  # local names bound to asrfit modules
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "asrfit":
                    continue
                if any(part.startswith("_") for part in alias.name.split(".")):
                    found.append(f"import {alias.name}")
                modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "asrfit":
            for alias in node.names:
                if alias.name.startswith("_") or any(
                    part.startswith("_") for part in node.module.split(".")
                ):
                    found.append(f"from {node.module} import {alias.name}")
                if _is_asrfit_module(f"{node.module}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_bench_module_uses_a_private_asrfit_name() -> None:
    found = {
        str(path.relative_to(ROOT)): uses
        for path in _bench_files()
        if (uses := _private_uses(path))
    }
    assert not found, found


def test_the_private_name_check_sees_each_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from asrfit.memory.simulate import _build\n"
        "from asrfit.models import dropout as D\n"
        "import asrfit.plan.bucketing as bucketing\n"
        "D._fast(1, 2)\n"
        "bucketing._step_seconds = None\n"
        "from asrfit.memory.simulate import simulate_step\n",
        encoding="utf-8",
    )
    found = _private_uses(sample)
    assert len(found) == 3, found


def _bench_imports(path: Path) -> set[str]:
    """The bench modules ``path`` imports (``from bench import x``, ``from bench.x import``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench"):
            if node.module == "bench" or node.module == "bench.investigations":
                names.update(f"{node.module}.{a.name}" for a in node.names)
            else:
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("bench."))
    return names


def test_bench_imports_have_no_cycle() -> None:
    graph = {_module_name(p): _bench_imports(p) for p in _bench_files()}
    for targets in graph.values():
        assert targets <= set(graph), targets - set(graph)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            assert state.get(target) != 1, " -> ".join([*path, module, target])
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_every_bench_module_imports() -> None:
    """Each module imported (not run) in one fresh interpreter, in order."""
    names = [_module_name(p) for p in _bench_files() if p.name != "__main__.py"]
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *names],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_runner_lists_every_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--list"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
    runnable = {
        _module_name(p).removeprefix("bench.")
        for p in _bench_files()
        if not p.name.startswith("_") and p.name != "cases.py"
    }
    assert runnable <= listed, runnable - listed
    assert "headline" in listed


def test_the_headline_set_is_what_make_bench_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "headline", "--dry-run"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    commands = [line.removeprefix("$ ") for line in done.stdout.splitlines()]
    assert commands[0] == "python -m bench memory_accuracy --out docs/benchmarks.md"
    assert commands[-2] == "python -m bench demo_training --out docs/benchmarks.md"
    assert commands[-1] == "python -m bench current_figures --out docs/benchmarks.md"
    assert len(commands) == 8
    assert "$(BIN)/python -m bench headline" in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_case_sets_carry_their_dates_and_do_not_repeat_cases() -> None:
    from bench.cases import CASE_SETS

    assert CASE_SETS
    for name, case_set in CASE_SETS.items():
        assert case_set.name == name and case_set.cases and case_set.held_out_from
        assert case_set.role in ("held out", "diagnosis", "fitted")
        assert case_set.written.year >= 2026
    for benchmark in ("memory", "step-time", "plan-speed"):
        names = [
            getattr(c, "name", None)
            for s in CASE_SETS.values()
            if s.benchmark == benchmark
            for c in s.cases
        ]
        assert len(names) == len(set(names)), "a case written twice"
