"""The simulator against closed-form byte counts on tiny models.

The MLP below is sized so that every tensor is a multiple of 512 bytes (no rounding
slack): W1 is H x D floats, W2 is OUT x H, the input is B x D. Parameters, optimizer state
and gradients have exact closed forms; the step's peak is bounded by them plus the few
activation-sized tensors alive in backward.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asrfit.errors import ShapeError, UnsupportedModelError
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.trace.optimizers import BNB_BLOCK

B, D, H, OUT = 4, 256, 512, 128
W1_BYTES, W2_BYTES, BIAS_BYTES = H * D * 4, OUT * H * 4, OUT * 4
X_BYTES, HIDDEN_BYTES = B * D * 4, B * H * 4


def _mlp_adapter(bias: bool = False) -> StepAdapter:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(D, H, bias=False), nn.ReLU(), nn.Linear(H, OUT, bias=bias))

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(shape.batch_size, D)}

    def loss(model: nn.Module, kw: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(kw["x"]).sum()

    return StepAdapter("mlp", build, make_inputs, loss)


SHAPE = BatchShape(batch_size=B, input_length=D, label_length=1)


def test_sgd_momentum_step_matches_closed_form() -> None:
    r = simulate_step(_mlp_adapter(), SHAPE, Setup(optimizer="sgd"), target="cpu")
    params = W1_BYTES + W2_BYTES
    assert r.breakdown_bytes["parameters"] == params
    assert r.breakdown_bytes["optimizer_state"] == params  # one momentum buffer per parameter
    assert r.breakdown_bytes["gradients"] == params  # both gradients exist at the peak
    assert r.breakdown_bytes["inputs"] == X_BYTES
    floor = 3 * params + X_BYTES
    # Above the floor: at most the hidden activation and its gradient plus a few scalars.
    assert floor <= r.peak_bytes <= floor + 2 * HIDDEN_BYTES + 4 * 512
    assert sum(r.breakdown_bytes.values()) == r.peak_bytes
    # Forward 2BDH + 2BH*OUT; backward: layer 2 input and weight grads (2 x 2BH*OUT),
    # layer 1 weight grad only (the input needs no grad): 2BDH.
    assert r.flops == 4 * B * D * H + 6 * B * H * OUT
    assert r.optimizer_state_bytes == params


def test_first_step_lacks_optimizer_state() -> None:
    # A large batch puts the peak in backward (activations), where step 1 has no AdamW state yet.
    big = BatchShape(batch_size=2048, input_length=D, label_length=1)
    r = simulate_step(_mlp_adapter(), big, Setup(optimizer="adamw"), target="cpu")
    params = W1_BYTES + W2_BYTES
    # exp_avg and exp_avg_sq, and per parameter a 4-byte fp32 `step` scalar, which on a CPU
    # lives in the same memory (one 512-byte block each in the rounded breakdown)
    state = 2 * params + 2 * 512
    assert r.breakdown_bytes["optimizer_state"] == state
    assert r.peak_phase == "backward"
    first, second = r.step_peaks_bytes
    assert second - first == state  # the state made in step 1 is live through step 2


def test_without_the_optimizer_step_forward_and_backward_are_unchanged() -> None:
    """The planner's activation traces read forward and backward only; skipping the
    optimizer step leaves those phases, the FLOPs and their kernel rows as they were, and
    the step ends with the model alone live (parameters, no gradients)."""
    big = BatchShape(batch_size=64, input_length=D, label_length=1)
    setup = Setup(optimizer="sgd")
    full = simulate_step(_mlp_adapter(), big, setup, target="cpu", steps=1)
    short = simulate_step(_mlp_adapter(), big, setup, target="cpu", steps=1, optimizer_step=False)
    for phase in ("forward", "backward"):
        assert short.phase_peaks_bytes[phase] == full.phase_peaks_bytes[phase]
        assert short.cost.select((phase,)).rows == full.cost.select((phase,)).rows
    assert "optimizer" not in short.phase_peaks_bytes
    assert short.flops == full.flops == 64 * (4 * D * H + 6 * H * OUT)
    assert short.optimizer_state_bytes == 0
    assert short.cost.select(("optimizer",)).rows == []


def test_adamw_step_scalars_count_on_a_cpu_and_not_on_a_gpu() -> None:
    # PyTorch keeps AdamW's `step` on the host for CUDA parameters: not GPU memory; on a
    # CPU target the host is the device. 2 parameters: 2 x 4 bytes, in the raw peak.
    big = BatchShape(batch_size=2048, input_length=D, label_length=1)
    setup = Setup(optimizer="adamw")
    cpu = simulate_step(_mlp_adapter(), big, setup, target="cpu")
    gpu = simulate_step(_mlp_adapter(), big, setup, target="cuda")
    assert gpu.breakdown_bytes["optimizer_state"] == 2 * (W1_BYTES + W2_BYTES)
    assert (
        cpu.breakdown_bytes["optimizer_state"] - gpu.breakdown_bytes["optimizer_state"] == 2 * 512
    )


def test_adamw8bit_state_follows_bitsandbytes_layout() -> None:
    r = simulate_step(_mlp_adapter(bias=True), SHAPE, Setup(optimizer="adamw8bit"), target="cpu")
    big = (H * D, OUT * H)  # >= 4096 elements: two uint8 states + two fp32 absmax per 256-block
    expected = sum(2 * n + 2 * 4 * (n // BNB_BLOCK) for n in big)
    expected += 2 * 4 * OUT  # the bias (128 elements) keeps two fp32 states
    expected += 2 * 256 * 4  # one shared pair of 256-entry fp32 quantisation maps (qmap1/qmap2)
    assert r.breakdown_bytes["optimizer_state"] == expected


def test_ctc_labels_longer_than_frames_is_a_clear_error() -> None:
    from transformers import Wav2Vec2Config

    cfg = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(8,),
        conv_stride=(5,),
        conv_kernel=(10,),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        vocab_size=8,
    )
    cfg.architectures = ["Wav2Vec2ForCTC"]
    with pytest.raises(ShapeError, match="CTC needs at least one frame per label"):
        simulate_step(hf_adapter(cfg), BatchShape(1, 100, 50))


def test_unsupported_config_names_class_and_supported_list() -> None:
    from transformers import BertConfig

    with pytest.raises(UnsupportedModelError, match="Wav2Vec2ForCTC"):
        hf_adapter(BertConfig())


def test_known_mask_gives_exact_masked_select_size() -> None:
    """Value propagation: a mask with 3 of 8 True selects 3 elements, not 8."""

    def build() -> nn.Module:
        return nn.Linear(1, 1, bias=False)

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from asrfit.memory.models.adapters import fake_with_value

        with unset_fake_temporarily():
            real = torch.tensor([1, 0, 0, 1, 0, 1, 0, 0], dtype=torch.bool)
        return {"mask": fake_with_value(tracker, real), "x": torch.randn(8, 1024)}

    seen: list[int] = []

    def loss(model: nn.Module, kw: dict[str, torch.Tensor]) -> torch.Tensor:
        idx = kw["mask"].nonzero().squeeze(1)
        seen.append(idx.shape[0])
        return model(kw["x"][idx].sum(1, keepdim=True)).sum()

    r = simulate_step(
        StepAdapter("masked", build, make_inputs, loss), BatchShape(1, 1, 1), Setup(optimizer="sgd")
    )
    assert seen == [3, 3]
    assert r.assumptions == []


def test_builds_without_initialisers_trace_the_same_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator builds models with torch.nn.init's initialisers skipped (fake parameters
    have no values). Whisper ties its output projection to the token embedding inside
    ``init_weights``: the tie must survive, and the step must equal one built with them."""
    import transformers

    from asrfit.memory import simulate

    cfg = transformers.WhisperConfig(
        vocab_size=1024, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50, max_target_positions=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    cfg.architectures = ["WhisperForConditionalGeneration"]
    shape = BatchShape(2, 100, 8)
    skipped = simulate_step(hf_adapter(cfg), shape, Setup(), steps=1)
    assert torch.nn.init.normal_.__name__ == "normal_"  # restored after the build
    monkeypatch.setattr(simulate, "_no_init_kernels", torch.no_grad)  # initialisers run
    with_init = simulate_step(hf_adapter(cfg), shape, Setup(), steps=1)
    assert skipped.peak_bytes == with_init.peak_bytes
    assert skipped.breakdown_bytes == with_init.breakdown_bytes
    assert skipped.optimizer_state_bytes == with_init.optimizer_state_bytes
    # tied: the 1024 x 32 embedding counted once (untied would add 128 KiB; block rounding < 32 KiB)
    params = sum(p.numel() for p in transformers.WhisperForConditionalGeneration(cfg).parameters())
    assert 4 * params <= skipped.breakdown_bytes["parameters"] < 4 * params + 4 * 1024 * 32 // 2


def _scaled_adapter(scale_as_tensor: bool) -> StepAdapter:
    """loss = (W x * 0.5).sum(), the 0.5 a Python number or a 0-dim float64 input tensor."""

    def build() -> nn.Module:
        return nn.Linear(D, H, bias=False)

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, object]:
        scale = torch.tensor(0.5, dtype=torch.float64) if scale_as_tensor else 0.5
        return {"x": torch.randn(shape.batch_size, D), "scale": scale}

    def loss(model: nn.Module, kw: dict) -> torch.Tensor:
        return (model(kw["x"]) * kw["scale"]).sum()

    return StepAdapter("scaled", build, make_inputs, loss)


def test_a_python_number_saved_by_autograd_counts_on_a_cpu() -> None:
    # `y * 0.5` wraps 0.5 in an 8-byte tensor below the dispatcher and MulBackward keeps it
    # until backward: on a CPU the step holds the same bytes as with an explicit 0-dim
    # float64 tensor (an input, live all step); on a GPU the wrapped number is host memory.
    setup = Setup(optimizer="sgd")
    number = simulate_step(_scaled_adapter(False), SHAPE, setup, target="cpu")
    tensor = simulate_step(_scaled_adapter(True), SHAPE, setup, target="cpu")
    assert number.peak_phase == tensor.peak_phase == "backward"
    assert number.peak_raw_bytes == tensor.peak_raw_bytes
    on_gpu = simulate_step(_scaled_adapter(False), SHAPE, setup, target="cuda")
    assert number.peak_raw_bytes - on_gpu.peak_raw_bytes == 8


def test_device_queries_answered_in_the_outermost_mode_trace_the_same_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``tensor.device`` of a fake tensor is a ``prim.device`` op that asrfit's dispatch modes
    now answer themselves instead of passing it down the mode stack: the step (peaks, every
    category, FLOPs, every kernel row) must be what the full stack gives, with SpecAugment's
    host-side spans, fp16 loss scaling and checkpointing's recompute in it; and it must be
    the same trace twice (the spans are drawn with a fixed seed)."""
    import transformers

    from asrfit.memory.trace import tracker as tracker_module
    from asrfit.memory.trace import values

    cfg = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, mask_time_prob=0.3,
        mask_time_length=2, mask_feature_prob=0.2, mask_feature_length=4,
    )  # fmt: skip
    cfg.architectures = ["Wav2Vec2ForCTC"]
    shape, setup = BatchShape(3, 16_000, 10), Setup(precision="fp16", gradient_checkpointing=True)
    seen: list[int] = []
    dispatch = tracker_module.StorageTracker.__torch_dispatch__

    def counting(self: object, func: object, *rest: object) -> object:
        seen.append(func is values.PRIM_DEVICE)
        return dispatch(self, func, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(tracker_module.StorageTracker, "__torch_dispatch__", counting)
    results = {}
    for shortcut in (False, True, True):
        monkeypatch.setattr(values, "shortcut_device_queries", shortcut)
        seen.clear()
        results.setdefault(shortcut, []).append(
            (simulate_step(hf_adapter(cfg), shape, setup, target="cuda"), sum(seen), len(seen))
        )
    ((full, asked_full, ops_full),) = results[False]
    (short, asked_short, ops_short), (again, _, _) = results[True]
    assert asked_full > ops_full / 3  # device queries are a large share of the ops...
    assert asked_short < asked_full / 10  # ... and few reach the tracker now
    for a in (short, again):
        assert a.peak_bytes == full.peak_bytes and a.peak_raw_bytes == full.peak_raw_bytes
        assert a.phase_peaks_bytes == full.phase_peaks_bytes
        assert a.breakdown_bytes == full.breakdown_bytes
        assert a.step_peaks_bytes == full.step_peaks_bytes
        assert a.flops == full.flops
        assert a.cost.rows == full.cost.rows
        assert a.traced_calls == full.traced_calls


@pytest.mark.parametrize(
    ("family", "precision", "freeze"),
    [("wav2vec2", "fp16", True), ("wav2vec2", "fp32", False), ("whisper", "pure_bf16", False)],
)
def test_the_optimizer_step_alone_is_the_full_steps_optimizer_phase(
    family: str, precision: str, freeze: bool
) -> None:
    """The planner's optimizer-state traces skip forward and backward: each trainable parameter
    gets a gradient of its own shape, as backward leaves it. The optimizer phase's peak, the
    state, the parameters and the optimizer's kernel rows must be the full step's."""
    import transformers

    if family == "wav2vec2":
        cfg = transformers.Wav2Vec2Config(
            vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, mask_time_prob=0.3,
            mask_time_length=2,
        )  # fmt: skip
        cfg.architectures, shape = ["Wav2Vec2ForCTC"], BatchShape(1, 16_000, 1)
    else:
        cfg = transformers.WhisperConfig(
            vocab_size=1024, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=50,
            max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1,
        )  # fmt: skip
        cfg.architectures, shape = ["WhisperForConditionalGeneration"], BatchShape(1, 100, 1)
    for optimizer in ("adamw", "adafactor", "adamw8bit"):
        setup = Setup(precision=precision, optimizer=optimizer, freeze_feature_encoder=freeze)
        full = simulate_step(hf_adapter(cfg), shape, setup, steps=1)
        alone = simulate_step(hf_adapter(cfg), shape, setup, steps=1, forward_backward=False)
        assert alone.phase_peaks_bytes["optimizer"] == full.phase_peaks_bytes["optimizer"]
        assert alone.phase_peaks_bytes.get("zero_grad") == full.phase_peaks_bytes.get("zero_grad")
        assert alone.optimizer_state_bytes == full.optimizer_state_bytes > 0
        assert alone.breakdown_bytes["parameters"] == full.breakdown_bytes["parameters"]
        phases = ("optimizer", "zero_grad")
        assert alone.cost.select(phases).rows == full.cost.select(phases).rows
        assert "forward" not in alone.phase_peaks_bytes and alone.flops == 0


V, E = 4096, 64  # a tied vocabulary matrix large enough to hold most of the model


def _tied_adapter() -> StepAdapter:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(V, E)
            self.mix = nn.Linear(E, E)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            hidden = torch.tanh(self.mix(self.embed(tokens)))
            return hidden @ self.embed.weight.t()  # the head shares the embedding (Whisper)

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        return {"tokens": torch.randint(0, V, (shape.batch_size, shape.input_length))}

    def loss(model: nn.Module, kw: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(kw["tokens"]).float().logsumexp(-1).sum()

    return StepAdapter("tied", Tied, make_inputs, loss)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_tied_weights_gradient_is_one_storage_in_the_breakdown(optimizer: str) -> None:
    # its two contributions are summed in place (asrfit.memory.trace.engine): one storage, which is
    # the gradient; the breakdown must neither go negative nor count it twice
    r = simulate_step(
        _tied_adapter(), BatchShape(8, 32, 1), Setup(optimizer=optimizer), target="cpu"
    )
    params = (V * E + E * E + E) * 4
    assert all(v >= 0 for v in r.breakdown_bytes.values()), r.breakdown_bytes
    assert r.breakdown_bytes["gradients"] <= params + 3 * 512
    assert sum(r.breakdown_bytes.values()) == r.peak_bytes
