"""Held-out cases written 2026-11-24 by 04:32 UTC, after both wav2vec2-bert fixes (issue 11).

The nine cases of ``_heldout_later.held_out_after_inplace_fix`` were the only ones written
after the final rules; these bring that split to more than 30. They were written before any
of them was run, and no simulator rule was changed after they were. Every case uses a width,
head count, length or setup that no earlier case of its family used: new widths per family,
8-bit AdamW (``bitsandbytes.optim.AdamW8bit``, measured with the real optimizer),
checkpointing of the first encoder layer only (``checkpoint_layers=1``), checkpointing in
families where no earlier case had it (SEW, SEW-D, Moonshine, data2vec-audio,
wav2vec2-conformer), and bf16 autocast on wav2vec2-conformer's relative position table.
"""

from __future__ import annotations

from typing import Any

from _heldout import HeldOutCase, _conformer, _generic, _parakeet, _s, _w2v, _whisper
from _heldout_later import _generic_rotary, _new_family

from asrfit.memory.adapters import BatchShape
from asrfit.memory.setup import Setup

_WAVLM = {"num_buckets": 16, "max_bucket_distance": 64}


def _generic_relative(hidden: int, heads: int) -> Any:
    config = _generic("wav2vec2-conformer", hidden, heads)
    config.position_embeddings_type = "relative"
    return config


def held_out_more() -> list[HeldOutCase]:
    """Thirty cases over every supported family (see the module docstring)."""
    w = _w2v
    return [
        # wav2vec2 / HuBERT / WavLM / UniSpeech(-SAT) / data2vec-audio
        HeldOutCase(
            "wav2vec2 h112 group pure_bf16 sgd 2x1.6s",
            lambda: w("Wav2Vec2ForCTC", 112, 8, "group", False),
            BatchShape(2, 25600, 11),
            _s("pure_bf16", False, "sgd"),
        ),
        HeldOutCase(
            "wav2vec2 h40 layer bf16+ckpt adamw8bit 4x1.2s",
            lambda: w("Wav2Vec2ForCTC", 40, 5, "layer", True),
            BatchShape(4, 19200, 8),
            _s("bf16", True, "adamw8bit"),
        ),
        HeldOutCase(
            "wav2vec2 h64 group fp32 ckpt-first-layer adamw 2x2.2s",
            lambda: w("Wav2Vec2ForCTC", 64, 4, "group", False),
            BatchShape(2, 35200, 15),
            Setup(precision="fp32", checkpoint_layers=1, optimizer="adamw"),
        ),
        HeldOutCase(
            "hubert h112 layer fp32 adafactor 2x2.9s",
            lambda: w("HubertForCTC", 112, 7, "layer", True),
            BatchShape(2, 46400, 19),
            _s("fp32", False, "adafactor"),
        ),
        HeldOutCase(
            "hubert h40 group pure_bf16 adamw 3x1.3s",
            lambda: w("HubertForCTC", 40, 4, "group", False),
            BatchShape(3, 20800, 9),
            _s("pure_bf16", False, "adamw"),
        ),
        HeldOutCase(
            "wavlm h56 group fp32+ckpt adafactor 2x2.7s",
            lambda: w("WavLMForCTC", 56, 7, "group", False, **_WAVLM),
            BatchShape(2, 43200, 17),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "wavlm h112 layer bf16 sgd 3x1.1s",
            lambda: w("WavLMForCTC", 112, 4, "layer", True, **_WAVLM),
            BatchShape(3, 17600, 7),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "unispeech h48 fp32 adamw8bit 2x2s",
            lambda: _new_family("unispeech", 48, 4),
            BatchShape(2, 32000, 13),
            _s("fp32", False, "adamw8bit"),
        ),
        HeldOutCase(
            "unispeech-sat h88 bf16 adamw 3x1.2s",
            lambda: _generic("unispeech-sat", 88, 8),
            BatchShape(3, 19200, 8),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "data2vec-audio h72 fp32+ckpt adafactor 2x2.3s",
            lambda: _generic("data2vec-audio", 72, 6),
            BatchShape(2, 36800, 15),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "data2vec-audio h96 pure_bf16 sgd 2x1.4s",
            lambda: _generic("data2vec-audio", 96, 3),
            BatchShape(2, 22400, 9),
            _s("pure_bf16", False, "sgd"),
        ),
        # SEW / SEW-D
        HeldOutCase(
            "sew h96 bf16+ckpt sgd 2x2.1s",
            lambda: _generic("sew", 96, 6),
            BatchShape(2, 33600, 14),
            _s("bf16", True, "sgd"),
        ),
        HeldOutCase(
            "sew h48 pure_bf16 adafactor 4x1s",
            lambda: _generic("sew", 48, 3),
            BatchShape(4, 16000, 6),
            _s("pure_bf16", False, "adafactor"),
        ),
        HeldOutCase(
            "sew-d h80 bf16+ckpt adamw 2x1.4s",
            lambda: _generic("sew-d", 80, 5),
            BatchShape(2, 22400, 9),
            _s("bf16", True, "adamw"),
        ),
        # wav2vec2-conformer: relative and rotary position embeddings; wav2vec2-bert
        HeldOutCase(
            "wav2vec2-conformer h64 relative bf16+ckpt adafactor 2x1.7s",
            lambda: _generic_relative(64, 4),
            BatchShape(2, 27200, 11),
            _s("bf16", True, "adafactor"),
        ),
        HeldOutCase(
            "wav2vec2-conformer h56 relative fp32 adamw 3x1.1s",
            lambda: _generic_relative(56, 4),
            BatchShape(3, 17600, 7),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "wav2vec2-conformer h96 rotary fp32+ckpt sgd 2x1.3s",
            lambda: _generic_rotary(96, 8),
            BatchShape(2, 20800, 9),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "wav2vec2-bert h40 fp32+ckpt adamw8bit 3x1.2s",
            lambda: _generic("wav2vec2-bert", 40, 5),
            BatchShape(3, 120, 8),
            _s("fp32", True, "adamw8bit"),
        ),
        # Whisper, Speech2Text, Moonshine
        HeldOutCase(
            "whisper d64 fp32+ckpt adafactor 3x1.8s",
            lambda: _whisper(64, 4, 180),
            BatchShape(3, 180, 13),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "whisper d112 bf16 sgd 2x1.2s",
            lambda: _whisper(112, 7, 120),
            BatchShape(2, 120, 11),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "speech_to_text d96 fp32 sgd 2x1.6s",
            lambda: _generic("speech_to_text", 96, 6),
            BatchShape(2, 160, 12),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "speech_to_text d48 pure_bf16 adafactor 4x2s",
            lambda: _generic("speech_to_text", 48, 3),
            BatchShape(4, 200, 17),
            _s("pure_bf16", False, "adafactor"),
        ),
        HeldOutCase(
            "moonshine h80 bf16+ckpt adafactor 2x1.4s",
            lambda: _new_family("moonshine", 80, 5),
            BatchShape(2, 22400, 10),
            _s("bf16", True, "adafactor"),
        ),
        # LASR, Parakeet CTC / TDT
        HeldOutCase(
            "lasr-ctc h56 fp32+ckpt adafactor 3x1.6s",
            lambda: _new_family("lasr_ctc", 56, 4),
            BatchShape(3, 160, 11),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "parakeet-ctc h96 pure_bf16 adafactor 2x2.1s",
            lambda: _parakeet("ctc", 96, 6),
            BatchShape(2, 210, 17),
            _s("pure_bf16", False, "adafactor"),
        ),
        HeldOutCase(
            "parakeet-tdt h56 fp32 sgd 3x2.3s",
            lambda: _parakeet("tdt", 56, 7),
            BatchShape(3, 230, 12),
            _s("fp32", False, "sgd"),
        ),
        # asrfit's Conformer, with and without its attention decoder
        HeldOutCase(
            "conformer d72 fp32 adafactor 5x1.8s",
            lambda: _conformer(72, 3, 2),
            BatchShape(5, 180, 14),
            _s("fp32", False, "adafactor"),
        ),
        HeldOutCase(
            "conformer d56 pure_bf16 sgd 3x4.2s",
            lambda: _conformer(56, 2, 2),
            BatchShape(3, 420, 33),
            _s("pure_bf16", False, "sgd"),
        ),
        HeldOutCase(
            "conformer+dec d88 bf16 adafactor 2x2.6s",
            lambda: _conformer(88, 4, 2, decoder=1),
            BatchShape(2, 260, 21),
            _s("bf16", False, "adafactor"),
        ),
        HeldOutCase(
            "conformer+dec d104 fp32+ckpt adamw8bit 3x1.7s",
            lambda: _conformer(104, 8, 2, decoder=2),
            BatchShape(3, 170, 14),
            _s("fp32", True, "adamw8bit"),
        ),
    ]


def _bigger(config: Any, layers: int, conv: int | None = None) -> Any:
    """``config`` with more layers (and wider feature-encoder convolutions)."""
    for name in ("num_hidden_layers", "encoder_layers"):
        if hasattr(config, name):
            setattr(config, name, layers)
    if conv is not None and hasattr(config, "conv_dim"):
        config.conv_dim = (conv,) * len(config.conv_dim)
    return config


def held_out_larger() -> list[HeldOutCase]:
    """Eight larger steps (tens to hundreds of MiB), written 2026-11-24 at 04:48 UTC.

    Written after the 30 cases above had run, before any of these ran; no rule changed
    after the 30 ran either. They check that the per-shape CPU kernel scratch holds at
    widths and lengths ten times those of the tiny cases.
    """
    return [
        HeldOutCase(
            "wav2vec2 h256 x4 layer fp32 adamw 4x4s",
            lambda: _bigger(_w2v("Wav2Vec2ForCTC", 256, 8, "layer", True), 4, 128),
            BatchShape(4, 64000, 50),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "hubert h192 x3 group bf16+ckpt sgd 3x6s",
            lambda: _bigger(_w2v("HubertForCTC", 192, 6, "group", False), 3, 96),
            BatchShape(3, 96000, 70),
            _s("bf16", True, "sgd"),
        ),
        HeldOutCase(
            "data2vec-audio h192 x3 pure_bf16 adafactor 3x5s",
            lambda: _bigger(_generic("data2vec-audio", 192, 4), 3, 64),
            BatchShape(3, 80000, 60),
            _s("pure_bf16", False, "adafactor"),
        ),
        HeldOutCase(
            "wav2vec2-bert h160 x3 bf16 adamw 2x5s",
            lambda: _bigger(_generic("wav2vec2-bert", 160, 8), 3),
            BatchShape(2, 500, 60),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "whisper d256 x2 fp32 adafactor 4x10s",
            lambda: _bigger(_whisper(256, 4, 1000), 2),
            BatchShape(4, 1000, 40),
            _s("fp32", False, "adafactor"),
        ),
        HeldOutCase(
            "speech_to_text d192 x3 fp32+ckpt sgd 3x6s",
            lambda: _bigger(_generic("speech_to_text", 192, 4), 3),
            BatchShape(3, 600, 45),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "parakeet-ctc h192 x2 fp32 sgd 4x6s",
            lambda: _parakeet("ctc", 192, 4, 2),
            BatchShape(4, 600, 60),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "conformer d192 x4 bf16 adamw 4x8s",
            lambda: _conformer(192, 4, 4),
            BatchShape(4, 800, 64),
            _s("bf16", False, "adamw"),
        ),
    ]
