"""The simulation cache key covers everything that changes a simulation's answer.

Each input is changed on its own: the key must change and :func:`cached` must recompute
(a miss); the same inputs must hit without recomputing.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Wav2Vec2Config

from asrfit.memory import cache
from asrfit.memory.cache import model_key
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import StepMemory, simulate_step
from asrfit.memory.step import BatchShape, StepAdapter

SHAPE = BatchShape(2, 64, 3)


def _config_key(**changes: object) -> str:
    cfg = Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, **changes)
    return model_key("wav2vec2" + repr(cfg))


@pytest.fixture(scope="module")
def result() -> StepMemory:
    def build() -> nn.Module:
        return nn.Linear(64, 8)

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(shape.batch_size, shape.input_length)}

    adapter = StepAdapter("lin", build, make_inputs, lambda m, kw: m(kw["x"]).sum())
    return simulate_step(adapter, SHAPE, Setup(optimizer="sgd"), steps=1)


BASE = {"model_key": _config_key(), "batch": SHAPE, "setup": Setup(), "target": "cuda", "steps": 1}
CHANGES = {
    "model config": {"model_key": _config_key(num_attention_heads=4)},
    "batch": {"batch": BatchShape(3, 64, 3)},
    "labels": {"batch": BatchShape(2, 64, 4)},
    "precision": {"setup": Setup(precision="bf16")},
    "checkpointing": {"setup": Setup(gradient_checkpointing=True)},
    "optimizer": {"setup": Setup(optimizer="adafactor")},
    "target": {"target": "cpu"},
    "steps": {"steps": 2},
    "no optimizer step": {"optimizer_step": False},
    "optimizer step alone": {"forward_backward": False},
}


def _key(**changes: object) -> str:
    return cache.cache_key(**{**BASE, **changes})


def test_same_inputs_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, result: StepMemory
) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    calls: list[int] = []

    def compute() -> StepMemory:
        calls.append(1)
        return result

    first = cache.cached(_key(), compute)
    again = cache.cached(_key(), compute)
    assert calls == [1]
    assert again.peak_bytes == first.peak_bytes == result.peak_bytes


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_each_input_misses(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, result: StepMemory
) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    calls: list[str] = []
    cache.cached(_key(), lambda: calls.append("base") or result)
    changed = _key(**CHANGES[name])
    assert changed != _key()
    cache.cached(changed, lambda: calls.append(name) or result)
    assert calls == ["base", name]


@pytest.mark.parametrize("module", ["torch", "transformers", "asrfit.version"])
def test_library_versions_change_the_key(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _key()
    if module == "transformers":  # its installed distribution's version, read without importing it
        monkeypatch.setattr(cache, "_transformers_version", lambda: "999.0.0")
    elif module == "torch":  # the same: a warm plan imports no torch
        monkeypatch.setattr(cache, "_torch_version", lambda: "999.0.0")
    else:
        monkeypatch.setattr(importlib.import_module(module), "__version__", "999.0.0")
    assert _key() != before


def test_transformers_version_is_the_installed_one() -> None:
    import transformers

    assert cache._transformers_version() == transformers.__version__


def test_source_of_the_traced_code_changes_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = Path(cache.__file__).resolve().parent.parent
    copy = tmp_path / "asrfit"
    for name in cache.TRACED_SOURCE_PACKAGES:
        shutil.copytree(package / name, copy / name)
    # the copy hashes like the installed tree; one edited byte in a traced module changes it
    assert cache.tree_fingerprint(copy) == cache.source_fingerprint()
    target = copy / "memory" / "trace" / "datadep.py"
    target.write_text(target.read_text() + "\n# edited\n")
    edited = cache.tree_fingerprint(copy)
    assert edited != cache.source_fingerprint()
    before = _key()
    monkeypatch.setattr(cache, "source_fingerprint", lambda: edited)
    assert _key() != before
