"""A plan whose simulations are all cached builds no model and imports no modelling code.

The model facts a plan needs from a meta-device build (its profile, its encoder layer
count) are cached beside the simulations (:func:`asrfit.memory.cache.cached_model_fact`),
and the adapter looks its model class up only when it first builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import Wav2Vec2Config

from asrfit.memory import cache
from asrfit.memory.report import resolve_adapter
from asrfit.profiles.model import ModelProfile
from asrfit.testing import write_manifest

PLAN = """
import json, sys
from transformers import Wav2Vec2Config
from asrfit.plan.search import plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
config = Wav2Vec2Config(**json.loads(sys.argv[2]))
p = plan(HardwareProfile.from_name("L4"), DatasetProfile.from_manifest(sys.argv[1]), config)
print("RESULT " + json.dumps({
    "plan": p.setup.describe() + repr([(b.max_seconds, b.batch_size) for b in p.buckets]),
    "modelling": sorted(m for m in sys.modules if m == "transformers.modeling_utils"
                        or m.startswith("transformers.models.wav2vec2.modeling")),
    "heavy": sorted(m for m in ("scipy.optimize", "pandas") if m in sys.modules),
}))
"""

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "conv_dim": [32, 32],
    "conv_stride": [5, 4],
    "conv_kernel": [10, 4],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "vocab_size": 30,
    "feat_extract_norm": "layer",
    "layerdrop": 0.0,
    "architectures": ["Wav2Vec2ForCTC"],
}


def _run(code: str, args: list[str], cache_dir: Path) -> dict:
    """Run ``code`` in a fresh process with its own cache folder; its RESULT line."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, "ASRFIT_CACHE_DIR": str(cache_dir), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT"))[7:])


def _plan(manifest: Path, cache_dir: Path) -> dict:
    return _run(PLAN, [str(manifest), json.dumps(TINY)], cache_dir)


def test_a_warm_plan_imports_no_modelling_code(tmp_path: Path) -> None:
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": 1.0 + 0.5 * i, "text": "ab " * (2 + i)}
        for i in range(12)
    ]
    manifest = write_manifest(tmp_path / "train.jsonl", rows)
    cold = _plan(manifest, tmp_path / "cache")
    warm = _plan(manifest, tmp_path / "cache")
    assert "transformers.models.wav2vec2.modeling_wav2vec2" in cold["modelling"]
    assert "transformers.modeling_utils" in cold["modelling"]
    assert warm["modelling"] == []  # nothing built: every fact came from the cache
    assert warm["heavy"] == []  # NNLS and the manifest scan need neither (0.5-1 s of imports)
    assert warm["plan"] == cold["plan"]


def test_cached_profile_equals_a_fresh_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    config = Wav2Vec2Config(**TINY)
    _, first = resolve_adapter(config)
    _, again = resolve_adapter(config)  # read back from the cache
    assert len(list(tmp_path.glob("profile-*.json"))) == 1
    fresh = ModelProfile.from_config(Wav2Vec2Config(**TINY))
    assert again == first == fresh  # every field, the config dict included


@pytest.mark.parametrize(
    "change",
    [{"config": {**TINY, "hidden_size": 32}}, {"freeze_feature_encoder": False}],
    ids=["config", "freezing"],
)
def test_each_model_fact_input_misses(
    change: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    base = {"config": TINY, "freeze_feature_encoder": True}
    calls: list[str] = []
    assert cache.cached_model_fact("profile", base, lambda: calls.append("base") or 1) == 1
    assert cache.cached_model_fact("profile", base, lambda: calls.append("again") or 2) == 1
    assert (
        cache.cached_model_fact("profile", {**base, **change}, lambda: calls.append("x") or 3) == 3
    )
    assert calls == ["base", "x"]


def test_a_damaged_model_fact_is_recomputed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    cache.cached_model_fact("encoder_layers", {"config": TINY}, lambda: 2)
    (path,) = tmp_path.glob("encoder_layers-*.json")
    path.write_text("{not json")
    assert cache.cached_model_fact("encoder_layers", {"config": TINY}, lambda: 3) == 3
    assert json.loads(path.read_text())["value"] == 3


RESOLVE = """
import json, sys
from asrfit.memory.report import resolve_adapter
adapter, profile = resolve_adapter(sys.argv[1])
print("RESULT " + json.dumps({
    "name": adapter.name, "made": adapter.made, "profile": profile.to_dict(),
    "transformers": "transformers" in sys.modules,
}))
"""


def _resolve(name: str, cache_dir: Path) -> dict:
    return _run(RESOLVE, [name], cache_dir)


def test_a_bundled_name_warm_imports_no_transformers(tmp_path: Path) -> None:
    cold = _resolve("conformer-ctc-tiny", tmp_path)
    warm = _resolve("conformer-ctc-tiny", tmp_path)
    assert cold["transformers"]  # the first one loads the config to profile the model
    assert not warm["transformers"]  # then config dict and profile are cached facts
    assert warm["profile"] == cold["profile"]
    assert warm["name"] == "conformer-ctc-tiny" and not warm["made"]
    from asrfit.profiles.model import load_config

    fresh = ModelProfile.from_spec(load_config("conformer-ctc-tiny")).to_dict()
    assert warm["profile"] == fresh


def test_deferred_adapter_traces_like_the_eager_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asrfit.memory.models.generic import speech_adapter
    from asrfit.memory.simulate import simulate_step
    from asrfit.memory.step import BatchShape, DeferredAdapter
    from asrfit.profiles.model import load_config

    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    deferred, _ = resolve_adapter("conformer-ctc-tiny")
    assert isinstance(deferred, DeferredAdapter) and not deferred.made
    eager = speech_adapter(load_config("conformer-ctc-tiny"), name="conformer-ctc-tiny")
    batch = BatchShape(2, 300, 20)
    a, b = simulate_step(deferred, batch), simulate_step(eager, batch)
    assert deferred.made
    assert (a.peak_bytes, a.breakdown_bytes, a.flops) == (b.peak_bytes, b.breakdown_bytes, b.flops)
    assert deferred.supports_checkpointing == eager.supports_checkpointing
    assert deferred.config.to_dict() == eager.config.to_dict()


BUNDLED_PLAN = """
import json, sys
from asrfit.plan.search import plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
p = plan(HardwareProfile.from_name("T4"), DatasetProfile.from_manifest(sys.argv[1]), sys.argv[2])
print("RESULT " + json.dumps({
    "plan": p.to_dict(),
    "imported": sorted(m for m in ("torch", "transformers") if m in sys.modules),
}))
"""


def test_a_warm_plan_of_a_bundled_name_imports_no_torch(tmp_path: Path) -> None:
    """The simulation cache holds torch-free results (asrfit.memory.step, .roofline): a warm
    plan reads and times them without importing torch (1.3 s of a 2 s warm plan)."""
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": 1.0 + 0.5 * i, "text": "ab " * (2 + i)}
        for i in range(12)
    ]
    manifest = write_manifest(tmp_path / "train.jsonl", rows)
    args = [str(manifest), "conformer-ctc-tiny"]
    cold = _run(BUNDLED_PLAN, args, tmp_path / "cache")
    warm = _run(BUNDLED_PLAN, args, tmp_path / "cache")
    assert cold["imported"] == ["torch", "transformers"]  # the cold plan traced steps
    assert warm["imported"] == []
    for run in (cold, warm):  # host RAM is read afresh by each run and quoted in the reasons
        run["plan"]["data"].pop("reasons")
    assert warm["plan"] == cold["plan"]
