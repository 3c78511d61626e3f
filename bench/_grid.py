"""The memory-accuracy grid, and the real training step it is checked against.

Shared by ``bench/memory_accuracy.py`` (CPU), ``bench/validate_gpu.py`` (CUDA) and
``tests/test_memory_accuracy_smoke.py``.

A :class:`Case` is one tiny model (hidden 64, 2 layers), one setup (precision,
checkpointing, optimizer) and one padded batch shape. :func:`run_real_step` runs the step
the simulator traces, on real tensors, exactly as :func:`asrfit.memory.simulate.simulate_step`
drives it: same model class and config (SDPA attention, ``model.train()``), the feature
encoder frozen, non-reentrant activation checkpointing, the optimizer from
:func:`asrfit.memory.trace.optimizers.make_optimizer`, ``torch.autocast("cpu", bfloat16)`` around
forward and loss, the same label values (seeded ``randint`` in ``[1, vocab - 1)``, no
padding) and two steps (forward, loss, backward, ``optimizer.step()``,
``zero_grad(set_to_none=True)``), of which the second is measured.

The measurement is independent of the simulator's tracker. On CPU it is PyTorch's own
allocator accounting: ``torch.profiler.profile(profile_memory=True)`` records every CPU
allocator allocation and free (``[memory]`` events with signed byte counts) over both
steps; replaying them in time order on top of the bytes live before the profiled region
(the parameters and buffers, summed by storage) gives the bytes live at every instant, and
the peak is taken inside the second step. On CUDA it is ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn
from torch.autograd import DeviceType

from asrfit.memory.models.adapters import padded_attention_mask
from asrfit.memory.real_step import float_dtype
from asrfit.memory.setup import OptimizerKind, Precision, Setup
from asrfit.memory.simulate import default_dtype
from asrfit.memory.step import BatchShape
from asrfit.memory.trace.optimizers import make_optimizer
from bench._report import write_section  # noqa: F401  (re-exported for the grid scripts)
from bench._truth import storage_bytes

SAMPLE_RATE = 16_000
MEL_FRAMES_PER_SECOND = 100
_STEP_MARK = "asrfit_bench_step_{}"


# -- tiny configs ------------------------------------------------------------------------


def _wav2vec2_like(config_cls: type, class_name: str, **extra: Any) -> Any:
    config = config_cls(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=32,
        pad_token_id=0,
        layerdrop=0.0,  # a real run skips layers at random; the simulator never does
        **extra,
    )
    config.architectures = [class_name]
    return config


def _parakeet_encoder() -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "subsampling_conv_channels": 32,
        "num_mel_bins": 80,
        "layerdrop": 0.0,
    }


def _config(arch: str) -> Any:
    """A fresh tiny transformers config of ``arch`` (see :data:`ARCHITECTURES`)."""
    if arch == "wav2vec2":
        # The XLS-R layout: layer-normed conv encoder with an attention mask, pre-LN blocks.
        return _wav2vec2_like(
            transformers.Wav2Vec2Config,
            "Wav2Vec2ForCTC",
            feat_extract_norm="layer",
            do_stable_layer_norm=True,
        )
    if arch == "hubert":
        # The base layout: group-normed conv encoder, no attention mask, post-LN blocks.
        return _wav2vec2_like(transformers.HubertConfig, "HubertForCTC", feat_extract_norm="group")
    if arch == "wavlm":
        return _wav2vec2_like(
            transformers.WavLMConfig,
            "WavLMForCTC",
            feat_extract_norm="layer",
            do_stable_layer_norm=True,
            num_buckets=32,
            max_bucket_distance=100,
        )
    if arch == "whisper":
        config = transformers.WhisperConfig(
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_mel_bins=80,
            max_source_positions=100,  # 2 s of log-mel input (Whisper pads to this)
            max_target_positions=64,
            vocab_size=128,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            encoder_layerdrop=0.0,
            decoder_layerdrop=0.0,
        )
        config.architectures = ["WhisperForConditionalGeneration"]
        return config
    if arch == "parakeet-ctc":
        config = transformers.ParakeetCTCConfig(
            vocab_size=64, pad_token_id=63, encoder_config=_parakeet_encoder()
        )
        config.architectures = ["ParakeetForCTC"]
        return config
    if arch == "parakeet-tdt":
        config = transformers.ParakeetTDTConfig(
            vocab_size=64,
            blank_token_id=63,
            pad_token_id=63,
            decoder_hidden_size=64,
            encoder_config=_parakeet_encoder(),
        )
        config.architectures = ["ParakeetForTDT"]
        return config
    if arch == "wav2vec2-base":  # base size, for the GPU out-of-memory boundary
        config = transformers.Wav2Vec2Config(vocab_size=32, pad_token_id=0, layerdrop=0.0)
        config.architectures = ["Wav2Vec2ForCTC"]
        return config
    if arch == "whisper-base":
        config = transformers.WhisperConfig(
            d_model=512,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=2048,
            decoder_ffn_dim=2048,
            vocab_size=51865,
            encoder_layerdrop=0.0,
            decoder_layerdrop=0.0,
        )
        config.architectures = ["WhisperForConditionalGeneration"]
        return config
    known = ", ".join((*ARCHITECTURES, "wav2vec2-base", "whisper-base"))
    raise ValueError(f"unknown architecture {arch!r}; use one of {known}.")


ARCHITECTURES = ("wav2vec2", "hubert", "wavlm", "whisper", "parakeet-ctc", "parakeet-tdt")

# Two batch shapes per architecture: (batch_size, seconds, label_length).
_SHAPES = ((1, 1.0, 8), (3, 2.0, 12))


# -- the grid ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One grid point: a tiny model, a setup and a padded batch shape."""

    arch: str
    precision: str
    checkpointing: bool
    optimizer: str
    batch_size: int
    seconds: float
    label_length: int

    @property
    def name(self) -> str:
        """A short label, e.g. ``wav2vec2 bf16+ckpt adamw 3x2.0s``."""
        return f"{self.arch} {self.setup.describe()} {self.batch_size}x{self.seconds:g}s"

    @property
    def setup(self) -> Setup:
        """The simulator's setup for this case."""
        return Setup(
            precision=Precision(self.precision),
            gradient_checkpointing=self.checkpointing,
            optimizer=OptimizerKind(self.optimizer),
        )

    @property
    def input_length(self) -> int:
        """Model-input steps: audio samples (wav2vec2 family) or log-mel frames."""
        if self.arch.startswith(("parakeet", "whisper")):
            return round(self.seconds * MEL_FRAMES_PER_SECOND)
        return round(self.seconds * SAMPLE_RATE)

    @property
    def batch(self) -> BatchShape:
        """The simulator's batch shape for this case."""
        return BatchShape(self.batch_size, self.input_length, self.label_length)

    def config(self) -> Any:
        """A fresh transformers config (the simulator and the real run must not share one)."""
        return _config(self.arch)


def grid() -> list[Case]:
    """The benchmark grid: 6 architectures x 5 setups/shapes = 30 cases.

    The full product (6 x 2 precisions x 2 checkpointing x 2 optimizers x 2 shapes = 96)
    is too slow for a 2-core CPU, so each architecture takes 5 points of the half fraction
    ``shape = precision xor checkpointing xor optimizer`` of the 2^4 design, rotated per
    architecture, so that every factor is seen both ways by every architecture and the
    pairs of factors are balanced across the grid. The second optimizer alternates between
    Adafactor and SGD (momentum) across architectures.
    """
    half_fraction = []
    for p in (0, 1):
        for c in (0, 1):
            for o in (0, 1):
                half_fraction.append((p, c, o, p ^ c ^ o))
    cases = []
    for i, arch in enumerate(ARCHITECTURES):
        other_optimizer = "adafactor" if i % 2 == 0 else "sgd"
        for j in range(5):
            p, c, o, s = half_fraction[(3 * i + j) % len(half_fraction)]
            batch_size, seconds, labels = _SHAPES[s]
            cases.append(
                Case(
                    arch=arch,
                    precision=("fp32", "bf16")[p],
                    checkpointing=bool(c),
                    optimizer=("adamw", other_optimizer)[o],
                    batch_size=batch_size,
                    seconds=seconds,
                    label_length=labels,
                )
            )
    return cases


# -- the real step -------------------------------------------------------------------------


@dataclass
class RealStep:
    """A real training step's measured memory.

    Attributes:
        peak_bytes: Peak bytes live during the second step (CPU: allocator bytes replayed
            from the profiler; CUDA: ``max_memory_allocated``).
        reserved_bytes: CUDA only: ``max_memory_reserved`` over the second step (else 0).
        start_bytes: Bytes live when the second step starts (by the same measurement).
        model_state_bytes: Parameters, buffers and optimizer state at that instant, summed
            by storage (``untyped_storage().nbytes()``, deduplicated).
        num_params: Parameters of the model (all, trainable or not).
        num_trainable_params: Parameters the optimizer updates.
        seconds: Wall time of the two steps (with the profiler on CPU).
    """

    peak_bytes: int
    reserved_bytes: int
    start_bytes: int
    model_state_bytes: int
    num_params: int
    num_trainable_params: int
    seconds: float

    @property
    def leftover_bytes(self) -> int:
        """Bytes live at the second step's start beyond the model states (caches, leaks)."""
        return self.start_bytes - self.model_state_bytes


def build_real_model(case: Case, device: str = "cpu") -> nn.Module:
    """The real model of ``case``: SDPA attention, frozen conv encoder, checkpointing, train mode."""
    config = case.config()
    cls = getattr(transformers, config.architectures[0])
    if getattr(cls, "_supports_sdpa", False):
        config._attn_implementation = "sdpa"  # as training loads models (and the simulator)
    torch.manual_seed(0)
    with default_dtype(float_dtype(case.setup)):
        model = cls(config)
    if hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    if case.checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # the name earlier 5.x releases use (5.17 on the GPU machine)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.to(device)
    model.train()
    return model


def make_real_inputs(case: Case, config: Any, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Real inputs of the shapes and label values the simulator's adapter declares.

    Labels are ``randint(1, vocab - 1)`` from a generator seeded with 0 (no padding); masks
    are the adapter's padded-batch mask; audio and features are standard normal noise.
    """
    b, n, u = case.batch_size, case.input_length, case.label_length
    dtype = float_dtype(case.setup)
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(1, max(2, config.vocab_size - 1), (b, u), generator=gen)
    if case.arch.startswith("whisper"):
        feats = torch.randn(b, config.num_mel_bins, 2 * config.max_source_positions, dtype=dtype)
        inputs = {"input_features": feats, "labels": labels}
    elif case.arch.startswith("parakeet"):
        mel_bins = config.encoder_config.num_mel_bins
        inputs = {
            "input_features": torch.randn(b, n, mel_bins, dtype=dtype),
            "attention_mask": padded_attention_mask(b, n),
            "labels": labels,
        }
        if case.arch == "parakeet-tdt":
            start = torch.full((b, 1), config.blank_token_id, dtype=torch.long)
            inputs["decoder_input_ids"] = torch.cat([start, labels], dim=1)
    else:
        inputs = {"input_values": torch.randn(b, n, dtype=dtype)}
        if config.feat_extract_norm == "layer":
            inputs["attention_mask"] = padded_attention_mask(b, n)
        inputs["labels"] = labels
    return {k: v.to(device) for k, v in inputs.items()}


def _autocast(case: Case, device: str) -> contextlib.AbstractContextManager:
    if case.setup.precision is Precision.BF16:
        return torch.autocast(device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _optimizer_tensors(optimizer: torch.optim.Optimizer, device: str) -> list[torch.Tensor]:
    """Optimizer state on ``device`` (AdamW keeps its step counters on the CPU for CUDA)."""
    return [
        v
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.device.type == device
    ]


def _train_step(
    case: Case,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: str,
    step: int,
    inputs: dict[str, torch.Tensor] | None = None,
) -> None:
    """One step in the simulator's order: inputs, forward+loss, backward, drop, step, zero.

    ``inputs``: a batch already on ``device`` (made afresh, on the CPU and copied, if None).
    """
    with torch.profiler.record_function(_STEP_MARK.format(step)):
        if inputs is None:
            inputs = make_real_inputs(case, model.config, device)
        with _autocast(case, device):
            loss = model(**inputs).loss
        loss.backward()
        del loss, inputs
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _replay_cpu_profile(prof: Any, base_bytes: int) -> tuple[int, int]:
    """(peak bytes live during step 2, bytes live at its start) from the ``[memory]`` events."""
    events = list(prof.profiler.kineto_results.events())
    mark = _STEP_MARK.format(2)
    step2 = [e for e in events if e.name() == mark]
    if len(step2) != 1:
        raise RuntimeError(f"expected one {mark!r} range in the profile, found {len(step2)}.")
    start_ns, end_ns = step2[0].start_ns(), step2[0].end_ns()
    memory = [
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(events)
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    memory.sort()
    live = base_bytes
    at_start = None
    peak = 0
    for t_ns, _, nbytes in memory:
        if t_ns >= start_ns and at_start is None:
            at_start = live
        live += nbytes
        if start_ns <= t_ns <= end_ns:
            peak = max(peak, live)
    return peak, base_bytes if at_start is None else at_start


def run_real_step(case: Case, device: str = "cpu") -> RealStep:
    """Run ``case``'s two training steps for real and measure the second one.

    Args:
        case: The grid point.
        device: "cpu" (profiler replay) or "cuda" (``max_memory_allocated``).

    Returns:
        The measured peak and the bytes around it.
    """
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    before_bytes = torch.cuda.memory_allocated() if device == "cuda" else 0
    model = build_real_model(case, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(case.setup, params)
    all_params = list(model.parameters())
    base_bytes = storage_bytes([*all_params, *model.buffers()])
    started = time.perf_counter()
    if device == "cpu":
        activities = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
            _train_step(case, model, optimizer, device, 1)
            model_state_bytes = storage_bytes(
                [*all_params, *model.buffers(), *_optimizer_tensors(optimizer, device)]
            )
            _train_step(case, model, optimizer, device, 2)
        seconds = time.perf_counter() - started
        peak, start_bytes = _replay_cpu_profile(prof, base_bytes)
        reserved = 0
    else:
        _train_step(case, model, optimizer, device, 1)
        torch.cuda.synchronize()
        model_state_bytes = storage_bytes(
            [*all_params, *model.buffers(), *_optimizer_tensors(optimizer, device)]
        )
        start_bytes = torch.cuda.memory_allocated() - before_bytes
        torch.cuda.reset_peak_memory_stats()
        _train_step(case, model, optimizer, device, 2)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() - before_bytes
        reserved = torch.cuda.max_memory_reserved()
    num_params = sum(p.numel() for p in all_params)
    num_trainable = sum(p.numel() for p in params)
    del model, optimizer, params, all_params
    return RealStep(
        peak_bytes=peak,
        reserved_bytes=reserved,
        start_bytes=start_bytes,
        model_state_bytes=model_state_bytes,
        num_params=num_params,
        num_trainable_params=num_trainable,
        seconds=seconds,
    )


# -- baselines -----------------------------------------------------------------------------


def seed_estimate_bytes(num_params: int, batch_size: int, optimizer: str) -> int:
    """The seed documents' rule: activations per sample are 10% of the model's memory.

    ``param_bytes = 4 * params``; model states are ``2 * param_bytes`` (weights and
    gradients) plus ``8 * params`` for AdamW; activations are ``0.1 * param_bytes *
    batch_size``. Precision, checkpointing, sequence length and the architecture are ignored.
    """
    param_bytes = 4 * num_params
    states = 2 * param_bytes + (8 * num_params if optimizer == "adamw" else 0)
    return round(states + 0.1 * param_bytes * batch_size)


def model_states_estimate_bytes(num_params: int) -> int:
    """``accelerate estimate-memory``'s training figure: 16 bytes per parameter.

    Weights, gradients and Adam's two moments in fp32, whatever the optimizer and
    precision; no activations.
    """
    return 16 * num_params


# -- docs/benchmarks.md sections -------------------------------------------------------


def environment_line() -> str:
    """Date, machine, core count and library versions, for a benchmark's header."""
    return (
        f"{datetime.date.today().isoformat()}, {platform.machine()} {platform.system()}, "
        f"nproc={len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
