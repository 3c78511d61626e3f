"""Families without an asrfit adapter, simulated through transformers' auto tables.

Each is compared with a plain real CPU step counted at the allocator (bench/_truth.py).
"""

from __future__ import annotations

import pytest
import transformers

from asrfit.errors import UnsupportedModelError
from asrfit.memory.models.generic import speech_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from bench import _truth

pytestmark = pytest.mark.usefixtures("one_thread")


def _data2vec() -> transformers.Data2VecAudioConfig:
    return transformers.Data2VecAudioConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16,) * 7,
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        vocab_size=30,
        pad_token_id=0,
        layerdrop=0.0,
    )


def _speech_to_text() -> transformers.Speech2TextConfig:
    return transformers.Speech2TextConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=50,
        input_feat_per_channel=40,
        conv_channels=16,
        max_source_positions=500,
        max_target_positions=32,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )


@pytest.mark.parametrize(
    ("make_config", "batch"),
    [(_data2vec, BatchShape(2, 12000, 6)), (_speech_to_text, BatchShape(2, 120, 8))],
    ids=["data2vec-audio-ctc", "speech_to_text-seq2seq"],
)
def test_generic_family_matches_the_plain_step(make_config, batch) -> None:
    setup = Setup(precision="fp32", optimizer="adamw")
    truth = _truth.measure_adapter_step(speech_adapter(make_config()), batch, setup).peak_bytes
    sim = simulate_step(speech_adapter(make_config()), batch, setup, target="cpu")
    # the published bound for a simulated CPU step against the allocator's peak: README and
    # docs/benchmarks.md, "Memory accuracy on held-out steps (CPU)", 47 cases, max 0.45 %
    assert sim.peak_raw_bytes == pytest.approx(truth, rel=0.0045)


def test_refusal_gives_the_reason_and_what_to_do() -> None:
    with pytest.raises(UnsupportedModelError, match="simulate_model") as info:
        speech_adapter(transformers.BertConfig())
    assert "'bert'" in str(info.value) and "AutoModelForCTC" in str(info.value)


def test_feature_size_from_a_nested_encoder_config() -> None:
    """LASR keeps ``num_mel_bins`` in its ``encoder_config``: the batch takes it from there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from asrfit.memory.trace.tracker import StorageTracker

    config = transformers.LasrCTCConfig(
        vocab_size=30,
        pad_token_id=0,
        encoder_config={"hidden_size": 32, "num_hidden_layers": 1, "num_mel_bins": 24},
    )
    adapter = speech_adapter(config)
    with FakeTensorMode():
        inputs = adapter.make_inputs(BatchShape(2, 50, 5), StorageTracker())
    assert tuple(inputs["input_features"].shape) == (2, 50, 24)
