"""Seconds become the model's own input length, for every input kind, on every public route.

The reference is the model's Hugging Face feature extractor run on the same seconds of
audio (raw samples, filterbank frames at its hop, frames stacked by its stride, Whisper's
padded window): the prediction must size the step for what the extractor hands the model.
A filterbank's frame count differs from ``seconds x rate`` by its window edge (a frame or
two), which the tolerance allows; the raw sample count in place of frames does not pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from click.testing import CliRunner

from asrfit.cli.main import cli
from asrfit.memory.report import simulate

SECONDS, BATCH = 3.05, 3
EDGE_FRAMES = 3  # a filterbank's frames differ from seconds x rate by its window edge


def _speech_to_text() -> transformers.PretrainedConfig:
    config = transformers.Speech2TextConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=50,
        input_feat_per_channel=80,
        conv_channels=16,
        max_source_positions=500,
        max_target_positions=32,
    )
    config.architectures = ["Speech2TextForConditionalGeneration"]
    return config


def _wav2vec2_bert() -> transformers.PretrainedConfig:
    config = transformers.Wav2Vec2BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        output_hidden_size=32,
        vocab_size=40,
        pad_token_id=0,
        layerdrop=0.0,
    )
    config.architectures = ["Wav2Vec2BertForCTC"]
    return config


def _moonshine() -> transformers.PretrainedConfig:
    config = transformers.MoonshineConfig(
        hidden_size=32,
        intermediate_size=64,
        encoder_num_hidden_layers=1,
        decoder_num_hidden_layers=1,
        encoder_num_attention_heads=2,
        decoder_num_attention_heads=2,
        vocab_size=60,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    config.architectures = ["MoonshineForConditionalGeneration"]
    return config


def _whisper() -> transformers.PretrainedConfig:
    config = transformers.WhisperConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=64,
        vocab_size=60,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    config.architectures = ["WhisperForConditionalGeneration"]
    return config


def _extractor_length(extractor: transformers.SequenceFeatureExtractor) -> int:
    """Input steps the extractor makes from SECONDS of audio (its own code, not asrfit's)."""
    audio = np.random.default_rng(0).standard_normal(round(SECONDS * 16000)).astype(np.float32)
    out = extractor(audio, sampling_rate=16000, return_tensors="np")
    name = "input_values" if "input_values" in out else "input_features"
    values = out[name]
    if isinstance(extractor, transformers.WhisperFeatureExtractor):
        return values.shape[-1]  # (batch, mel, frames)
    return values.shape[1]


KINDS = [
    # (config, the extractor its published checkpoints ship, tolerance in input steps)
    (_moonshine, transformers.Wav2Vec2FeatureExtractor, 0),
    (_speech_to_text, transformers.Speech2TextFeatureExtractor, EDGE_FRAMES),
    (_wav2vec2_bert, transformers.SeamlessM4TFeatureExtractor, EDGE_FRAMES),
    (_whisper, transformers.WhisperFeatureExtractor, 0),
]
IDS = ["raw-samples", "fbank-frames", "stacked-frames", "whisper-window"]


@pytest.mark.parametrize(("make_config", "extractor", "tolerance"), KINDS, ids=IDS)
def test_simulate_sizes_the_input_as_the_feature_extractor_does(
    make_config, extractor, tolerance
) -> None:
    expected = _extractor_length(extractor())
    report = simulate(make_config(), batch_size=BATCH, seconds=SECONDS)
    assert report.batch.batch_size == BATCH
    assert abs(report.batch.input_length - expected) <= tolerance


@pytest.mark.parametrize(("make_config", "extractor", "tolerance"), KINDS[1:3], ids=IDS[1:3])
def test_simulate_sizes_an_adapters_input_as_the_feature_extractor_does(
    make_config, extractor, tolerance
) -> None:
    from asrfit.memory.models.generic import speech_adapter

    report = simulate(speech_adapter(make_config()), batch_size=BATCH, seconds=SECONDS)
    assert abs(report.batch.input_length - _extractor_length(extractor())) <= tolerance


@pytest.mark.parametrize(("make_config", "extractor", "tolerance"), KINDS[1:3], ids=IDS[1:3])
def test_memory_cli_sizes_the_input_as_the_feature_extractor_does(
    make_config, extractor, tolerance, tmp_path: Path
) -> None:
    make_config().save_pretrained(tmp_path)
    args = ["memory", "--model", str(tmp_path), "--batch", str(BATCH), "--seconds", "3.05"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    batch = json.loads(result.stdout)["batch"]
    assert abs(batch["input_length"] - _extractor_length(extractor())) <= tolerance


def test_a_saved_preprocessor_config_sets_the_rate(tmp_path: Path) -> None:
    """A local folder's preprocessor_config.json wins over the extractor class's defaults."""
    config = _speech_to_text()
    config.d_model = 48  # not the config of another test (profiles are cached by config)
    config.save_pretrained(tmp_path)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, hop_length=320)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(extractor.to_dict()))
    report = simulate(str(tmp_path), batch_size=BATCH, seconds=SECONDS)
    assert abs(report.batch.input_length - SECONDS * 16000 / 320) <= 1
