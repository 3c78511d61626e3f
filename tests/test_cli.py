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
    # the reference: transformers' own Wav2Vec2ForCTC from the bundled config, on the meta
    # device; each fp32 parameter its own storage in 512-byte blocks; the convolutional feature
    # encoder frozen (as fine-tuning does): no gradient or AdamW moments for it
    model = reference_wav2vec2_base()
    blocks = lambda n: -(-n * 4 // 512) * 512  # noqa: E731
    trainable = [p for n, p in model.named_parameters() if ".feature_extractor." not in f".{n}"]
    params = report["breakdown_bytes"]
    assert params["parameters"] == sum(blocks(p.numel()) for p in model.parameters())
    assert params["gradients"] == sum(blocks(p.numel()) for p in trainable)
    assert params["optimizer_state"] == 2 * params["gradients"]  # exp_avg and exp_avg_sq
    assert report["fits"] is True
    # docs/memory_cuda.md: allocated = peak + the cuBLAS workspace (65 MiB on Hopper); reserved =
    # the blocks' segments (expandable: each pool rounded up to its 2 or 20 MiB page) plus the
    # workspace, x 1.02, rounded up to 2 MiB; the device total adds a 512 MiB CUDA context
    mib = 2**20
    cuda, peak = report["cuda"], step["peak_bytes"]
    assert cuda["allocated_bytes"] == peak + 65 * mib
    round2 = lambda b: -(-int(b) // (2 * mib)) * 2 * mib  # noqa: E731
    low, high = round2((peak + 65 * mib) * 1.02), round2((peak + 22 * mib + 65 * mib) * 1.02)
    assert low <= cuda["reserved_bytes"] <= high
    assert cuda["device_total_bytes"] == cuda["reserved_bytes"] + 512 * mib


def reference_wav2vec2_base():
    """wav2vec2-base as transformers builds it from asrfit's bundled config (no weights)."""
    from importlib.resources import files

    import torch
    import transformers

    path = files("asrfit.profiles") / "configs" / "wav2vec2-base.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.pop("asrfit_meta", None)
    with torch.device("meta"):
        return transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(**config))
