"""Partial activation checkpointing: the first k of L encoder layers.

The reference for memory is a real CPU training step counted at the CPU allocator
(``bench/_truth.py``), never the simulator's tracker; the reference for correctness is the
same step without checkpointing (gradients must be equal).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from asrfit.errors import ConfigError
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.models.checkpointing import (
    checkpoint_first_layers,
    encoder_layer_count,
    encoder_layers,
)
from asrfit.models.conformer import ConformerForCTC, conformer_config
from asrfit.train.config import TrainingConfig
from bench import _truth

pytestmark = pytest.mark.usefixtures("one_thread")


def _conformer(layers: int = 4, **extra):
    return conformer_config(96, encoder_layers=layers, encoder_attention_heads=4, **extra)


def _wav2vec2(layers: int = 4):
    config = transformers.Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=32,
        pad_token_id=0,
        layerdrop=0.0,  # a real run skips layers at random; the simulator never does
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
    )
    config.architectures = ["Wav2Vec2ForCTC"]
    return config


def _whisper():
    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=3,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
        max_source_positions=100,
        max_target_positions=64,
        vocab_size=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    config.architectures = ["WhisperForConditionalGeneration"]
    return config


# -- which layers ------------------------------------------------------------------------


def test_the_first_k_encoder_layers_are_flagged_and_no_decoder_layer() -> None:
    model = transformers.WhisperForConditionalGeneration(_whisper())
    name, layers = encoder_layers(model)
    assert name == "model.encoder.layers" and len(layers) == 3
    assert checkpoint_first_layers(model, 2) == [
        "model.encoder.layers.0",
        "model.encoder.layers.1",
    ]
    assert [layer.gradient_checkpointing for layer in layers] == [True, True, False]
    assert not any(layer.gradient_checkpointing for layer in model.model.decoder.layers)
    checkpoint_first_layers(model, 0)
    assert not any(layer.gradient_checkpointing for layer in layers)


def test_conformer_encoder_stack_is_found_and_k_beyond_it_is_refused() -> None:
    model = ConformerForCTC(_conformer(layers=3))
    assert encoder_layer_count(model) == 3
    with pytest.raises(ConfigError, match=r"checkpoint_layers=4: .* has 3 encoder layers"):
        checkpoint_first_layers(model, 4)


def test_setup_field_is_validated_described_and_round_trips() -> None:
    setup = Setup(checkpoint_layers=3)
    assert setup.describe().startswith("fp32+ckpt3 ")
    assert Setup.from_dict(setup.to_dict()) == setup
    old = Setup().to_dict()
    old.pop("checkpoint_layers")  # a plan written before the field existed
    assert Setup.from_dict(old).checkpoint_layers == 0
    with pytest.raises(ConfigError, match="checkpoint_layers=2 with gradient_checkpointing"):
        Setup(checkpoint_layers=2, gradient_checkpointing=True)
    with pytest.raises(ConfigError, match="checkpoint_layers=-1"):
        Setup(checkpoint_layers=-1)


def test_partial_checkpointing_leaves_the_gradients_unchanged() -> None:
    """Recomputing the first layers in backward gives the same gradients as storing them."""
    grads = []
    for k in (0, 2):
        torch.manual_seed(0)
        model = ConformerForCTC(_conformer(layers=3, dropout=0.0)).train()
        checkpoint_first_layers(model, k)
        g = torch.Generator().manual_seed(1)
        feats = torch.randn(2, 120, 80, generator=g)
        labels = torch.randint(1, 32, (2, 8), generator=g)
        out = model(input_features=feats, labels=labels)
        out.loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_trainer_config_from_a_plan_setup_carries_k() -> None:
    config = TrainingConfig(checkpoint_layers=2)
    assert ("Gradient checkpointing", "first 2 encoder layers") in config.summary_rows()
    with pytest.raises(ConfigError, match="checkpoint_layers=2 with gradient_checkpointing"):
        TrainingConfig(checkpoint_layers=2, gradient_checkpointing=True)
    # TrainingArguments cannot checkpoint some layers: every layer (never none) is asked for
    kwargs = config.to_training_arguments()
    assert kwargs.get("activation_checkpointing", kwargs.get("gradient_checkpointing")) is True


def test_trainer_applies_the_first_k_layers() -> None:
    from asrfit.train.trainer import MemoryEfficientTrainer

    model = ConformerForCTC(_conformer(layers=3))

    def loss_fn(m, batch):
        out = m(input_features=batch["input_features"], labels=batch["labels"])
        return out.loss, 1

    MemoryEfficientTrainer(
        model, TrainingConfig(checkpoint_layers=2), loss_fn=loss_fn, cpu=True, preflight=False
    )
    flags = [
        bool(getattr(layer, "gradient_checkpointing", False)) for layer in model.encoder.layers
    ]
    assert flags == [True, True, False]


# -- memory: simulated vs a real CPU step ----------------------------------------------------

# (config factory, batch, layers, tolerance). The conformer's tolerance is the README's figure
# for a Conformer step (within 0.5 % of the allocator's peak, tests/test_memory_truth.py);
# wav2vec2's the published bound for a simulated CPU step against the allocator's peak (README
# and docs/benchmarks.md, "Memory accuracy on held-out steps (CPU)", 47 cases, max 0.45 %).
CASES = {
    "conformer": (_conformer, BatchShape(2, 1200, 40), 4, 0.005),
    "wav2vec2": (_wav2vec2, BatchShape(2, 96000, 40), 4, 0.0045),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_peak_matches_a_real_step_and_falls_with_k(name: str) -> None:
    make_config, batch, layers, tolerance = CASES[name]
    measured = {}
    for k in (0, layers // 2, layers):
        setup = Setup(precision="fp32", optimizer="sgd", checkpoint_layers=k)
        real = _truth.measure_adapter_step(hf_adapter(make_config()), batch, setup).peak_bytes
        sim = simulate_step(hf_adapter(make_config()), batch, setup, target="cpu", steps=2)
        assert sim.peak_raw_bytes == pytest.approx(real, rel=tolerance), (
            f"{name} k={k}: simulated {sim.peak_raw_bytes} B, measured {real} B"
        )
        if k:  # the RNG states checkpointing keeps are counted: the real peak is within
            assert real <= sim.peak_raw_bytes, (name, k, real, sim.peak_raw_bytes)
        measured[k] = real
    peaks = [measured[k] for k in sorted(measured)]
    assert peaks == sorted(peaks, reverse=True), (
        f"{name}: peaks not non-increasing in k: {measured}"
    )
    # checkpointing half the layers saves real memory (the test fails if nothing changed)
    assert measured[layers // 2] < 0.97 * measured[0], measured
