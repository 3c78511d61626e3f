"""Every held-out case set of the CPU benchmarks, each with the date it was written.

A :class:`CaseSet` is data: its cases, the date (and, where it was recorded, the UTC time)
it was written, what it was held out from, and its role in the published figures:

- ``"held out"``: written before any of its cases ran, after the rules it checks were final,
  and no rule changed after it; its figures are the benchmark's held-out figures.
- ``"diagnosis"``: written as held out, then used to find a fix (or the steps the rules were
  written on); reported apart, never as held out.
- ``"fitted"``: the cases a factor was fitted on (planning: the cases its speed was tuned on).

Memory sets (``benchmark="memory"``) hold :class:`bench._configs.HeldOutCase` steps, compared
with a plain real CPU step counted at the allocator (``python -m bench memory_accuracy
--heldout``); step-time sets (``benchmark="step-time"``) hold :class:`bench._grid.Case` steps,
timed by ``python -m bench step_time_accuracy``; planning sets (``benchmark="plan-speed"``)
hold :class:`PlanCase` plans, timed by ``python -m bench plan_speed``. A set's cases never
change once it is written: a new check is a new set with its own date. Names carry no
provenance; the fields do.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape
from asrfit.models.conformer import conformer_config
from bench import _grid
from bench._configs import (
    WAVLM,
    HeldOutCase,
    bigger,
    bundled,
    conformer,
    generic,
    generic_relative,
    generic_rotary,
    moonshine_tiny,
    new_family,
    parakeet,
    parakeet_ctc_layers,
    s2t_small,
    setup,
    w2v,
    whisper,
)
from bench._grid import Case


@dataclass(frozen=True)
class CaseSet:
    """One set of cases, written at one time, with its provenance as fields."""

    name: str
    benchmark: str  # "memory", "step-time" or "plan-speed"
    written: datetime.date
    role: str  # "held out", "diagnosis" or "fitted"
    held_out_from: str  # what the set was kept out of (the rules, fits and cases before it)
    cases: tuple
    written_utc: str = ""  # the time of day, where it was recorded (e.g. "04:32")


def family_group(
    arch: str, optimizer: str, seconds: float, labels: int, bf16: bool = True
) -> list[Case]:
    """One family's base step (fp32, batch 2) with checkpointing, batch 6 and bf16 beside it."""
    base = Case(arch, "fp32", False, optimizer, 2, seconds, labels)
    cases = [
        base,
        Case(arch, "fp32", True, optimizer, 2, seconds, labels),
        Case(arch, "fp32", False, optimizer, 6, seconds, labels),
    ]
    if bf16:
        cases.append(Case(arch, "bf16", False, optimizer, 2, seconds, labels))
    return cases


MEMORY_RULES = [
    HeldOutCase(
        "conformer d144 fp32 sgd 4x4s",
        lambda: conformer_config(144, encoder_layers=3, encoder_attention_heads=4),
        BatchShape(4, 400, 30),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "conformer+dec d128 bf16+ckpt adamw 3x3s",
        lambda: conformer_config(128, encoder_layers=2, decoder_layers=2),
        BatchShape(3, 300, 20),
        setup("bf16", True, "adamw"),
    ),
    HeldOutCase(
        "wavlm grid-config fp32+ckpt sgd 4x3s",
        lambda: _grid._config("wavlm"),
        BatchShape(4, 48000, 20),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "hubert grid-config fp32 sgd 4x3s",
        lambda: _grid._config("hubert"),
        BatchShape(4, 48000, 20),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "parakeet-tdt grid-config fp32+ckpt sgd 4x4s",
        lambda: _grid._config("parakeet-tdt"),
        BatchShape(4, 400, 30),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "parakeet-tdt grid-config fp32 sgd 4x4s",
        lambda: _grid._config("parakeet-tdt"),
        BatchShape(4, 400, 30),
        setup("fp32", False, "sgd"),
    ),
]


MEMORY_1 = [
    # wav2vec2 family: widths 48/80/96, 2-6 heads, group and layer extractors, 1.3-3.4 s
    HeldOutCase(
        "wav2vec2 h48 group fp32 sgd 2x1.3s",
        lambda: w2v("Wav2Vec2ForCTC", 48, 2, "group", False),
        BatchShape(2, 20800, 9),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2 h80 layer bf16+ckpt adafactor 3x1.7s",
        lambda: w2v("Wav2Vec2ForCTC", 80, 5, "layer", True),
        BatchShape(3, 27200, 11),
        setup("bf16", True, "adafactor"),
    ),
    HeldOutCase(
        "wav2vec2 h96 layer pure_bf16 adamw 2x2.3s",
        lambda: w2v("Wav2Vec2ForCTC", 96, 6, "layer", True),
        BatchShape(2, 36800, 14),
        setup("pure_bf16", False, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2 h48 layer fp32+ckpt adamw 5x1.1s",
        lambda: w2v("Wav2Vec2ForCTC", 48, 3, "layer", True),
        BatchShape(5, 17600, 7),
        setup("fp32", True, "adamw"),
    ),
    HeldOutCase(
        "hubert h80 group fp32 adamw 3x2.1s",
        lambda: w2v("HubertForCTC", 80, 4, "group", False),
        BatchShape(3, 33600, 13),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "hubert h48 layer bf16 sgd 4x1.4s",
        lambda: w2v("HubertForCTC", 48, 2, "layer", True),
        BatchShape(4, 22400, 10),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "hubert h96 group fp32+ckpt sgd 2x3.4s",
        lambda: w2v("HubertForCTC", 96, 3, "group", False),
        BatchShape(2, 54400, 22),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "hubert h64 group bf16+ckpt adafactor 3x1.9s",
        lambda: w2v("HubertForCTC", 64, 4, "group", False),
        BatchShape(3, 30400, 12),
        setup("bf16", True, "adafactor"),
    ),
    HeldOutCase(
        "wavlm h80 layer fp32+ckpt adamw 3x1.6s",
        lambda: w2v("WavLMForCTC", 80, 5, "layer", True, num_buckets=16, max_bucket_distance=64),
        BatchShape(3, 25600, 10),
        setup("fp32", True, "adamw"),
    ),
    HeldOutCase(
        "wavlm h48 group bf16 adamw 2x2.6s",
        lambda: w2v("WavLMForCTC", 48, 3, "group", False, num_buckets=16, max_bucket_distance=64),
        BatchShape(2, 41600, 16),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "wavlm h96 layer fp32 sgd 2x1.2s",
        lambda: w2v("WavLMForCTC", 96, 6, "layer", True, num_buckets=16, max_bucket_distance=64),
        BatchShape(2, 19200, 8),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "wavlm h64 layer pure_bf16 sgd 3x2.2s",
        lambda: w2v("WavLMForCTC", 64, 2, "layer", True, num_buckets=16, max_bucket_distance=64),
        BatchShape(3, 35200, 14),
        setup("pure_bf16", False, "sgd"),
    ),
    # Whisper: widths 48/96, heads 3/6, 1.5-3 s windows
    HeldOutCase(
        "whisper d48 fp32 adafactor 3x1.5s",
        lambda: whisper(48, 3, 150),
        BatchShape(3, 150, 17),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "whisper d96 bf16+ckpt sgd 2x3s",
        lambda: whisper(96, 6, 300),
        BatchShape(2, 300, 30),
        setup("bf16", True, "sgd"),
    ),
    HeldOutCase(
        "whisper d96 fp32+ckpt adamw 4x2s",
        lambda: whisper(96, 3, 200),
        BatchShape(4, 200, 21),
        setup("fp32", True, "adamw"),
    ),
    HeldOutCase(
        "whisper d48 bf16 adamw 5x1.5s",
        lambda: whisper(48, 6, 150),
        BatchShape(5, 150, 9),
        setup("bf16", False, "adamw"),
    ),
    # Parakeet CTC / TDT: widths 48/80, 1-2 layers
    HeldOutCase(
        "parakeet-ctc h80 fp32 sgd 3x1.8s",
        lambda: parakeet("ctc", 80, 5),
        BatchShape(3, 180, 16),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "parakeet-ctc h48 bf16+ckpt adamw 4x2.4s",
        lambda: parakeet("ctc", 48, 3, 2),
        BatchShape(4, 240, 20),
        setup("bf16", True, "adamw"),
    ),
    HeldOutCase(
        "parakeet-ctc h48 fp32+ckpt adafactor 2x3.1s",
        lambda: parakeet("ctc", 48, 2),
        BatchShape(2, 310, 25),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "parakeet-ctc h80 bf16 sgd 5x1.3s",
        lambda: parakeet("ctc", 80, 4, 2),
        BatchShape(5, 130, 9),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "parakeet-tdt h48 fp32 adamw 2x1.5s",
        lambda: parakeet("tdt", 48, 3),
        BatchShape(2, 150, 8),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "parakeet-tdt h80 bf16 sgd 2x1.2s",
        lambda: parakeet("tdt", 80, 5),
        BatchShape(2, 120, 7),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "parakeet-tdt h48 fp32+ckpt sgd 3x1.1s",
        lambda: parakeet("tdt", 48, 2),
        BatchShape(3, 110, 6),
        setup("fp32", True, "sgd"),
    ),
    # asrfit's Conformer, with and without its attention decoder
    HeldOutCase(
        "conformer d96 fp32 adamw 3x3s",
        lambda: conformer(96, 4, 2),
        BatchShape(3, 300, 25),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "conformer d64 bf16 sgd 6x2s",
        lambda: conformer(64, 2, 2),
        BatchShape(6, 200, 15),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "conformer d112 fp32+ckpt sgd 2x5s",
        lambda: conformer(112, 4, 2),
        BatchShape(2, 500, 40),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "conformer d80 bf16+ckpt adafactor 4x2.5s",
        lambda: conformer(80, 4, 3, subsampling_factor=8),
        BatchShape(4, 250, 18),
        setup("bf16", True, "adafactor"),
    ),
    HeldOutCase(
        "conformer d64 pure_bf16 adamw 3x3.5s",
        lambda: conformer(64, 4, 2),
        BatchShape(3, 350, 30),
        setup("pure_bf16", False, "adamw"),
    ),
    HeldOutCase(
        "conformer+dec d96 fp32 adamw 3x2s",
        lambda: conformer(96, 4, 2, decoder=1),
        BatchShape(3, 200, 16),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "conformer+dec d64 bf16 sgd 4x3s",
        lambda: conformer(64, 2, 2, decoder=2),
        BatchShape(4, 300, 24),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "conformer+dec d80 fp32+ckpt adafactor 2x4s",
        lambda: conformer(80, 4, 1, decoder=2),
        BatchShape(2, 400, 32),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "conformer+dec d112 bf16+ckpt adamw 3x2.2s",
        lambda: conformer(112, 4, 2, decoder=1),
        BatchShape(3, 220, 18),
        setup("bf16", True, "adamw"),
    ),
    HeldOutCase(
        "conformer d48 fp32 sgd 8x1.5s",
        lambda: conformer(48, 2, 3, conv_kernel_size=7),
        BatchShape(8, 150, 12),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "conformer d128 bf16 adamw 2x6s",
        lambda: conformer(128, 8, 1),
        BatchShape(2, 600, 50),
        setup("bf16", False, "adamw"),
    ),
    # families without an asrfit adapter (asrfit.memory.models.generic)
    HeldOutCase(
        "data2vec-audio h56 bf16 adamw 3x1.6s",
        lambda: generic("data2vec-audio", 56, 4),
        BatchShape(3, 25600, 11),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "unispeech-sat h40 fp32+ckpt sgd 2x2.2s",
        lambda: generic("unispeech-sat", 40, 2),
        BatchShape(2, 35200, 14),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2-conformer h48 fp32 adafactor 2x1.8s",
        lambda: generic("wav2vec2-conformer", 48, 4),
        BatchShape(2, 28800, 12),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "sew h64 fp32 adamw 3x1.4s",
        lambda: generic("sew", 64, 4),
        BatchShape(3, 22400, 9),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "sew-d h48 bf16 sgd 2x1.9s",
        lambda: generic("sew-d", 48, 2),
        BatchShape(2, 30400, 12),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2-bert h64 fp32 adamw 3x1.7s",
        lambda: generic("wav2vec2-bert", 64, 4),
        BatchShape(3, 170, 12),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "speech_to_text d64 bf16+ckpt adamw 3x2.4s",
        lambda: generic("speech_to_text", 64, 4),
        BatchShape(3, 240, 15),
        setup("bf16", True, "adamw"),
    ),
]


MEMORY_2 = [
    HeldOutCase(
        "wav2vec2-bert h48 bf16 sgd 2x2.4s",
        lambda: generic("wav2vec2-bert", 48, 3),
        BatchShape(2, 240, 18),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2-bert h80 fp32+ckpt adafactor 4x1.3s",
        lambda: generic("wav2vec2-bert", 80, 5),
        BatchShape(4, 130, 9),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "wav2vec2-bert h96 pure_bf16 adamw 2x1.9s",
        lambda: generic("wav2vec2-bert", 96, 8),
        BatchShape(2, 190, 14),
        setup("pure_bf16", False, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2-conformer h72 rotary bf16 adamw 3x1.5s",
        lambda: generic_rotary(72, 6),
        BatchShape(3, 24000, 10),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "lasr-ctc h64 fp32 sgd 3x2.2s",
        lambda: new_family("lasr_ctc", 64, 4),
        BatchShape(3, 220, 14),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "lasr-ctc h40 bf16+ckpt adamw 2x3.2s",
        lambda: new_family("lasr_ctc", 40, 2),
        BatchShape(2, 320, 20),
        setup("bf16", True, "adamw"),
    ),
    HeldOutCase(
        "unispeech h56 fp32 adafactor 3x1.5s",
        lambda: new_family("unispeech", 56, 7),
        BatchShape(3, 24000, 10),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "moonshine h64 fp32 adamw 2x1.8s",
        lambda: new_family("moonshine", 64, 4),
        BatchShape(2, 28800, 12),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "parakeet-ctc h64 fp32 adamw 2x2.7s",
        lambda: parakeet("ctc", 64, 8),
        BatchShape(2, 270, 22),
        setup("fp32", False, "adamw"),
    ),
]


MEMORY_3 = [
    HeldOutCase(
        "wav2vec2-bert h56 bf16+ckpt adamw 3x2.1s",
        lambda: generic("wav2vec2-bert", 56, 4),
        BatchShape(3, 210, 15),
        setup("bf16", True, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2-bert h112 fp32 sgd 2x1.5s",
        lambda: generic("wav2vec2-bert", 112, 7),
        BatchShape(2, 150, 11),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2-conformer h88 pure_bf16 sgd 2x2s",
        lambda: generic("wav2vec2-conformer", 88, 4),
        BatchShape(2, 32000, 13),
        setup("pure_bf16", False, "sgd"),
    ),
    HeldOutCase(
        "sew-d h64 fp32 adafactor 3x1.6s",
        lambda: generic("sew-d", 64, 4),
        BatchShape(3, 25600, 10),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "lasr-ctc h96 pure_bf16 sgd 2x2.8s",
        lambda: new_family("lasr_ctc", 96, 6),
        BatchShape(2, 280, 19),
        setup("pure_bf16", False, "sgd"),
    ),
    HeldOutCase(
        "moonshine h48 bf16 sgd 3x2.2s",
        lambda: new_family("moonshine", 48, 3),
        BatchShape(3, 35200, 14),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "parakeet-tdt h64 fp32+ckpt adafactor 2x1.7s",
        lambda: parakeet("tdt", 64, 4),
        BatchShape(2, 170, 9),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "whisper d80 pure_bf16 adafactor 2x2.5s",
        lambda: whisper(80, 5, 250),
        BatchShape(2, 250, 19),
        setup("pure_bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "unispeech h72 bf16+ckpt sgd 2x2.6s",
        lambda: new_family("unispeech", 72, 6),
        BatchShape(2, 41600, 16),
        setup("bf16", True, "sgd"),
    ),
]


MEMORY_4 = [
    # wav2vec2 / HuBERT / WavLM / UniSpeech(-SAT) / data2vec-audio
    HeldOutCase(
        "wav2vec2 h112 group pure_bf16 sgd 2x1.6s",
        lambda: w2v("Wav2Vec2ForCTC", 112, 8, "group", False),
        BatchShape(2, 25600, 11),
        setup("pure_bf16", False, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2 h40 layer bf16+ckpt adamw8bit 4x1.2s",
        lambda: w2v("Wav2Vec2ForCTC", 40, 5, "layer", True),
        BatchShape(4, 19200, 8),
        setup("bf16", True, "adamw8bit"),
    ),
    HeldOutCase(
        "wav2vec2 h64 group fp32 ckpt-first-layer adamw 2x2.2s",
        lambda: w2v("Wav2Vec2ForCTC", 64, 4, "group", False),
        BatchShape(2, 35200, 15),
        Setup(precision="fp32", checkpoint_layers=1, optimizer="adamw"),
    ),
    HeldOutCase(
        "hubert h112 layer fp32 adafactor 2x2.9s",
        lambda: w2v("HubertForCTC", 112, 7, "layer", True),
        BatchShape(2, 46400, 19),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "hubert h40 group pure_bf16 adamw 3x1.3s",
        lambda: w2v("HubertForCTC", 40, 4, "group", False),
        BatchShape(3, 20800, 9),
        setup("pure_bf16", False, "adamw"),
    ),
    HeldOutCase(
        "wavlm h56 group fp32+ckpt adafactor 2x2.7s",
        lambda: w2v("WavLMForCTC", 56, 7, "group", False, **WAVLM),
        BatchShape(2, 43200, 17),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "wavlm h112 layer bf16 sgd 3x1.1s",
        lambda: w2v("WavLMForCTC", 112, 4, "layer", True, **WAVLM),
        BatchShape(3, 17600, 7),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "unispeech h48 fp32 adamw8bit 2x2s",
        lambda: new_family("unispeech", 48, 4),
        BatchShape(2, 32000, 13),
        setup("fp32", False, "adamw8bit"),
    ),
    HeldOutCase(
        "unispeech-sat h88 bf16 adamw 3x1.2s",
        lambda: generic("unispeech-sat", 88, 8),
        BatchShape(3, 19200, 8),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "data2vec-audio h72 fp32+ckpt adafactor 2x2.3s",
        lambda: generic("data2vec-audio", 72, 6),
        BatchShape(2, 36800, 15),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "data2vec-audio h96 pure_bf16 sgd 2x1.4s",
        lambda: generic("data2vec-audio", 96, 3),
        BatchShape(2, 22400, 9),
        setup("pure_bf16", False, "sgd"),
    ),
    # SEW / SEW-D
    HeldOutCase(
        "sew h96 bf16+ckpt sgd 2x2.1s",
        lambda: generic("sew", 96, 6),
        BatchShape(2, 33600, 14),
        setup("bf16", True, "sgd"),
    ),
    HeldOutCase(
        "sew h48 pure_bf16 adafactor 4x1s",
        lambda: generic("sew", 48, 3),
        BatchShape(4, 16000, 6),
        setup("pure_bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "sew-d h80 bf16+ckpt adamw 2x1.4s",
        lambda: generic("sew-d", 80, 5),
        BatchShape(2, 22400, 9),
        setup("bf16", True, "adamw"),
    ),
    # wav2vec2-conformer: relative and rotary position embeddings; wav2vec2-bert
    HeldOutCase(
        "wav2vec2-conformer h64 relative bf16+ckpt adafactor 2x1.7s",
        lambda: generic_relative(64, 4),
        BatchShape(2, 27200, 11),
        setup("bf16", True, "adafactor"),
    ),
    HeldOutCase(
        "wav2vec2-conformer h56 relative fp32 adamw 3x1.1s",
        lambda: generic_relative(56, 4),
        BatchShape(3, 17600, 7),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2-conformer h96 rotary fp32+ckpt sgd 2x1.3s",
        lambda: generic_rotary(96, 8),
        BatchShape(2, 20800, 9),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "wav2vec2-bert h40 fp32+ckpt adamw8bit 3x1.2s",
        lambda: generic("wav2vec2-bert", 40, 5),
        BatchShape(3, 120, 8),
        setup("fp32", True, "adamw8bit"),
    ),
    # Whisper, Speech2Text, Moonshine
    HeldOutCase(
        "whisper d64 fp32+ckpt adafactor 3x1.8s",
        lambda: whisper(64, 4, 180),
        BatchShape(3, 180, 13),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "whisper d112 bf16 sgd 2x1.2s",
        lambda: whisper(112, 7, 120),
        BatchShape(2, 120, 11),
        setup("bf16", False, "sgd"),
    ),
    HeldOutCase(
        "speech_to_text d96 fp32 sgd 2x1.6s",
        lambda: generic("speech_to_text", 96, 6),
        BatchShape(2, 160, 12),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "speech_to_text d48 pure_bf16 adafactor 4x2s",
        lambda: generic("speech_to_text", 48, 3),
        BatchShape(4, 200, 17),
        setup("pure_bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "moonshine h80 bf16+ckpt adafactor 2x1.4s",
        lambda: new_family("moonshine", 80, 5),
        BatchShape(2, 22400, 10),
        setup("bf16", True, "adafactor"),
    ),
    # LASR, Parakeet CTC / TDT
    HeldOutCase(
        "lasr-ctc h56 fp32+ckpt adafactor 3x1.6s",
        lambda: new_family("lasr_ctc", 56, 4),
        BatchShape(3, 160, 11),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "parakeet-ctc h96 pure_bf16 adafactor 2x2.1s",
        lambda: parakeet("ctc", 96, 6),
        BatchShape(2, 210, 17),
        setup("pure_bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "parakeet-tdt h56 fp32 sgd 3x2.3s",
        lambda: parakeet("tdt", 56, 7),
        BatchShape(3, 230, 12),
        setup("fp32", False, "sgd"),
    ),
    # asrfit's Conformer, with and without its attention decoder
    HeldOutCase(
        "conformer d72 fp32 adafactor 5x1.8s",
        lambda: conformer(72, 3, 2),
        BatchShape(5, 180, 14),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "conformer d56 pure_bf16 sgd 3x4.2s",
        lambda: conformer(56, 2, 2),
        BatchShape(3, 420, 33),
        setup("pure_bf16", False, "sgd"),
    ),
    HeldOutCase(
        "conformer+dec d88 bf16 adafactor 2x2.6s",
        lambda: conformer(88, 4, 2, decoder=1),
        BatchShape(2, 260, 21),
        setup("bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "conformer+dec d104 fp32+ckpt adamw8bit 3x1.7s",
        lambda: conformer(104, 8, 2, decoder=2),
        BatchShape(3, 170, 14),
        setup("fp32", True, "adamw8bit"),
    ),
]


MEMORY_5 = [
    HeldOutCase(
        "wav2vec2 h256 x4 layer fp32 adamw 4x4s",
        lambda: bigger(w2v("Wav2Vec2ForCTC", 256, 8, "layer", True), 4, 128),
        BatchShape(4, 64000, 50),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "hubert h192 x3 group bf16+ckpt sgd 3x6s",
        lambda: bigger(w2v("HubertForCTC", 192, 6, "group", False), 3, 96),
        BatchShape(3, 96000, 70),
        setup("bf16", True, "sgd"),
    ),
    HeldOutCase(
        "data2vec-audio h192 x3 pure_bf16 adafactor 3x5s",
        lambda: bigger(generic("data2vec-audio", 192, 4), 3, 64),
        BatchShape(3, 80000, 60),
        setup("pure_bf16", False, "adafactor"),
    ),
    HeldOutCase(
        "wav2vec2-bert h160 x3 bf16 adamw 2x5s",
        lambda: bigger(generic("wav2vec2-bert", 160, 8), 3),
        BatchShape(2, 500, 60),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "whisper d256 x2 fp32 adafactor 4x10s",
        lambda: bigger(whisper(256, 4, 1000), 2),
        BatchShape(4, 1000, 40),
        setup("fp32", False, "adafactor"),
    ),
    HeldOutCase(
        "speech_to_text d192 x3 fp32+ckpt sgd 3x6s",
        lambda: bigger(generic("speech_to_text", 192, 4), 3),
        BatchShape(3, 600, 45),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "parakeet-ctc h192 x2 fp32 sgd 4x6s",
        lambda: parakeet("ctc", 192, 4, 2),
        BatchShape(4, 600, 60),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "conformer d192 x4 bf16 adamw 4x8s",
        lambda: conformer(192, 4, 4),
        BatchShape(4, 800, 64),
        setup("bf16", False, "adamw"),
    ),
]


MEMORY_SCALE = [
    HeldOutCase(
        "whisper-base bf16 adamw 2x30s U60",
        lambda: bundled("whisper-base"),
        BatchShape(2, 3000, 60),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "whisper-base fp32+ckpt adafactor 3x30s U120",
        lambda: bundled("whisper-base"),
        BatchShape(3, 3000, 120),
        setup("fp32", True, "adafactor"),
    ),
    HeldOutCase(
        "whisper-small fp32+ckpt sgd 1x30s U100",
        lambda: bundled("whisper-small"),
        BatchShape(1, 3000, 100),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "whisper-small bf16+ckpt adafactor 1x30s U64",
        lambda: bundled("whisper-small"),
        BatchShape(1, 3000, 64),
        setup("bf16", True, "adafactor"),
    ),
    HeldOutCase(
        "s2t-small fp32 adamw 4x15s U60",
        s2t_small,
        BatchShape(4, 1500, 60),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "moonshine-tiny bf16 adamw 6x20s U80",
        moonshine_tiny,
        BatchShape(6, 320000, 80),
        setup("bf16", False, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2-base fp32 adamw 2x12s U180",
        lambda: bundled("wav2vec2-base"),
        BatchShape(2, 192000, 180),
        setup("fp32", False, "adamw"),
    ),
    HeldOutCase(
        "wav2vec2-base fp32+ckpt sgd 4x15s U220",
        lambda: bundled("wav2vec2-base"),
        BatchShape(4, 240000, 220),
        setup("fp32", True, "sgd"),
    ),
    HeldOutCase(
        "parakeet-ctc-0.6b 6 of 24 layers fp32 sgd 2x20s U80",
        lambda: parakeet_ctc_layers(6),
        BatchShape(2, 2000, 80),
        setup("fp32", False, "sgd"),
    ),
    HeldOutCase(
        "conformer-ctc-large fp32 adamw 8x16s U240",
        lambda: bundled("conformer-ctc-large"),
        BatchShape(8, 1600, 240),
        Setup(precision="fp32", optimizer="adamw"),
    ),
]


MEMORY_SCALE_RULES = [
    HeldOutCase(
        "whisper-base fp32 adamw 2x30s U80",
        lambda: bundled("whisper-base"),
        BatchShape(2, 3000, 80),
        setup("fp32", False, "adamw"),
    ),
]


STEP_TIME_FIT = [
    *family_group("wav2vec2", "adamw", 1.5, 10),
    *family_group("whisper", "sgd", 2.0, 10),
    *family_group("parakeet-ctc", "adafactor", 1.5, 10),
]


@dataclass(frozen=True)
class PlanCase:
    """One planning benchmark case: a bundled model on a named GPU, timed by
    ``python -m bench plan_speed`` (a 20,000-utterance LibriSpeech-like manifest)."""

    model: str
    gpu: str
    # the cold wall-time target on a 2-core host, imports included (None: no target set)
    target_seconds: float | None = None
    # also plan with every fit refined, the reference the plan must equal
    compare: bool = True

    @property
    def name(self) -> str:
        return f"{self.model} / {self.gpu}"


# The four cases every planner speed-up was measured on.
PLAN_SPEED_TUNED = [
    PlanCase("wav2vec2-base", "T4", 9.0),
    PlanCase("whisper-small", "A10G", 12.0),
    PlanCase("xls-r-1b", "L4", 12.0),
    PlanCase("parakeet-tdt-0.6b-v2", "A100-80GB", 15.0),
]

# Other families and sizes, never planned while the planner's speed was worked on.
PLAN_SPEED_1 = [
    PlanCase("hubert-large", "A10G"),
    PlanCase("whisper-medium", "A100-40GB"),
]

STEP_TIME_1 = [
    *family_group("hubert", "adafactor", 1.5, 10),
    *family_group("wavlm", "sgd", 1.0, 8),
    # no bf16: oneDNN has no bf16 LSTM primitive on this CPU (the TDT decoder fails)
    *family_group("parakeet-tdt", "adamw", 1.5, 10, bf16=False),
]


STEP_TIME_2 = [
    Case("whisper", "fp32", False, "adamw", 4, 3.0, 20),
    Case("whisper", "fp32", True, "adamw", 4, 3.0, 20),
    Case("wav2vec2", "fp32", False, "sgd", 3, 3.0, 25),
    Case("wav2vec2", "fp32", False, "adafactor", 1, 5.0, 40),
    Case("hubert", "fp32", False, "sgd", 4, 2.0, 16),
    Case("wavlm", "fp32", False, "adamw", 3, 2.0, 16),
    Case("wavlm", "fp32", True, "adamw", 3, 2.0, 16),
    Case("parakeet-ctc", "fp32", False, "sgd", 4, 3.0, 24),
    Case("parakeet-ctc", "bf16", False, "adamw", 3, 2.0, 16),
    Case("parakeet-tdt", "fp32", False, "sgd", 3, 1.0, 6),
    Case("parakeet-tdt", "fp32", False, "adafactor", 1, 3.0, 20),
]


STEP_TIME_3 = [
    Case("parakeet-tdt", "fp32", False, "adamw", 2, 2.0, 16),
    Case("parakeet-tdt", "fp32", True, "sgd", 4, 1.5, 12),
    Case("parakeet-tdt", "fp32", False, "adafactor", 3, 2.5, 8),
    Case("parakeet-tdt", "fp32", False, "sgd", 1, 4.0, 30),
    Case("parakeet-ctc", "fp32", True, "adamw", 3, 2.5, 20),
    Case("wav2vec2", "fp32", True, "sgd", 4, 2.0, 16),
    Case("whisper", "bf16", False, "adamw", 3, 2.0, 12),
    Case("hubert", "fp32", False, "adamw", 2, 3.0, 24),
    Case("wavlm", "bf16", False, "adafactor", 4, 1.5, 12),
    Case("whisper", "fp32", False, "adafactor", 2, 4.0, 30),
]


STEP_TIME_4 = [
    Case("wav2vec2", "fp32", False, "adafactor", 4, 2.0, 16),
    Case("wav2vec2", "bf16", False, "sgd", 3, 1.5, 12),
    Case("whisper", "fp32", True, "adafactor", 3, 3.0, 20),
    Case("whisper", "fp32", False, "sgd", 1, 6.0, 40),
    Case("hubert", "fp32", True, "sgd", 3, 2.0, 14),
    Case("hubert", "bf16", False, "adamw", 2, 2.0, 14),
    Case("wavlm", "fp32", False, "adafactor", 2, 3.0, 20),
    Case("parakeet-ctc", "fp32", False, "adamw", 5, 1.5, 10),
    Case("parakeet-ctc", "fp32", True, "sgd", 2, 4.0, 30),
    Case("parakeet-tdt", "fp32", True, "adafactor", 2, 2.0, 14),
]


STEP_TIME_5 = [
    Case("whisper", "bf16", True, "sgd", 2, 3.0, 16),
    Case("whisper", "bf16", False, "adafactor", 4, 1.5, 10),
    Case("whisper", "fp32", False, "adamw", 6, 1.0, 8),
    Case("wavlm", "bf16", True, "adamw", 2, 2.0, 14),
    Case("wavlm", "fp32", False, "sgd", 4, 2.5, 18),
    Case("wav2vec2", "bf16", True, "adafactor", 2, 2.5, 18),
    Case("hubert", "fp32", False, "adafactor", 5, 1.0, 8),
    Case("parakeet-ctc", "bf16", False, "sgd", 4, 1.5, 10),
    Case("parakeet-ctc", "fp32", False, "adafactor", 1, 6.0, 40),
    Case("parakeet-tdt", "fp32", False, "adamw", 4, 1.0, 8),
]


STEP_TIME_6 = [
    Case("wav2vec2", "fp32", False, "adamw", 2, 4.0, 30),
    Case("wav2vec2", "fp32", True, "adafactor", 3, 1.0, 8),
    Case("hubert", "fp32", False, "sgd", 2, 5.0, 36),
    Case("hubert", "bf16", True, "sgd", 3, 1.5, 12),
    Case("wavlm", "fp32", False, "adamw", 5, 1.5, 12),
    Case("whisper", "fp32", False, "sgd", 3, 5.0, 36),
    Case("whisper", "bf16", False, "adamw", 2, 1.0, 6),
    Case("parakeet-ctc", "fp32", False, "adamw", 2, 5.0, 36),
    Case("parakeet-ctc", "fp32", True, "adafactor", 6, 1.0, 8),
    Case("parakeet-tdt", "fp32", False, "sgd", 2, 3.0, 20),
]


def _set(
    name: str,
    benchmark: str,
    written: str,
    role: str,
    held_out_from: str,
    cases: list,
    written_utc: str = "",
) -> CaseSet:
    day = datetime.date.fromisoformat(written)
    return CaseSet(name, benchmark, day, role, held_out_from, tuple(cases), written_utc)


CASE_SETS: dict[str, CaseSet] = {
    s.name: s
    for s in (
        # -- memory: small steps (tiny widths and vocabularies) ---------------------------------
        _set(
            "memory-rules",
            "memory",
            "2026-11-23",
            "diagnosis",
            "nothing: the six steps used while the CPU rules were written",
            MEMORY_RULES,
        ),
        _set(
            "memory-1",
            "memory",
            "2026-11-23",
            "diagnosis",
            "the grid (bench/_grid.py) and the rule-writing steps, written after the CPU rules "
            "were final (asrfit.memory.trace.cpu_kernels, asrfit.memory.trace.engine); then used to find "
            "the first fix (_safe_softmax's buffers and other CPU kernels' scratch)",
            MEMORY_1,
        ),
        _set(
            "memory-2",
            "memory",
            "2026-11-24",
            "diagnosis",
            "every earlier case, written after the first fix; then used to find the second "
            "(composite ATen code in place in a plain step, asrfit.memory.trace.engine."
            "plain_composites)",
            MEMORY_2,
        ),
        _set(
            "memory-3",
            "memory",
            "2026-11-24",
            "held out",
            "every earlier case, written after both fixes, before any of its cases ran",
            MEMORY_3,
        ),
        _set(
            "memory-4",
            "memory",
            "2026-11-24",
            "held out",
            "every earlier case (a width, head count, length or setup no earlier case of its "
            "family used), written after both fixes, before any of its cases ran",
            MEMORY_4,
            "04:32",
        ),
        _set(
            "memory-5",
            "memory",
            "2026-11-24",
            "held out",
            "every earlier case (ten times the widths and lengths), written after memory-4 had "
            "run, before any of its cases ran",
            MEMORY_5,
            "04:48",
        ),
        # -- memory: real-scale steps (published layouts, full vocabulary and width) -----------
        _set(
            "memory-scale",
            "memory",
            "2026-11-28",
            "held out",
            "the rule for parameters used twice (asrfit.memory.trace.engine): written, with batches "
            "and setups, before that rule changed, none run before it",
            MEMORY_SCALE,
        ),
        _set(
            "memory-scale-rules",
            "memory",
            "2026-11-28",
            "diagnosis",
            "nothing: the step the shortfall was reported on, used to find the rule",
            MEMORY_SCALE_RULES,
        ),
        # -- planning speed ---------------------------------------------------------------------
        _set(
            "plan-speed-tuned",
            "plan-speed",
            "2026-11-24",
            "fitted",
            "nothing: screening, depth scaling and the trace workers were measured "
            "and tuned on these four",
            PLAN_SPEED_TUNED,
        ),
        _set(
            "plan-speed-1",
            "plan-speed",
            "2026-11-28",
            "held out",
            "the planner's speed work (measured on plan-speed-tuned): other sizes of the "
            "families, written before either was planned",
            PLAN_SPEED_1,
            "20:25",
        ),
        # -- step time (CPU) --------------------------------------------------------------------
        _set(
            "step-time-fit",
            "step-time",
            "2026-11-23",
            "fitted",
            "nothing: the per-module factor was fitted on these",
            STEP_TIME_FIT,
        ),
        _set(
            "step-time-1",
            "step-time",
            "2026-11-23",
            "held out",
            "the fitted families: other families, added after the model was final",
            STEP_TIME_1,
        ),
        _set(
            "step-time-2",
            "step-time",
            "2026-11-24",
            "held out",
            "the per-kind and per-module model, final before: other shapes, optimizers and "
            "label lengths, fitted and held-out families alike",
            STEP_TIME_2,
            "08:50",
        ),
        _set(
            "step-time-3",
            "step-time",
            "2026-11-24",
            "held out",
            "the integer-kernel figure (int_kernel_seconds: index arithmetic on integer "
            "tensors records no autograd), found on step-time-2's parakeet-tdt cases; written "
            "before any run with it",
            STEP_TIME_3,
            "22:05",
        ),
        _set(
            "step-time-4",
            "step-time",
            "2026-11-27",
            "held out",
            "the per-kind bandwidth curves (norm, softmax, activation and dropout's generator "
            "on their own measured curves) and glibc keeping freed memory; written before any "
            "run with them",
            STEP_TIME_4,
            "02:10",
        ),
        _set(
            "step-time-5",
            "step-time",
            "2026-11-27",
            "held out",
            "attention calls priced at their own shape (found on the whisper bf16 cases); "
            "written before any run with it",
            STEP_TIME_5,
            "02:10",
        ),
        _set(
            "step-time-6",
            "step-time",
            "2026-11-27",
            "held out",
            "copies that change the memory layout priced at their own measured bandwidth, the "
            "copies kernels make of non-contiguous inputs in the trace, host rates the best of "
            "two passes; written before any run with them",
            STEP_TIME_6,
            "03:55",
        ),
    )
}


def case_set(name: str) -> CaseSet:
    """The set called ``name`` (a key of :data:`CASE_SETS`)."""
    return CASE_SETS[name]


def cases(*names: str) -> list:
    """The cases of the named sets, in order."""
    return [c for name in names for c in CASE_SETS[name].cases]


def sets_of(benchmark: str) -> list[CaseSet]:
    """The sets of one benchmark (``"memory"``, ``"step-time"`` or ``"plan-speed"``), oldest
    first."""
    return [s for s in CASE_SETS.values() if s.benchmark == benchmark]
