"""The package's shape: one-way layers, no import cycles, no source file over 500 lines.

Every import of an asrfit module counts: at the top of a file, inside a function, under
``TYPE_CHECKING``, and by name through ``importlib.import_module`` or a lazy-import table (any
string constant that names an asrfit module). docs/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 500

# Layer of each top-level part of asrfit; a module may import only from its own layer or lower.
LAYERS: dict[str, int] = {
    "asrfit.errors": 0,
    "asrfit.utils": 0,
    "asrfit.version": 0,
    "asrfit.models": 1,
    "asrfit.profiles": 2,
    "asrfit.memory": 3,
    "asrfit.plan": 4,
    "asrfit.data": 5,
    "asrfit.testing": 5,
    "asrfit.train": 6,
    "asrfit.recipes": 7,
    "asrfit.cli": 8,
    "asrfit.seed": 8,
    "asrfit": 8,  # the root package's lazy names: a facade like asrfit.seed
}

# Inside asrfit.memory, the layer of each subpackage and of each module at its root; a module
# imports only from its own layer or lower, so the subpackages form a DAG.
MEMORY_LAYERS: dict[str, int] = {
    "asrfit.memory.setup": 0,  # a setup: precision, checkpointing, optimizer, ZeRO
    "asrfit.memory.trace": 1,  # the fake-tensor trace: storages, values, kernels, optimizers
    "asrfit.memory.steptime": 2,  # op counts of a trace, and their seconds on a device
    "asrfit.memory.step": 3,  # what a step is and what its simulation returns
    "asrfit.memory.models": 4,  # the step adapters of each model family
    "asrfit.memory.cuda": 4,  # the caching allocator, ZeRO / DDP by formula
    "asrfit.memory.simulate": 5,  # simulate_step
    "asrfit.memory.peaks": 5,  # a traced log's peaks and breakdown
    "asrfit.memory.tape": 5,  # a traced step replayed at another batch
    "asrfit.memory.tape_lengths": 5,  # ... and at another batch of other lengths
    "asrfit.memory.fit": 6,  # cost model, full depth from reduced depths
    "asrfit.memory.custom": 6,  # simulate_model
    "asrfit.memory.real_step": 6,  # the same step on real tensors
    "asrfit.memory.cache": 6,  # simulations on disk
    "asrfit.memory.report": 7,  # simulate, from a model name
    "asrfit.memory": 8,  # the package's lazy names
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / "asrfit").rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The asrfit module that ``name`` (a module or a name inside one) refers to."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The asrfit modules ``module`` depends on."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from pkg import submodule`` depends on the submodule; a plain name, on pkg.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("asrfit.")
            and node.value in MODULES
        ):
            names = [node.value]
        for name in names:
            target = _resolve(name) if name.startswith("asrfit") else None
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _part(module: str) -> str:
    """The top-level part (``asrfit.memory``, ``asrfit.errors``) a module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_every_part_has_a_layer():
    unknown = sorted({_part(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"give these a layer in LAYERS (and docs/architecture.md): {unknown}"


def test_the_resolver_sees_each_kind_of_import():
    # Guard the guard: a top-level import, a relative-free from-import of a submodule, a
    # function-level import, and a lazy table entry are all seen.
    assert "asrfit.memory.trace.tracker" in GRAPH["asrfit.memory.models.adapters"]
    assert "asrfit.train.checkpoint" in GRAPH["asrfit.train.trainer"]
    assert "asrfit.train.trainer" in GRAPH["asrfit"]
    assert "asrfit.models.conformer" in GRAPH["asrfit.profiles.registry"]


def test_no_upward_imports():
    upward = sorted(
        f"{module} (layer {LAYERS[_part(module)]}) imports {target} (layer {LAYERS[_part(target)]})"
        for module, targets in GRAPH.items()
        for target in targets
        if LAYERS[_part(target)] > LAYERS[_part(module)]
    )
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def _memory_part(module: str) -> str:
    """The entry of :data:`MEMORY_LAYERS` a module of ``asrfit.memory`` belongs to."""
    parts = module.split(".")
    return ".".join(parts[:3])


def test_every_memory_part_has_a_layer():
    unknown = sorted(
        {_memory_part(m) for m in MODULES if _part(m) == "asrfit.memory"} - set(MEMORY_LAYERS)
    )
    assert not unknown, f"give these a layer in MEMORY_LAYERS (and docs/architecture.md): {unknown}"


def test_no_upward_imports_inside_memory():
    upward = sorted(
        f"{module} (layer {MEMORY_LAYERS[_memory_part(module)]}) imports {target} "
        f"(layer {MEMORY_LAYERS[_memory_part(target)]})"
        for module, targets in GRAPH.items()
        if _part(module) == "asrfit.memory"
        for target in targets
        if _part(target) == "asrfit.memory"
        and MEMORY_LAYERS[_memory_part(target)] > MEMORY_LAYERS[_memory_part(module)]
    )
    assert not upward, "imports against asrfit.memory's layer order:\n" + "\n".join(upward)


def test_no_module_import_cycle():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "module import cycle: " + " -> ".join(cycle or [])


def test_no_package_import_cycle():
    packages: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        packages.setdefault(_part(module), set()).update(
            _part(t) for t in targets if _part(t) != _part(module)
        )
    packages.pop("asrfit", None)  # the root's lazy table names everything; nothing imports it
    for targets in packages.values():
        targets.discard("asrfit")
    cycle = _find_cycle(packages)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle or [])


def test_nothing_in_the_core_imports_the_facades():
    facades = {"asrfit", "asrfit.seed", "asrfit.cli"}
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _part(module) not in facades
        for target in targets
        if _part(target) in facades
    )
    assert not offenders, "\n".join(offenders)


def test_no_source_file_over_500_lines():
    too_long = sorted(
        f"{path} has {n} lines"
        for path in MODULES.values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert not too_long, "split these along a responsibility:\n" + "\n".join(too_long)


def test_source_states_no_history() -> None:
    """Provenance (dates, issue numbers) lives in git and docs/history.md, not in src/."""
    pattern = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ii]ssue \d+\b")
    found = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted(SRC.rglob("*"))
        if path.suffix in {".py", ".json"} and "egg-info" not in str(path)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if pattern.search(line)
    ]
    assert not found, f"dates or issue numbers in source: {found}"
