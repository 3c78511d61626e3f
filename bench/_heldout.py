"""The held-out split of the memory-accuracy benchmark (issue 11), and its diagnosis split.

Written after the CPU rules were final (``asrfit.memory.cpu_kernels``: each kernel's scratch
and workspace measured on this CPU per shape; ``asrfit.memory.engine``: in-place gradient
accumulation). Every case differs from the grid of ``bench/_grid.py`` and from the
*diagnosis* cases below (the six steps used while writing the rules) in at least two of:
family, width, head count, extractor norm, precision, optimizer, checkpointing, batch, length.
Each is compared with a plain real CPU step counted at the allocator (``bench/_truth.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import _grid
import transformers

from asrfit.memory.adapters import BatchShape
from asrfit.memory.setup import Setup


def _w2v(cls_name: str, hidden: int, heads: int, norm: str, stable: bool, **extra: Any) -> Any:
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


def _parakeet(kind: str, hidden: int, heads: int, layers: int = 1) -> Any:
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


def _generic(model_type: str, hidden: int, heads: int) -> Any:
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


def _whisper(d_model: int, heads: int, frames: int) -> Any:
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


def _conformer(d_model: int, heads: int, layers: int, decoder: int = 0, **extra: Any) -> Any:
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


@dataclass
class HeldOutCase:
    """One held-out step: a config factory, a batch and a setup."""

    name: str
    make_config: Any
    batch: BatchShape
    setup: Setup = field(default_factory=Setup)


def _s(precision: str = "fp32", ckpt: bool = False, optimizer: str = "adamw") -> Setup:
    return Setup(precision=precision, gradient_checkpointing=ckpt, optimizer=optimizer)


def held_out() -> list[HeldOutCase]:
    """41 held-out cases (34 of families with an adapter, 7 through the generic adapter)."""
    w = _w2v
    return [
        # wav2vec2 family: widths 48/80/96, 2-6 heads, group and layer extractors, 1.3-3.4 s
        HeldOutCase(
            "wav2vec2 h48 group fp32 sgd 2x1.3s",
            lambda: w("Wav2Vec2ForCTC", 48, 2, "group", False),
            BatchShape(2, 20800, 9),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "wav2vec2 h80 layer bf16+ckpt adafactor 3x1.7s",
            lambda: w("Wav2Vec2ForCTC", 80, 5, "layer", True),
            BatchShape(3, 27200, 11),
            _s("bf16", True, "adafactor"),
        ),
        HeldOutCase(
            "wav2vec2 h96 layer pure_bf16 adamw 2x2.3s",
            lambda: w("Wav2Vec2ForCTC", 96, 6, "layer", True),
            BatchShape(2, 36800, 14),
            _s("pure_bf16", False, "adamw"),
        ),
        HeldOutCase(
            "wav2vec2 h48 layer fp32+ckpt adamw 5x1.1s",
            lambda: w("Wav2Vec2ForCTC", 48, 3, "layer", True),
            BatchShape(5, 17600, 7),
            _s("fp32", True, "adamw"),
        ),
        HeldOutCase(
            "hubert h80 group fp32 adamw 3x2.1s",
            lambda: w("HubertForCTC", 80, 4, "group", False),
            BatchShape(3, 33600, 13),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "hubert h48 layer bf16 sgd 4x1.4s",
            lambda: w("HubertForCTC", 48, 2, "layer", True),
            BatchShape(4, 22400, 10),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "hubert h96 group fp32+ckpt sgd 2x3.4s",
            lambda: w("HubertForCTC", 96, 3, "group", False),
            BatchShape(2, 54400, 22),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "hubert h64 group bf16+ckpt adafactor 3x1.9s",
            lambda: w("HubertForCTC", 64, 4, "group", False),
            BatchShape(3, 30400, 12),
            _s("bf16", True, "adafactor"),
        ),
        HeldOutCase(
            "wavlm h80 layer fp32+ckpt adamw 3x1.6s",
            lambda: w("WavLMForCTC", 80, 5, "layer", True, num_buckets=16, max_bucket_distance=64),
            BatchShape(3, 25600, 10),
            _s("fp32", True, "adamw"),
        ),
        HeldOutCase(
            "wavlm h48 group bf16 adamw 2x2.6s",
            lambda: w("WavLMForCTC", 48, 3, "group", False, num_buckets=16, max_bucket_distance=64),
            BatchShape(2, 41600, 16),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "wavlm h96 layer fp32 sgd 2x1.2s",
            lambda: w("WavLMForCTC", 96, 6, "layer", True, num_buckets=16, max_bucket_distance=64),
            BatchShape(2, 19200, 8),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "wavlm h64 layer pure_bf16 sgd 3x2.2s",
            lambda: w("WavLMForCTC", 64, 2, "layer", True, num_buckets=16, max_bucket_distance=64),
            BatchShape(3, 35200, 14),
            _s("pure_bf16", False, "sgd"),
        ),
        # Whisper: widths 48/96, heads 3/6, 1.5-3 s windows
        HeldOutCase(
            "whisper d48 fp32 adafactor 3x1.5s",
            lambda: _whisper(48, 3, 150),
            BatchShape(3, 150, 17),
            _s("fp32", False, "adafactor"),
        ),
        HeldOutCase(
            "whisper d96 bf16+ckpt sgd 2x3s",
            lambda: _whisper(96, 6, 300),
            BatchShape(2, 300, 30),
            _s("bf16", True, "sgd"),
        ),
        HeldOutCase(
            "whisper d96 fp32+ckpt adamw 4x2s",
            lambda: _whisper(96, 3, 200),
            BatchShape(4, 200, 21),
            _s("fp32", True, "adamw"),
        ),
        HeldOutCase(
            "whisper d48 bf16 adamw 5x1.5s",
            lambda: _whisper(48, 6, 150),
            BatchShape(5, 150, 9),
            _s("bf16", False, "adamw"),
        ),
        # Parakeet CTC / TDT: widths 48/80, 1-2 layers
        HeldOutCase(
            "parakeet-ctc h80 fp32 sgd 3x1.8s",
            lambda: _parakeet("ctc", 80, 5),
            BatchShape(3, 180, 16),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "parakeet-ctc h48 bf16+ckpt adamw 4x2.4s",
            lambda: _parakeet("ctc", 48, 3, 2),
            BatchShape(4, 240, 20),
            _s("bf16", True, "adamw"),
        ),
        HeldOutCase(
            "parakeet-ctc h48 fp32+ckpt adafactor 2x3.1s",
            lambda: _parakeet("ctc", 48, 2),
            BatchShape(2, 310, 25),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "parakeet-ctc h80 bf16 sgd 5x1.3s",
            lambda: _parakeet("ctc", 80, 4, 2),
            BatchShape(5, 130, 9),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "parakeet-tdt h48 fp32 adamw 2x1.5s",
            lambda: _parakeet("tdt", 48, 3),
            BatchShape(2, 150, 8),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "parakeet-tdt h80 bf16 sgd 2x1.2s",
            lambda: _parakeet("tdt", 80, 5),
            BatchShape(2, 120, 7),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "parakeet-tdt h48 fp32+ckpt sgd 3x1.1s",
            lambda: _parakeet("tdt", 48, 2),
            BatchShape(3, 110, 6),
            _s("fp32", True, "sgd"),
        ),
        # asrfit's Conformer, with and without its attention decoder
        HeldOutCase(
            "conformer d96 fp32 adamw 3x3s",
            lambda: _conformer(96, 4, 2),
            BatchShape(3, 300, 25),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "conformer d64 bf16 sgd 6x2s",
            lambda: _conformer(64, 2, 2),
            BatchShape(6, 200, 15),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "conformer d112 fp32+ckpt sgd 2x5s",
            lambda: _conformer(112, 4, 2),
            BatchShape(2, 500, 40),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "conformer d80 bf16+ckpt adafactor 4x2.5s",
            lambda: _conformer(80, 4, 3, subsampling_factor=8),
            BatchShape(4, 250, 18),
            _s("bf16", True, "adafactor"),
        ),
        HeldOutCase(
            "conformer d64 pure_bf16 adamw 3x3.5s",
            lambda: _conformer(64, 4, 2),
            BatchShape(3, 350, 30),
            _s("pure_bf16", False, "adamw"),
        ),
        HeldOutCase(
            "conformer+dec d96 fp32 adamw 3x2s",
            lambda: _conformer(96, 4, 2, decoder=1),
            BatchShape(3, 200, 16),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "conformer+dec d64 bf16 sgd 4x3s",
            lambda: _conformer(64, 2, 2, decoder=2),
            BatchShape(4, 300, 24),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "conformer+dec d80 fp32+ckpt adafactor 2x4s",
            lambda: _conformer(80, 4, 1, decoder=2),
            BatchShape(2, 400, 32),
            _s("fp32", True, "adafactor"),
        ),
        HeldOutCase(
            "conformer+dec d112 bf16+ckpt adamw 3x2.2s",
            lambda: _conformer(112, 4, 2, decoder=1),
            BatchShape(3, 220, 18),
            _s("bf16", True, "adamw"),
        ),
        HeldOutCase(
            "conformer d48 fp32 sgd 8x1.5s",
            lambda: _conformer(48, 2, 3, conv_kernel_size=7),
            BatchShape(8, 150, 12),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "conformer d128 bf16 adamw 2x6s",
            lambda: _conformer(128, 8, 1),
            BatchShape(2, 600, 50),
            _s("bf16", False, "adamw"),
        ),
        # families without an asrfit adapter (asrfit.memory.generic)
        HeldOutCase(
            "data2vec-audio h56 bf16 adamw 3x1.6s",
            lambda: _generic("data2vec-audio", 56, 4),
            BatchShape(3, 25600, 11),
            _s("bf16", False, "adamw"),
        ),
        HeldOutCase(
            "unispeech-sat h40 fp32+ckpt sgd 2x2.2s",
            lambda: _generic("unispeech-sat", 40, 2),
            BatchShape(2, 35200, 14),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "wav2vec2-conformer h48 fp32 adafactor 2x1.8s",
            lambda: _generic("wav2vec2-conformer", 48, 4),
            BatchShape(2, 28800, 12),
            _s("fp32", False, "adafactor"),
        ),
        HeldOutCase(
            "sew h64 fp32 adamw 3x1.4s",
            lambda: _generic("sew", 64, 4),
            BatchShape(3, 22400, 9),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "sew-d h48 bf16 sgd 2x1.9s",
            lambda: _generic("sew-d", 48, 2),
            BatchShape(2, 30400, 12),
            _s("bf16", False, "sgd"),
        ),
        HeldOutCase(
            "wav2vec2-bert h64 fp32 adamw 3x1.7s",
            lambda: _generic("wav2vec2-bert", 64, 4),
            BatchShape(3, 170, 12),
            _s("fp32", False, "adamw"),
        ),
        HeldOutCase(
            "speech_to_text d64 bf16+ckpt adamw 3x2.4s",
            lambda: _generic("speech_to_text", 64, 4),
            BatchShape(3, 240, 15),
            _s("bf16", True, "adamw"),
        ),
    ]


def diagnosis() -> list[HeldOutCase]:
    """The six steps used while writing the rules (reported apart, never as held out)."""
    from asrfit.models.conformer import conformer_config

    return [
        HeldOutCase(
            "conformer d144 fp32 sgd 4x4s",
            lambda: conformer_config(144, encoder_layers=3, encoder_attention_heads=4),
            BatchShape(4, 400, 30),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "conformer+dec d128 bf16+ckpt adamw 3x3s",
            lambda: conformer_config(128, encoder_layers=2, decoder_layers=2),
            BatchShape(3, 300, 20),
            _s("bf16", True, "adamw"),
        ),
        HeldOutCase(
            "wavlm grid-config fp32+ckpt sgd 4x3s",
            lambda: _grid._config("wavlm"),
            BatchShape(4, 48000, 20),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "hubert grid-config fp32 sgd 4x3s",
            lambda: _grid._config("hubert"),
            BatchShape(4, 48000, 20),
            _s("fp32", False, "sgd"),
        ),
        HeldOutCase(
            "parakeet-tdt grid-config fp32+ckpt sgd 4x4s",
            lambda: _grid._config("parakeet-tdt"),
            BatchShape(4, 400, 30),
            _s("fp32", True, "sgd"),
        ),
        HeldOutCase(
            "parakeet-tdt grid-config fp32 sgd 4x4s",
            lambda: _grid._config("parakeet-tdt"),
            BatchShape(4, 400, 30),
            _s("fp32", False, "sgd"),
        ),
    ]


# -- running and reporting -------------------------------------------------------------------

SECTIONS = {
    "held": "memory-accuracy-heldout",
    "diag": "memory-accuracy-diagnosis",
    "scale": "memory-accuracy-scale",
}
# The figures each split is judged by: (median |error|, max |error|, worst under-prediction).
TARGETS = {"held": (0.5, 3.0, -1.0), "diag": (0.5, 3.0, -1.0), "scale": (0.1, 3.0, -0.5)}
COMMAND = (
    "PYTHONPATH=src .venv/bin/python bench/memory_accuracy.py --heldout --split {split} "
    "--out docs/benchmarks.md"
)


@dataclass
class HeldOutRow:
    """One case's prediction against the plain step."""

    name: str
    predicted_bytes: int | None
    measured_bytes: int
    seconds: float
    failure: str = ""

    @property
    def error_pct(self) -> float | None:
        """Signed error, percent of the measured peak."""
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def run(case: HeldOutCase) -> HeldOutRow:
    """Simulate ``case`` (target cpu) and measure its plain CPU step."""
    import time

    import _truth

    from asrfit.memory.generic import speech_adapter as hf_adapter
    from asrfit.memory.simulate import simulate_step

    started = time.perf_counter()
    failure = ""
    try:
        sim = simulate_step(hf_adapter(case.make_config()), case.batch, case.setup, target="cpu")
        predicted: int | None = sim.peak_raw_bytes
    except Exception as exc:  # reported in the table
        predicted, failure = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
    try:
        measured = _truth.measure_adapter_step(
            hf_adapter(case.make_config()), case.batch, case.setup
        ).peak_bytes
    except Exception as exc:  # the real step itself cannot run on this CPU
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
        return HeldOutRow(
            case.name,
            predicted,
            0,
            time.perf_counter() - started,
            f"the real step cannot run on this CPU (a CPU kernel limitation, not a simulator "
            f"failure; nothing to compare): {reason}",
        )
    return HeldOutRow(case.name, predicted, measured, time.perf_counter() - started, failure)


def summary(rows: list[HeldOutRow]) -> dict[str, float]:
    """Median and max |error|, and the worst under-prediction (percent)."""
    import statistics

    errors = [r.error_pct for r in rows if r.error_pct is not None]
    if not errors:
        return {"median": float("nan"), "max": float("nan"), "worst_under": float("nan")}
    return {
        "median": statistics.median(abs(e) for e in errors),
        "max": max(abs(e) for e in errors),
        "worst_under": min(0.0, min(errors)),
    }


def _later() -> Any:
    import _heldout_later

    return _heldout_later


def _more() -> Any:
    import _heldout_more

    return _heldout_more


def _scale() -> Any:
    import _heldout_scale

    return _heldout_scale


@dataclass(frozen=True)
class Group:
    """A group of cases reported with its own table and summary line."""

    heading: str
    summary: str  # opens the summary line, e.g. "Held out"
    cases: Any  # () -> list[HeldOutCase]
    final: bool = False  # written after the final rules: part of the held-out figures


GROUPS = {
    "held": (
        Group(
            "Held out: 8 larger steps written 2026-11-24 at 04:48 UTC, after both fixes",
            "Held out (8 larger steps written 2026-11-24 at 04:48 UTC, after both fixes;",
            lambda: _more().held_out_larger(),
            final=True,
        ),
        Group(
            "Held out: 30 cases written 2026-11-24 at 04:32 UTC, after both fixes",
            "Held out (30 cases written 2026-11-24 at 04:32 UTC, after both fixes;",
            lambda: _more().held_out_more(),
            final=True,
        ),
        Group(
            "Held out: 9 cases written 2026-11-24, after both fixes",
            "Held out (9 cases written 2026-11-24, after both fixes;",
            lambda: _later().held_out_after_inplace_fix(),
            final=True,
        ),
        Group(
            "Written 2026-11-24 after the first (_safe_softmax) fix, then used to find the "
            "second (in-place composites): diagnosis cases for the second",
            "Cases written after the first fix, used to find the second (",
            lambda: _later().held_out_after_bert_fix(),
        ),
        Group(
            "Earlier held-out cases (written 2026-11-23), used to find the first fix: "
            "diagnosis cases for it",
            "Earlier held-out cases, used to find the first fix (",
            held_out,
        ),
    ),
    "diag": (Group("Rule-writing cases", "Rule-writing (diagnosis) cases (", diagnosis),),
    "scale": (
        Group(
            "Held out: 10 real-scale steps, written before the shared-parameter rule",
            "Real-scale held out (10 steps written before the shared-parameter rule;",
            lambda: _scale().held_out_scale(),
            final=True,
        ),
        Group(
            "The step the shortfall was reported on, used to find the rule: diagnosis",
            "Real-scale diagnosis (",
            lambda: _scale().diagnosis_scale(),
        ),
    ),
}


def _targets(split: str) -> str:
    median, largest, under = TARGETS[split]
    return (
        f"(targets: median <= {median:g} %, max <= {largest:g} %, no under-prediction worse "
        f"than {under:g} %)"
    )


def render_groups(
    groups: list[tuple[Group, list[HeldOutRow]]], split: str, environment: str
) -> str:
    """The markdown section of one split: the header, then a table and summary per group."""
    parts = [header_text(split, environment)]
    parts += [render(rows, split, environment, group, header=False) for group, rows in groups]
    final = [r for group, rows in groups if group.final for r in rows]
    if final:
        s_ = summary(final)
        ok = sum(r.error_pct is not None for r in final)
        parts.insert(
            1,
            f"**All cases written after the final rules** ({ok} of {len(final)} cases "
            f"compared, the held-out groups below together): |error| median "
            f"**{s_['median']:.2f} %**, max **{s_['max']:.2f} %**, worst under-prediction "
            f"**{s_['worst_under']:+.2f} %** {_targets(split)}.",
        )
    return "\n\n".join(parts)


_HISTORY = (
    "The 41 cases written on 2026-11-23 were "
    "then used to find why one missed (wav2vec2-bert, -1.76 %: `_safe_softmax`'s inner "
    "buffers, and other kernels measured since, `asrfit.memory.cpu_kernels`); the 9 cases "
    "written after that fix were used to find why two bf16 wav2vec2-bert cases "
    "over-predicted (+5 %, +9 %: composite ATen code that runs in place in a plain step "
    "runs out of place under a dispatch mode, `asrfit.memory.engine.plain_composites`). "
    "Both groups are reported below as diagnosis cases for those fixes. The held-out "
    "cases are the 9 written after both fixes (`bench/_heldout_later.py`), 30 more "
    "written later the same day and 8 larger steps written after those had run "
    "(`bench/_heldout_more.py`), each group before any of its cases was run; no "
    "simulator rule changed after any of them. Every group is re-measured in each run; the "
    "earlier groups' byte counts differ from their first run on both sides alike (on "
    "this venv their first run's code, commit 74b637e, measures the same bytes as this "
    "run: the environment changed, not the code), their errors by at most 0.25 points. "
    "Measured with the truth before its fix (the table's fp32 copy, made before the profile "
    "and replaced in step 1, stayed counted), wav2vec2-conformer h64 relative "
    "bf16+ckpt read -36.9 % (6.630 MiB measured): the gap is the 9999 x 64 x 4 B table; "
    "the fix follows the allocator's reporting and a closed-form test "
    "(`tests/test_memory_truth.py`), not that case, and changes no simulator rule. A plain "
    "run without the profiler agrees (`bench/cast_buffer_check.py`: glibc's bytes in use "
    "over the first step, net of the optimizer state, fall by 1.16 MB; about -1.28 MB if "
    "the fp32 table is freed, +1.28 MB if it stays). "
)


_SCALE_NOTE = (
    "The real-scale cases (`bench/_heldout_scale.py`) use published widths and "
    "vocabularies, so vocabulary-sized buffers (a tied embedding's gradient) weigh as in "
    "real training; they were written before the rule for parameters used twice "
    "(`asrfit.memory.engine`: a gradient that reaches the engine's input buffer as a view "
    "keeps its base alive, so the engine sums out of place) and are reported apart from "
    "the small split. "
)


def header_text(split: str, environment: str) -> str:
    """The section's title, command, run line and definitions."""
    return render([], split, environment, None, header=True, header_only=True)


def render(
    rows: list[HeldOutRow],
    split: str,
    environment: str,
    group: Group | None = None,
    *,
    header: bool = True,
    header_only: bool = False,
) -> str:
    """The markdown of one group of cases of a split ("held" or "diag"), with the header."""
    mib = 2**20
    title = {
        "held": "held-out steps",
        "diag": "the steps the rules were written on",
        "scale": "real-scale steps (published layouts, full vocabulary and width)",
    }[split]
    lines = [
        f"## Memory accuracy on {title} (CPU, plain step at the allocator)",
        "",
        f"Command: `{COMMAND.format(split=split)}`  ",
        f"Run: {environment}.",
        "",
        '*Predicted*: `simulate_step(..., target="cpu").peak_raw_bytes`: fake tensors; '
        "gradients summed in place as a plain step does (`asrfit.memory.engine`); each CPU "
        "kernel's scratch and workspace measured on this CPU once per shape "
        "(`asrfit.memory.cpu_kernels`). *Measured*: two real CPU training steps with no "
        "dispatch mode active, the second step's peak replayed from the c10 CPU allocator's "
        "profiler memory events (`bench/_truth.py`, checked against closed-form counts in "
        "`tests/test_memory_truth.py`; the parameters and buffers are copied to fresh storages "
        "inside the profile and the harness holds no reference to them, so a buffer that a "
        "module replaces in forward is freed as in a plain run; 8-bit AdamW is the real "
        "`bitsandbytes.optim.AdamW8bit`). The held-out cases (`bench/_heldout.py`) were written "
        "after the rules were final; the *diagnosis* cases are the steps used while writing "
        "them, reported apart in their own section. "
        + {"held": _HISTORY, "scale": _SCALE_NOTE}.get(split, "")
        + "Error = (predicted - measured) / measured. "
        "A case whose real step cannot run on this CPU is listed and left out of the figures.",
    ]
    if header_only:
        return "\n".join(lines)
    if not header:
        lines = []
    if group is not None:
        lines += ["", f"### {group.heading}"]
    lines += [
        "",
        "| case | predicted MiB | measured MiB | error |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        pred = "-" if r.predicted_bytes is None else f"{r.predicted_bytes / mib:.3f}"
        err = "failed" if r.error_pct is None else f"{r.error_pct:+.2f} %"
        meas = f"{r.measured_bytes / mib:.3f}" if r.measured_bytes else "-"
        lines.append(f"| {r.name} | {pred} | {meas} | {err} |")
    opening = group.summary if group is not None else "Held out ("
    opening = opening if opening.endswith("(") else opening + " "
    s_ = summary(rows)
    ok = sum(r.error_pct is not None for r in rows)
    lines += [
        "",
        f"{opening}{ok} of {len(rows)} cases compared): |error| median **{s_['median']:.2f} %**, "
        f"max **{s_['max']:.2f} %**, worst under-prediction **{s_['worst_under']:+.2f} %** "
        f"{_targets(split)}.",
    ]
    failed = [r for r in rows if r.failure]
    if failed:
        lines += ["", "Failed (simulation or real step):"] + [
            f"- {r.name}: `{r.failure}`" for r in failed
        ]
    return "\n".join(lines)
