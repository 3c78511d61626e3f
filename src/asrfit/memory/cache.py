"""An on-disk cache of simulations, keyed by everything the result depends on.

Key: the model config (JSON), the setup, the batch shape, the kernel target, the number
of traced steps, the versions of asrfit, torch and transformers, and a hash of the source
of the code a trace runs (:func:`source_fingerprint`: ``asrfit.memory`` and the built-in
networks of ``asrfit.models``), so an edited checkout never reads a stale answer. Values are
``StepMemory`` JSON files written atomically. The folder is ``$ASRFIT_CACHE_DIR`` or
``~/.cache/asrfit/simulations``; ``ASRFIT_CACHE_DIR=off`` disables the cache.

The same folder keeps what a plan learns by building the model on the meta device (its
profile, its encoder layer count: :func:`cached_model_fact`), so that a plan whose
simulations are all cached never imports the model's modelling code (about 2 s of a warm plan).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape, StepMemory
from asrfit.memory.steptime.roofline import RUNTIME_VERSION
from asrfit.utils.io import atomic_write_text

logger = logging.getLogger(__name__)

CPU_SCRATCH_RULES_VERSION = 2  # bump when asrfit.memory.trace.scratch / cpu_kernels change


# Packages whose source decides a simulation's result (relative to the asrfit package).
TRACED_SOURCE_PACKAGES = ("memory", "models")


# Packages whose source decides a model fact (the profile code besides the traced code).
MODEL_FACT_SOURCE_PACKAGES = (*TRACED_SOURCE_PACKAGES, "profiles")


@functools.lru_cache(maxsize=2)
def source_fingerprint(packages: tuple[str, ...] = TRACED_SOURCE_PACKAGES) -> str:
    """A hash of every ``.py`` file of ``packages`` (path and bytes)."""
    return tree_fingerprint(Path(__file__).resolve().parent.parent, packages)


def tree_fingerprint(root: Path, packages: tuple[str, ...] = TRACED_SOURCE_PACKAGES) -> str:
    """:func:`source_fingerprint` of the package tree under ``root``."""
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path | None:
    """The cache folder, or None when disabled."""
    value = os.environ.get("ASRFIT_CACHE_DIR", "")
    if value.lower() == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "asrfit" / "simulations"


def _installed_version(package: str) -> str:
    """A package's installed version, read from its metadata without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=1)
def _transformers_version() -> str:
    """transformers' installed version (0.7 s to import; a warm plan of a bundled model
    imports none of it)."""
    return _installed_version("transformers")


@functools.lru_cache(maxsize=1)
def _torch_version() -> str:
    """torch's installed version (1.3 s to import; a warm plan imports none of it)."""
    return _installed_version("torch")


def _versions() -> list[str]:
    """The asrfit, torch and transformers versions (part of every key)."""
    from asrfit.version import __version__

    return [__version__, _torch_version(), _transformers_version()]


def cache_key(
    model_key: str,
    batch: BatchShape,
    setup: Setup,
    target: str,
    steps: int,
    optimizer_step: bool = True,
    forward_backward: bool = True,
) -> str:
    """A stable hash of a simulation's inputs and the library versions."""
    inputs: dict[str, object] = {
        "model": model_key,
        "batch": batch.to_dict(),
        "setup": setup.to_dict(),
        "target": target,
        "steps": steps,
        "op_costs": RUNTIME_VERSION,  # StepMemory.cost (asrfit.memory.steptime.runtime)
        "versions": _versions(),
        "source": source_fingerprint(),
    }
    if not optimizer_step:  # simulate_step(..., optimizer_step=False)
        inputs["optimizer_step"] = False
    if not forward_backward:  # simulate_step(..., forward_backward=False)
        inputs["forward_backward"] = False
    if target == "cpu":
        import torch  # a CPU target's traces depend on this CPU and its threads

        inputs["cpu_scratch"] = CPU_SCRATCH_RULES_VERSION  # CPU traces add kernel scratch
        # measured on this CPU (asrfit.memory.trace.cpu_kernels), with this many threads
        inputs["cpu"] = [torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()]
    payload = json.dumps(inputs, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _read_through(
    name: str,
    load: Callable[[Path], Any],
    compute: Callable[[], Any],
    save: Callable[[Path, Any], Any],
    damaged: tuple[type[Exception], ...],
) -> Any:
    """The entry ``name`` of the cache folder, or ``compute()`` stored there (atomically)."""
    folder = cache_dir()
    path = folder / name if folder is not None else None
    if path is not None and path.is_file():
        try:
            return load(path)
        except damaged as exc:  # an old or damaged entry: recompute and overwrite
            logger.warning("ignoring cache entry %s: %s", path, exc)
    value = compute()
    if path is not None:
        try:
            save(path, value)
        except OSError as exc:
            logger.warning("could not write cache entry %s: %s", path, exc)
    return value


def cached_model_fact(kind: str, inputs: dict[str, Any], compute: Callable[[], Any]) -> Any:
    """A JSON value about a model (``kind``: "profile", "encoder_layers"), cached on disk.

    Keyed by ``kind``, ``inputs`` (the model config and what else the value depends on),
    the asrfit, torch and transformers versions and the source of
    :data:`MODEL_FACT_SOURCE_PACKAGES`; computed and stored on a miss. ``compute`` must
    return plain JSON data.
    """
    payload = {
        "kind": kind,
        "inputs": inputs,
        "versions": _versions(),
        "source": source_fingerprint(MODEL_FACT_SOURCE_PACKAGES),
    }
    key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    return _read_through(
        f"{kind}-{key[:32]}.json",
        lambda path: json.loads(path.read_text(encoding="utf-8"))["value"],
        compute,
        lambda path, value: atomic_write_text(
            path, json.dumps({"kind": kind, "value": value}) + "\n"
        ),
        (OSError, ValueError, KeyError, TypeError),
    )


def is_cached(key: str) -> bool:
    """Whether the simulation ``key`` has an entry in the cache folder (False when disabled)."""
    folder = cache_dir()
    return folder is not None and (folder / f"{key}.json").is_file()


def cached(key: str, compute: Callable[[], StepMemory]) -> StepMemory:
    """Return the cached result for ``key``, computing and storing it on a miss."""
    return _read_through(
        f"{key}.json", StepMemory.load, compute, lambda path, step: step.save(path), (ConfigError,)
    )


def model_key(config: object) -> str:
    """A stable string for a transformers config (its JSON), for cache keys."""
    to_dict = getattr(config, "to_diff_dict", None) or getattr(config, "to_dict", None)
    data = to_dict() if to_dict is not None else repr(config)
    return json.dumps(data, sort_keys=True, default=str)
