"""The configs, batch and setup records of the memory benchmark's held-out cases.

:class:`HeldOutCase` is one step (a config factory, a padded batch, a setup); the factories
below build tiny (or, for the real-scale cases, published) transformers configs. The case
sets themselves, with the date each was written, are in ``bench/cases.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import transformers

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape


def w2v(cls_name: str, hidden: int, heads: int, norm: str, stable: bool, **extra: Any) -> Any:
    config_cls = getattr(transformers, cls_name.replace("ForCTC", "Config"))
    config = config_cls(
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        conv_dim=(24,) * 7,
        num_conv_pos_embeddings=12,
        num_conv_pos_embedding_groups=heads,
        vocab_size=40,
        pad_token_id=0,
        layerdrop=0.0,
        feat_extract_norm=norm,
        do_stable_layer_norm=stable,
        **extra,
    )
    config.architectures = [cls_name]
    return config


def parakeet(kind: str, hidden: int, heads: int, layers: int = 1) -> Any:
    encoder = {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "subsampling_conv_channels": 16,
        "num_mel_bins": 64,
        "layerdrop": 0.0,
    }
    if kind == "ctc":
        config = transformers.ParakeetCTCConfig(
            vocab_size=48, pad_token_id=47, encoder_config=encoder
        )
        config.architectures = ["ParakeetForCTC"]
    else:
        config = transformers.ParakeetTDTConfig(
            vocab_size=48,
            blank_token_id=47,
            pad_token_id=47,
            decoder_hidden_size=48,
            encoder_config=encoder,
        )
        config.architectures = ["ParakeetForTDT"]
    return config


def generic(model_type: str, hidden: int, heads: int) -> Any:
    """A tiny config of a family asrfit has no adapter for (the generic adapter builds it)."""
    common = {
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "intermediate_size": 2 * hidden,
        "vocab_size": 44,
        "pad_token_id": 0,
        "layerdrop": 0.0,
    }
    conv = {"num_conv_pos_embeddings": 10, "num_conv_pos_embedding_groups": heads}
    if model_type == "data2vec-audio":
        return transformers.Data2VecAudioConfig(**common, **conv, conv_dim=(20,) * 7)
    if model_type == "unispeech-sat":
        return transformers.UniSpeechSatConfig(**common, **conv, conv_dim=(20,) * 7)
    if model_type == "wav2vec2-conformer":
        return transformers.Wav2Vec2ConformerConfig(
            **common, **conv, conv_dim=(20,) * 7, conv_depthwise_kernel_size=5
        )
    if model_type == "sew":
        return transformers.SEWConfig(**common, **conv, conv_dim=(20,) * 13, squeeze_factor=2)
    if model_type == "sew-d":
        return transformers.SEWDConfig(**common, **conv, conv_dim=(20,) * 13, squeeze_factor=2)
    if model_type == "wav2vec2-bert":
        return transformers.Wav2Vec2BertConfig(**common, output_hidden_size=hidden)
    return transformers.Speech2TextConfig(
        d_model=hidden,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * hidden,
        decoder_ffn_dim=2 * hidden,
        vocab_size=70,
        input_feat_per_channel=48,
        conv_channels=24,
        max_source_positions=1000,
        max_target_positions=64,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )


def whisper(d_model: int, heads: int, frames: int) -> Any:
    config = transformers.WhisperConfig(
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        num_mel_bins=64,
        max_source_positions=frames // 2,
        max_target_positions=48,
        vocab_size=96,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    config.architectures = ["WhisperForConditionalGeneration"]
    return config


def conformer(d_model: int, heads: int, layers: int, decoder: int = 0, **extra: Any) -> Any:
    from asrfit.models.conformer import conformer_config

    return conformer_config(
        d_model,
        encoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_layers=decoder,
        decoder_attention_heads=heads,
        num_mel_bins=64,
        vocab_size=36,
        **extra,
    )


def new_family(model_type: str, hidden: int, heads: int) -> Any:
    """Tiny configs of families no earlier case used (written 2026-11-24)."""
    if model_type == "lasr_ctc":
        encoder = {
            "hidden_size": hidden,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "intermediate_size": 2 * hidden,
            "conv_kernel_size": 9,
            "subsampling_conv_channels": 24,
            "num_mel_bins": 40,
            "layerdrop": 0.0,
        }
        return transformers.LasrCTCConfig(vocab_size=52, pad_token_id=0, encoder_config=encoder)
    if model_type == "unispeech":
        return w2v("UniSpeechForCTC", hidden, heads, "group", False)
    return transformers.MoonshineConfig(
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2,
        encoder_num_attention_heads=heads,
        decoder_num_attention_heads=heads,
        vocab_size=60,
        max_position_embeddings=128,
        pad_token_id=0,
    )


def generic_rotary(hidden: int, heads: int) -> Any:
    config = generic("wav2vec2-conformer", hidden, heads)
    config.position_embeddings_type = "rotary"
    return config


WAVLM = {"num_buckets": 16, "max_bucket_distance": 64}


def generic_relative(hidden: int, heads: int) -> Any:
    config = generic("wav2vec2-conformer", hidden, heads)
    config.position_embeddings_type = "relative"
    return config


def bigger(config: Any, layers: int, conv: int | None = None) -> Any:
    """``config`` with more layers (and wider feature-encoder convolutions)."""
    for name in ("num_hidden_layers", "encoder_layers"):
        if hasattr(config, name):
            setattr(config, name, layers)
    if conv is not None and hasattr(config, "conv_dim"):
        config.conv_dim = (conv,) * len(config.conv_dim)
    return config


def bundled(name: str, **overrides: Any) -> Any:
    from asrfit.profiles.model import load_config

    config = load_config(name)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def parakeet_ctc_layers(layers: int) -> Any:
    config = bundled("parakeet-ctc-0.6b")
    config.encoder_config.num_hidden_layers = layers
    return config


def s2t_small() -> Any:
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


def moonshine_tiny() -> Any:
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


@dataclass
class HeldOutCase:
    """One held-out step: a config factory, a batch and a setup."""

    name: str
    make_config: Any
    batch: BatchShape
    setup: Setup = field(default_factory=Setup)


def setup(precision: str = "fp32", ckpt: bool = False, optimizer: str = "adamw") -> Setup:
    return Setup(precision=precision, gradient_checkpointing=ckpt, optimizer=optimizer)
