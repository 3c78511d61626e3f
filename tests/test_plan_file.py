"""The plan as a file: format version, byte-stable JSON, fingerprints, `asrfit export`,
multi-node numbers and the fixed-batch accumulation rule."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from asrfit.cli.main import cli
from asrfit.errors import ConfigError
from asrfit.plan.exports import EXPORT_FORMATS
from asrfit.plan.fingerprint import check_fingerprints, fingerprints
from asrfit.plan.plan import PLAN_FORMAT_VERSION, Plan
from asrfit.plan.search import plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.model import ModelProfile
from tests.test_exports import example_plan

# the module fixtures of test_plan (simulation cache, dataset)
from tests.test_plan import MIB, _cache, _hardware, _tiny_config, dataset  # noqa: F401


def test_format_version_is_written_first_and_unknown_versions_are_refused(tmp_path):
    path = example_plan().save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    assert next(iter(data)) == "format_version" and data["format_version"] == PLAN_FORMAT_VERSION
    data["format_version"] = 99
    data["a_field_from_the_future"] = True  # the version is named, not this key
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"format_version=99 .* reads 1"):
        Plan.load(path)
    del data["format_version"], data["a_field_from_the_future"]  # older files: version 1
    path.write_text(json.dumps(data))
    assert Plan.load(path).format_version == 1


def test_the_same_inputs_give_the_same_plan_file_byte_for_byte(monkeypatch, dataset, tmp_path):  # noqa: F811
    hardware = _hardware(monkeypatch, 1200 * MIB)
    first = plan(hardware, dataset, _tiny_config()).save(tmp_path / "a.json").read_bytes()
    second = plan(hardware, dataset, _tiny_config()).save(tmp_path / "b.json").read_bytes()
    assert first == second
    again = Plan.load(tmp_path / "a.json").save(tmp_path / "c.json").read_bytes()
    assert again == first  # load -> save changes nothing


def test_fingerprints_refuse_another_model_gpu_or_dataset(monkeypatch, dataset, tmp_path):  # noqa: F811
    hardware = _hardware(monkeypatch, 1200 * MIB)
    saved = plan(hardware, dataset, _tiny_config())
    model = ModelProfile.from_spec(_tiny_config())
    assert saved.fingerprints == fingerprints(hardware, dataset, model)
    assert check_fingerprints(saved.fingerprints, saved.fingerprints, where="p.json") == []
    bigger = _tiny_config()
    bigger.num_hidden_layers = 4
    other_gpu = _hardware(monkeypatch, 1200 * MIB).__class__.from_name("T4")
    fewer = DatasetProfile.from_dict({**dataset.to_dict(), "num_utterances": 10})
    for changed, key in [
        (fingerprints(hardware, dataset, ModelProfile.from_spec(bigger)), "model"),
        (fingerprints(other_gpu, dataset, model), "gpu"),
        (fingerprints(hardware, fewer, model), "data"),
    ]:
        with pytest.raises(ConfigError, match=rf"(?s){key}: plan made for .*--force-plan"):
            check_fingerprints(saved.fingerprints, changed, where="p.json")
        lines = check_fingerprints(saved.fingerprints, changed, where="p.json", force=True)
        assert len(lines) == 1 and lines[0].startswith(key)


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_cli_exports_a_saved_plan(tmp_path, fmt):
    path = example_plan(zero_stage=2, world_size=4).save(tmp_path / "plan.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CliRunner().invoke(cli, ["export", str(path), "--to", fmt])
    assert result.exit_code == 0, result.output
    text = result.stdout
    data = yaml.safe_load(text) if fmt in ("accelerate", "nemo") else json.loads(text)
    assert data
    assert "utterances per step" in result.stderr


def test_cli_export_says_the_exporters_warnings_as_notes(tmp_path):
    # a DeepSpeed export of a plan without ZeRO warns; the CLI says it as a note on stderr,
    # not as a Python warning with the source file and line
    path = example_plan(zero_stage=0).save(tmp_path / "plan.json")
    result = CliRunner().invoke(cli, ["export", str(path), "--to", "deepspeed"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["zero_optimization"]["stage"] == 0
    assert "note: " in result.stderr and "ZeRO stage 0" in result.stderr
    assert "UserWarning" not in result.stderr and "exports.py" not in result.stderr


def test_cli_export_errors_name_the_problem(tmp_path):
    path = example_plan().save(tmp_path / "plan.json")
    bad = CliRunner().invoke(cli, ["export", str(path), "--to", "keras"])
    assert bad.exit_code != 0 and "lhotse" in bad.output
    missing = CliRunner().invoke(cli, ["export", str(tmp_path / "nope.json"), "--to", "hf"])
    assert missing.exit_code != 0 and "nope.json" in missing.output


def test_multi_node_numbers_in_the_exports():
    plan_ = Plan.from_dict({**example_plan(zero_stage=2, world_size=8).to_dict(), "num_nodes": 2})
    assert plan_.gpus_per_node == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from asrfit.plan.exports import export_plan

        accelerate = export_plan(plan_, "accelerate")
        lightning = export_plan(plan_, "lightning")
        ds = export_plan(plan_, "deepspeed")
    assert (accelerate["num_machines"], accelerate["num_processes"]) == (2, 8)
    assert accelerate["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    assert (lightning["num_nodes"], lightning["devices"]) == (2, 4)
    assert ds["train_batch_size"] == 5 * ds["gradient_accumulation_steps"] * 8
    with pytest.raises(ConfigError, match="num_nodes=3"):
        Plan.from_dict({**plan_.to_dict(), "num_nodes": 3})


def test_cli_plan_nodes_times_gpus_per_node_is_the_world_size(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"audio_filepath": "a.wav", "duration": 1.0, "text": "a"}))
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            "--model",
            "wav2vec2-base",
            "--data",
            str(manifest),
            "--gpu",
            "H100-80GB",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--world-size",
            "4",
        ],
    )
    assert result.exit_code != 0 and "disagrees" in result.output


@settings(max_examples=200, deadline=None)
@given(
    batch=st.integers(1, 64),
    world=st.integers(1, 16),
    target=st.integers(1, 4096),
)
def test_fixed_batch_accumulation_keeps_the_target_within_a_micro_batch(batch, world, target):
    p = example_plan(world_size=world)
    p = Plan.from_dict({**p.to_dict(), "target_effective_batch": f"{target} utterances"})
    accum = p.fixed_batch_accumulation_steps(batch)
    per_step = batch * world
    effective = batch * accum * world
    if target >= per_step:
        assert abs(effective - target) <= per_step / 2  # nearest multiple of a step
    else:
        assert accum == 1  # one micro-batch on each process is the least there is
    for other in (accum - 1, accum + 1):  # and no other accumulation is closer
        if other >= 1:
            assert abs(batch * other * world - target) >= abs(effective - target)


def test_a_resized_output_layer_or_skipped_utterances_keep_the_plan(monkeypatch, dataset):  # noqa: F811
    # `asrfit plan` profiles the config's output layer and the whole manifest; `asrfit train`
    # sizes the layer to the corpus's characters and plans on the utterances that pass validation
    hardware = _hardware(monkeypatch, 1200 * MIB)
    saved = plan(hardware, dataset, _tiny_config()).fingerprints
    resized = _tiny_config()
    resized.vocab_size = 20  # of 30
    durations = sorted(dataset.duration_sample_seconds)
    fewer = DatasetProfile.from_dict(
        {
            **dataset.to_dict(),
            "num_utterances": dataset.num_utterances - 1,
            "total_seconds": dataset.total_seconds - durations[0],
        }
    )
    current = fingerprints(hardware, fewer, ModelProfile.from_spec(resized))
    assert current["model"] != saved["model"] and current["data"] != saved["data"]
    assert check_fingerprints(saved, current, where="p.json") == []
    longer = DatasetProfile.from_dict(
        {**fewer.to_dict(), "duration_max_seconds": dataset.duration_max_seconds + 1}
    )
    with pytest.raises(
        ConfigError, match="data: plan made for"
    ):  # a longer utterance: limits may not fit
        check_fingerprints(
            saved, fingerprints(hardware, longer, ModelProfile.from_spec(resized)), where="p.json"
        )
