"""Depth scaling (asrfit.memory.fit.depth) against the full trace, on every supported family.

The reference is :func:`asrfit.memory.simulate.simulate_step` on the whole model; the scaled
step traces a few layers per repeated stack and extrapolates. Peak, every category, each
phase's peak, optimizer state, FLOPs and the segment bytes must match within 0.1 %;
parameters/gradients/optimizer state also match a closed-form count of the real model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from asrfit.memory.fit.depth import layer_groups, scaled_step  # noqa: E402
from asrfit.memory.models.generic import speech_adapter  # noqa: E402
from asrfit.memory.report import resolve_adapter  # noqa: E402
from asrfit.memory.setup import Setup  # noqa: E402
from asrfit.memory.simulate import simulate_step  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.trace.eventlog import round_block  # noqa: E402
from asrfit.models.conformer import conformer_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

REL = 1e-3  # 0.1 %
LAYERS = 6

_W2V = dict(
    hidden_size=32,
    num_hidden_layers=LAYERS,
    num_attention_heads=2,
    intermediate_size=48,
    conv_dim=(8, 8),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    vocab_size=12,
    layerdrop=0.0,
)
_PARAKEET = dict(
    hidden_size=16,
    num_hidden_layers=LAYERS,
    num_attention_heads=2,
    intermediate_size=24,
    subsampling_conv_channels=4,
    num_mel_bins=16,
)


def _whisper():
    return transformers.WhisperConfig(
        vocab_size=100,
        num_mel_bins=8,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS - 1,  # stacks of different depths: one variable each
        d_model=16,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=24,
        decoder_ffn_dim=24,
        max_source_positions=30,
        max_target_positions=20,
        pad_token_id=99,
        bos_token_id=98,
        eos_token_id=98,
        decoder_start_token_id=97,
    )


CASES = {
    "wav2vec2": (lambda: transformers.Wav2Vec2Config(**_W2V), BatchShape(2, 4000, 8)),
    "wav2vec2_stable_ln": (
        lambda: transformers.Wav2Vec2Config(
            **_W2V, do_stable_layer_norm=True, feat_extract_norm="layer"
        ),
        BatchShape(2, 4000, 8),
    ),
    "hubert": (lambda: transformers.HubertConfig(**_W2V), BatchShape(2, 4000, 8)),
    "wavlm": (
        lambda: transformers.WavLMConfig(**_W2V, num_buckets=8, max_bucket_distance=16),
        BatchShape(2, 4000, 8),
    ),
    "whisper": (_whisper, BatchShape(2, 60, 6)),
    "parakeet_ctc": (
        lambda: transformers.ParakeetCTCConfig(
            vocab_size=11, pad_token_id=10, encoder_config=dict(_PARAKEET)
        ),
        BatchShape(2, 64, 4),
    ),
    "parakeet_tdt": (
        lambda: transformers.ParakeetTDTConfig(
            vocab_size=11,
            blank_token_id=10,
            pad_token_id=2,
            decoder_hidden_size=8,
            encoder_config=dict(_PARAKEET),
        ),
        BatchShape(4, 128, 12),  # the loss's joint holds the peak at every traced depth
    ),
    "conformer_ctc": (
        lambda: conformer_config(48, encoder_layers=LAYERS, encoder_attention_heads=2),
        BatchShape(2, 3200, 6),
    ),
    "conformer_decoder": (
        lambda: conformer_config(
            48,
            encoder_layers=LAYERS,
            encoder_attention_heads=2,
            decoder_layers=2,
            decoder_attention_heads=2,
            vocab_size=20,
        ),
        BatchShape(2, 3200, 6),
    ),
}
SETUPS = {
    "plain": Setup(),
    "ckpt_all": Setup(gradient_checkpointing=True),
    "ckpt_first_2": Setup(checkpoint_layers=2),
}


def _adapter(config):
    if getattr(config, "model_type", "") == "asrfit_conformer":
        return resolve_adapter(config)[0]
    return speech_adapter(config)


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1)


@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize(
    "family",
    [  # the TDT loss's trace takes 8-10 s for the full and the scaled step together
        pytest.param(f, marks=pytest.mark.slow) if f == "parakeet_tdt" else f for f in CASES
    ],
)
def test_scaled_step_matches_the_full_trace(family: str, setup_name: str) -> None:
    make, batch = CASES[family]
    adapter, setup = _adapter(make()), SETUPS[setup_name]
    full = simulate_step(adapter, batch, setup, steps=1)
    scaled = scaled_step(adapter, batch, setup, steps=1, min_saving=0)
    assert any(a.startswith("depth: scaled") for a in scaled.assumptions), scaled.assumptions
    # each reduced trace built at its depth (the config's layer count lowered), not pruned
    assert "depth: reduced traces built at reduced depth" in scaled.assumptions
    assert _close(scaled.peak_bytes, full.peak_bytes), (scaled.peak_bytes, full.peak_bytes)
    assert scaled.peak_phase == full.peak_phase
    for category, value in full.breakdown_bytes.items():
        assert _close(scaled.breakdown_bytes[category], value), category
    for phase, value in full.phase_peaks_bytes.items():
        assert _close(scaled.phase_peaks_bytes[phase], value), phase
    assert _close(scaled.peak_segment_bytes, full.peak_segment_bytes)
    assert _close(scaled.peak_expandable_bytes, full.peak_expandable_bytes)
    assert _close(scaled.optimizer_state_bytes, full.optimizer_state_bytes)
    assert _close(scaled.flops, full.flops)
    # closed form: fp32 parameters, their gradients (trainable), AdamW's two moments
    if family == "whisper":
        return  # tied embeddings: the trace's parameter bytes differ from a per-tensor count
    model = adapter.build()
    params = sum(round_block(p.numel() * 4) for p in model.parameters())
    trainable = sum(round_block(p.numel() * 4) for p in model.parameters() if p.requires_grad)
    assert scaled.breakdown_bytes["parameters"] == params
    assert scaled.optimizer_state_bytes == 2 * trainable
    if scaled.peak_phase == "optimizer":
        assert scaled.breakdown_bytes["gradients"] == trainable


def test_every_layer_checkpointed_by_count_scales_like_the_full_trace() -> None:
    """``checkpoint_layers`` = every encoder layer (the planner's partial choice can pick
    k = L): the reduced traces keep all layers checkpointed (a build shorter than k could
    not be checkpointed k deep) and match the full trace."""
    make, batch = CASES["wav2vec2"]
    adapter, setup = _adapter(make()), Setup(checkpoint_layers=LAYERS)
    full = simulate_step(adapter, batch, setup, steps=1)
    scaled = scaled_step(adapter, batch, setup, steps=1, min_saving=0)
    assert any(a.startswith("depth: scaled") for a in scaled.assumptions), scaled.assumptions
    assert _close(scaled.peak_bytes, full.peak_bytes), (scaled.peak_bytes, full.peak_bytes)
    for phase, value in full.phase_peaks_bytes.items():
        assert _close(scaled.phase_peaks_bytes[phase], value), phase
    assert _close(scaled.flops, full.flops)


def test_groups_keep_layers_that_differ() -> None:
    """WavLM's first layer carries the relative position bias: it is kept, not scaled."""
    adapter = speech_adapter(CASES["wavlm"][0]())
    groups = dict(layer_groups(adapter.build()))
    assert groups == {"wavlm.encoder.layers:plain": list(range(1, LAYERS))}


def test_a_layer_count_that_also_sizes_something_else_is_not_lowered() -> None:
    """A model whose layer count also sets another parameter's shape: a build at reduced depth
    would not be the full model's prefix, so each reduced trace prunes the full build."""
    config = transformers.Wav2Vec2Config(**_W2V)
    base = speech_adapter(config)

    def build():
        model = base.build()
        model.per_layer_scale = torch.nn.Parameter(torch.zeros(config.num_hidden_layers))
        return model

    adapter = dataclasses.replace(base, build=build)
    batch = CASES["wav2vec2"][1]
    full = simulate_step(adapter, batch, steps=1)
    scaled = scaled_step(adapter, batch, steps=1, min_saving=0)
    assert any("built whole" in a for a in scaled.assumptions), scaled.assumptions
    assert scaled.peak_bytes == full.peak_bytes
    assert scaled.breakdown_bytes == full.breakdown_bytes


def test_a_reduced_build_that_differs_from_the_full_model_is_not_traced() -> None:
    """The layer count is found (a build one layer short is the full model's prefix), but a
    shallower build differs: that trace, and the ones after it, prune the full build."""
    config = transformers.Wav2Vec2Config(**_W2V)
    base = speech_adapter(config)

    def build():
        model = base.build()
        if config.num_hidden_layers < LAYERS - 1:
            model.shallow_only = torch.nn.Parameter(torch.zeros(3))
        return model

    adapter = dataclasses.replace(base, build=build)
    batch = CASES["wav2vec2"][1]
    full = simulate_step(adapter, batch, steps=1)
    scaled = scaled_step(adapter, batch, steps=1, min_saving=0)
    assert any("built whole (a reduced build differed" in a for a in scaled.assumptions)
    assert scaled.peak_bytes == full.peak_bytes
    assert scaled.breakdown_bytes == full.breakdown_bytes


def test_partial_checkpointing_scales_where_the_backward_peak_changes_place() -> None:
    """With the first 2 of 12 layers checkpointed, the backward peak of the stack is either
    while the plain layers run backward or while the checkpointed ones recompute, and which
    depends on the plain-layer count. Without a region at the passage between the two the
    check trace is off the line (full trace; this shape was found that way)."""
    from asrfit.memory.setup import OptimizerKind, Precision

    config = transformers.Wav2Vec2Config(
        **{**_W2V, "num_hidden_layers": 12, "intermediate_size": 128},
        do_stable_layer_norm=True,
        feat_extract_norm="layer",
    )
    adapter = speech_adapter(config)
    batch = BatchShape(2, 64000, 8)
    setup = Setup(precision=Precision.BF16, optimizer=OptimizerKind.SGD, checkpoint_layers=2)
    full = simulate_step(adapter, batch, setup, steps=1)
    scaled = scaled_step(adapter, batch, setup, steps=1, min_saving=0)
    assert any(a.startswith("depth: scaled") for a in scaled.assumptions), scaled.assumptions
    assert scaled.peak_bytes == full.peak_bytes
    assert scaled.phase_peaks_bytes == full.phase_peaks_bytes
    assert scaled.breakdown_bytes == full.breakdown_bytes


def test_a_full_trace_is_used_once_it_makes_fewer_kernel_calls() -> None:
    """6 layers traced as 2, 3 and 4 repeat the feature encoder, head and loss three times:
    more kernel calls than one full trace. The next step of the same adapter and setup is
    traced whole (and is the full trace)."""
    make, batch = CASES["wav2vec2"]
    adapter = _adapter(make())
    first = scaled_step(adapter, batch, steps=1, min_saving=0)
    assert any(a.startswith("depth: scaled") for a in first.assumptions)
    second = scaled_step(adapter, BatchShape(3, 4000, 8), steps=1, min_saving=0)
    note = next(a for a in second.assumptions if a.startswith("depth:"))
    assert note.startswith("depth: full trace (the reduced traces made"), second.assumptions
    full = simulate_step(adapter, BatchShape(3, 4000, 8), steps=1)
    assert second.peak_bytes == full.peak_bytes
    assert second.breakdown_bytes == full.breakdown_bytes
