"""Real-scale steps: published layouts at full vocabulary and width (0.5-3 GB each).

The small held-out steps use vocabularies of 36-96 tokens and widths of 40-256, so a buffer
the size of a vocabulary-by-width matrix is a rounding error there. These steps use the
published widths and vocabularies (Whisper's 51,865 tokens, Moonshine's 32,768,
Speech2Text's 10,000) so such buffers set the peak as they do in real training. The cases
of :func:`held_out_scale` were written, with their batches and setups, before the simulator
rule for shared parameters changed, and none was run before that change.
:func:`diagnosis_scale` is the step the shortfall was reported on, reported apart.

Depth is the published depth except Parakeet-CTC 0.6B (6 of its 24 layers, full width and
vocabulary: the whole model's fp32 weights and gradients alone are 4.8 GB).
"""

from __future__ import annotations

from typing import Any

import transformers
from _heldout import HeldOutCase, _s

from asrfit.memory.adapters import BatchShape
from asrfit.memory.setup import Setup


def _bundled(name: str, **overrides: Any) -> Any:
    from asrfit.profiles.model import load_config

    config = load_config(name)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _parakeet_ctc_layers(layers: int) -> Any:
    config = _bundled("parakeet-ctc-0.6b")
    config.encoder_config.num_hidden_layers = layers
    return config


def _s2t_small() -> Any:
    """facebook/s2t-small-librispeech-asr's layout (10,000 tokens, tied output projection)."""
    config = transformers.Speech2TextConfig(
        vocab_size=10000,
        d_model=256,
        encoder_layers=12,
        decoder_layers=6,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        input_feat_per_channel=80,
        input_channels=1,
        conv_channels=1024,
        conv_kernel_sizes=[5, 5],
        max_source_positions=6000,
        max_target_positions=1024,
        scale_embedding=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    config.architectures = ["Speech2TextForConditionalGeneration"]
    return config


def _moonshine_tiny() -> Any:
    """UsefulSensors/moonshine-tiny's layout (32,768 tokens, tied output projection)."""
    config = transformers.MoonshineConfig(
        vocab_size=32768,
        hidden_size=288,
        intermediate_size=1152,
        encoder_num_hidden_layers=6,
        decoder_num_hidden_layers=6,
        encoder_num_attention_heads=8,
        decoder_num_attention_heads=8,
        max_position_embeddings=194,
        partial_rotary_factor=0.9,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    config.architectures = ["MoonshineForConditionalGeneration"]
    return config


def held_out_scale() -> list[HeldOutCase]:
    """Ten real-scale steps (see the module docstring)."""
    return [
        HeldOutCase(
            "whisper-base bf16 adamw 2x30s U60",
            lambda: _bundled("whisper-base"),
            BatchShape(2, 3000, 60),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "whisper-base fp32+ckpt adafactor 3x30s U120",
            lambda: _bundled("whisper-base"),
            BatchShape(3, 3000, 120),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "whisper-small fp32+ckpt sgd 1x30s U100",
            lambda: _bundled("whisper-small"),
            BatchShape(1, 3000, 100),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "whisper-small bf16+ckpt adafactor 1x30s U64",
            lambda: _bundled("whisper-small"),
            BatchShape(1, 3000, 64),
            _s("bf16", True, "adafactor"),
        ),
        HeldOutCase(
            "s2t-small fp32 adamw 4x15s U60",
            _s2t_small,
            BatchShape(4, 1500, 60),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "moonshine-tiny bf16 adamw 6x20s U80",
            _moonshine_tiny,
            BatchShape(6, 320000, 80),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "wav2vec2-base fp32 adamw 2x12s U180",
            lambda: _bundled("wav2vec2-base"),
            BatchShape(2, 192000, 180),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "wav2vec2-base fp32+ckpt sgd 4x15s U220",
            lambda: _bundled("wav2vec2-base"),
            BatchShape(4, 240000, 220),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "parakeet-ctc-0.6b 6 of 24 layers fp32 sgd 2x20s U80",
            lambda: _parakeet_ctc_layers(6),
            BatchShape(2, 2000, 80),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "conformer-ctc-large fp32 adamw 8x16s U240",
            lambda: _bundled("conformer-ctc-large"),
            BatchShape(8, 1600, 240),
            Setup(precision="fp32", optimizer="adamw"),
        ),
    ]


def diagnosis_scale() -> list[HeldOutCase]:
    """The step the shortfall was reported on (used to find the rule)."""
    return [
        HeldOutCase(
            "whisper-base fp32 adamw 2x30s U80",
            lambda: _bundled("whisper-base"),
            BatchShape(2, 3000, 80),
            _s("fp32", False, "adamw"),
        ),
    ]
