"""The thin CLI: real commands through click's runner, asserting exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.testing import write_manifest


def test_unknown_gpu_is_a_usage_error_with_suggestions() -> None:
    result = CliRunner().invoke(cli, ["profile", "--gpu", "A100-50GB"])
    assert result.exit_code == 2  # checked while parsing, like every option
    assert "--gpu" in result.output
    assert "A100-40GB" in result.output and "A100-80GB" in result.output


def test_profile_json_has_three_profiles(tmp_path: Path) -> None:
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, [{"audio_filepath": "a.wav", "duration": 2.0, "text": "hello"}])
    result = CliRunner().invoke(
        cli,
        ["profile", "--gpu", "L4", "--data", str(manifest), "--model", "wav2vec2-base", "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["dataset"]["num_utterances"] == 1
    assert data["dataset"]["total_seconds"] == 2.0
    assert data["model"]["family"] == "wav2vec2"
    assert data["hardware"]["spec"]["name"] == "L4"


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["profile", "--gpu", "L4", "--data", str(tmp_path / "nope.jsonl")]
    )
    assert result.exit_code == 2 and "--data" in result.output
    assert "nope.jsonl" in result.output


def test_demo_data_writes_manifests(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["demo-data", str(out), "--num-train", "4", "--num-dev", "2", "--num-test", "2"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    lines = (out / "train.jsonl").read_text().splitlines()
    assert len(lines) == 4
    again = CliRunner().invoke(cli, args)  # refuses to overwrite the user's corpus
    assert again.exit_code == 1
    assert str(out) in again.output


def test_memory_json_breakdown_sums_and_verdicts() -> None:
    base = ["memory", "--model", "wav2vec2-base", "--batch", "1", "--seconds", "1", "--json"]
    result = CliRunner().invoke(cli, [*base, "--gpu", "H100"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    step = report["step"]
    assert sum(step["breakdown_bytes"].values()) == step["peak_bytes"]
    # 94.4M params fp32 (frozen conv encoder included) and AdamW state for the trainable part.
    assert report["breakdown_bytes"]["parameters"] >= 94_000_000 * 4
    assert report["fits"] is True
    assert (
        report["cuda"]["reserved_bytes"] >= report["cuda"]["allocated_bytes"] >= step["peak_bytes"]
    )
