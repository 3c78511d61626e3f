"""asrfit's built-in Conformer-CTC: the model, its registration, profile and simulation.

References are independent of the code under test: parameter counts written out by hand from
the layer shapes, output lengths read off real logits, each utterance run alone against the
padded batch, per-utterance CTC losses from ``torch.nn.functional.ctc_loss(reduction="none")``,
hand-made logits for greedy decoding, real instantiations, and a real CPU training step whose
peak is taken from PyTorch's own allocator events (``torch.profiler`` memory events), as in
``bench/_grid.py``.
"""

from __future__ import annotations

import importlib
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoConfig, AutoModelForCTC

from asrfit.errors import ConfigError, ShapeError
from asrfit.memory.models.adapters import hf_adapter, padded_attention_mask
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.trace.optimizers import make_optimizer
from asrfit.models.conformer import (
    CONFORMER_SIZES,
    ConformerCTCConfig,
    ConformerForCTC,
    conformer_config,
    ctc_greedy,
)
from asrfit.models.conformer.decoder import teacher_forcing
from asrfit.profiles.model import ModelProfile
from asrfit.profiles.registry import get_bundled

TINY = dict(
    vocab_size=10,
    num_mel_bins=13,
    d_model=32,
    encoder_layers=2,
    encoder_attention_heads=4,
    ffn_mult=2,
    conv_kernel_size=5,
    subsampling_factor=4,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**overrides) -> ConformerCTCConfig:
    return ConformerCTCConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> ConformerForCTC:
    torch.manual_seed(seed)
    return ConformerForCTC(tiny(**overrides))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ parameter counts


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def layer_norm(d: int) -> int:
    return 2 * d


def test_tiny_parameter_count_matches_hand_count():
    d, m, k, vocab = 32, 2, 5, 10
    # Subsampling: two 3x3 stride-2 convs (1 -> d -> d channels); 13 mel bins -> 7 -> 4.
    subsampling = (9 * d + d) + (9 * d * d + d) + linear(d * 4, d)
    ffn = layer_norm(d) + linear(d, m * d) + linear(m * d, d)
    attention = layer_norm(d) + linear(d, d) + linear(d, 2 * d) + linear(d, d)  # q, kv, out
    conv = layer_norm(d) + linear(d, 2 * d) + (d * k + d) + layer_norm(d) + linear(d, d)
    block = 2 * ffn + attention + conv + layer_norm(d)
    expected = subsampling + 2 * block + linear(d, vocab)
    assert expected == 46_730  # 320 + 9248 + 4128 + 2 * 16352 + 330, added up by hand
    assert n_params(tiny_model()) == expected

    # A one-layer decoder: tokens, 16 positions, self- and cross-attention, FFN, norm, head;
    # its vocabulary is the 10 CTC classes plus its own <sos/eos>.
    decoder = (
        (vocab + 1) * d + 16 * d + (2 * attention + ffn) + layer_norm(d) + linear(d, vocab + 1)
    )
    model = tiny_model(decoder_layers=1, max_target_positions=16)
    assert n_params(model) == expected + decoder == 60_853


def test_fewer_subsampling_channels_match_hand_count():
    d, c = 32, 8  # subsampling convs 1 -> 8 -> 8 channels; 13 mel bins -> 7 -> 4
    full = n_params(tiny_model())
    fewer = n_params(tiny_model(subsampling_conv_channels=c))
    before = (9 * d + d) + (9 * d * d + d) + linear(d * 4, d)
    after = (9 * c + c) + (9 * c * c + c) + linear(c * 4, d)
    assert full - fewer == before - after == 13_696 - 1_720  # 80 + 584 + 1,056 by hand


# ------------------------------------------------------------------ shapes and masking


@pytest.mark.parametrize("factor", [4, 8])
def test_output_lengths_match_real_logits(factor):
    model = tiny_model(subsampling_factor=factor).eval()
    lengths = [1, 2, 3, 5, 8, 9, 16, 17, 31, 33, 101]
    with torch.no_grad():
        for n in lengths:
            frames = model(torch.randn(1, n, 13)).logits.shape[1]
            assert model.output_lengths(torch.tensor([n])).tolist() == [frames], n
            assert model.config.output_frames(n) == frames, n
    # Hand values: each stage halves, rounding up.
    assert [tiny(subsampling_factor=4).output_frames(n) for n in (1, 5, 8, 9, 101)] == [
        1,
        2,
        2,
        3,
        26,
    ]
    assert [tiny(subsampling_factor=8).output_frames(n) for n in (9, 17, 101)] == [2, 3, 13]


def test_padding_does_not_change_real_frames():
    model = tiny_model(decoder_layers=1).eval()
    lengths = [37, 50, 23]
    torch.manual_seed(1)
    utterances = [torch.randn(n, 13) for n in lengths]
    labels = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 2]])
    batch = torch.full((3, 50, 13), 1e3)  # padding holds large garbage, not zeros
    mask = torch.zeros(3, 50, dtype=torch.long)
    for i, u in enumerate(utterances):
        batch[i, : len(u)] = u
        mask[i, : len(u)] = 1
    with torch.no_grad():
        out = model(batch, attention_mask=mask, labels=labels)
        for i, u in enumerate(utterances):
            alone = model(u[None], labels=labels[i : i + 1])
            frames = alone.logits.shape[1]
            assert out.output_lengths[i].item() == frames
            torch.testing.assert_close(out.logits[i, :frames], alone.logits[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(
                out.decoder_logits[i], alone.decoder_logits[0], atol=1e-5, rtol=0
            )


# ------------------------------------------------------------------ loss and gradients


def test_ctc_loss_is_mean_of_per_token_utterance_losses():
    model = tiny_model().eval()
    feats = torch.randn(2, 40, 13)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, 25:] = 0
    labels = torch.tensor([[1, 2, 3, 4], [5, 6, -100, -100]])
    with torch.no_grad():
        out = model(feats, attention_mask=mask, labels=labels)
    log_probs = out.logits.log_softmax(-1).transpose(0, 1)
    per_utt = F.ctc_loss(
        log_probs,
        torch.tensor([1, 2, 3, 4, 5, 6]),
        torch.tensor([10, 7]),  # ceil(ceil(40/2)/2), ceil(ceil(25/2)/2)
        torch.tensor([4, 2]),
        blank=0,
        reduction="none",
    )
    expected = (per_utt[0] / 4 + per_utt[1] / 2) / 2
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(out.loss, expected)


def _grads(model: ConformerForCTC, feats, mask, labels) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(feats, attention_mask=mask, labels=labels).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_model(dropout=0.0, decoder_layers=1).train()  # checkpointing acts in training
    feats = torch.randn(2, 30, 13)
    mask = padded_attention_mask(2, 30)
    labels = torch.tensor([[1, 2, 3], [4, 5, -100]])
    plain = _grads(model, feats, mask, labels)
    assert all(torch.isfinite(g).all() for g in plain.values())

    calls = []
    # A pre-hook: the recompute stops early once it has the saved tensors, skipping post-hooks.
    model.encoder.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renamed the method
        model.gradient_checkpointing_enable()
    assert model.encoder.gradient_checkpointing and model.decoder.gradient_checkpointing
    checkpointed = _grads(model, feats, mask, labels)
    assert len(calls) == 2  # the block ran again in backward: it was really checkpointed
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_teacher_forcing_by_hand():
    labels = torch.tensor([[3, 4, -100], [5, -100, -100], [1, 2, 6]])
    inputs, targets = teacher_forcing(labels, bos_token_id=9, eos_token_id=8)
    assert inputs.tolist() == [[9, 3, 4, 8], [9, 5, 8, 8], [9, 1, 2, 6]]
    assert targets.tolist() == [[3, 4, 8, -100], [5, 8, -100, -100], [1, 2, 6, 8]]


def test_decoder_variant_trains():
    model = tiny_model(decoder_layers=1, dropout=0.0, ctc_weight=0.5).train()
    assert model.config.bos_token_id == model.config.eos_token_id == 10  # after the CTC classes
    torch.manual_seed(2)
    feats = torch.randn(2, 40, 13)
    labels = torch.tensor([[1, 2, 3, 4], [5, 6, 7, -100]])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        out = model(feats, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert out.decoder_logits.shape == (2, 5, 11)  # bos + 4 labels; 10 classes + <sos/eos>
    torch.testing.assert_close(out.loss, 0.5 * out.ctc_loss + 0.5 * out.decoder_loss)
    assert losses[-1] < 0.5 * losses[0], losses


def test_intermediate_ctc_joins_the_heads_loss_on_an_earlier_block():
    """The loss against F.ctc_loss on the final logits and on the head applied to block 1's
    output, read by a forward hook (Wav2Vec2's "mean": per-utterance loss over its labels)."""
    torch.manual_seed(3)
    feats, mask = torch.randn(2, 40, 13), torch.ones(2, 40, dtype=torch.long)
    mask[1, 30:] = 0
    labels = torch.tensor([[1, 2, 3, 4], [5, 6, 7, -100]])
    plain = tiny_model(dropout=0.0).eval()
    model = tiny_model(dropout=0.0, intermediate_ctc_layer=1, intermediate_ctc_weight=0.25).eval()
    model.load_state_dict(plain.state_dict())  # the option adds no parameter
    seen = []
    model.encoder.layers[0].register_forward_hook(lambda _m, _i, out: seen.append(out))

    def ctc(logits, lengths):
        log_probs = torch.log_softmax(logits.float(), -1).transpose(0, 1)
        kept = labels >= 0
        return torch.nn.functional.ctc_loss(
            log_probs, labels[kept], lengths, kept.sum(-1), blank=0, zero_infinity=True
        )

    out = model(feats, attention_mask=mask, labels=labels)
    lengths = out.output_lengths
    final, inter = ctc(out.logits, lengths), ctc(model.ctc_head(seen[0]), lengths)
    torch.testing.assert_close(out.loss, 0.75 * final + 0.25 * inter)
    assert out.ctc_loss is out.loss and not torch.isclose(final, inter)
    base = plain(feats, attention_mask=mask, labels=labels)
    torch.testing.assert_close(base.loss, final)  # 0: the final loss alone
    torch.testing.assert_close(base.logits, out.logits)
    assert model(feats, attention_mask=mask).loss is None  # no labels, no loss
    # the encoder hands back block 1's output only when asked (the forward asks given labels)
    assert model.encoder(feats)[2] is None
    torch.testing.assert_close(model.encoder(feats, keep_layer=1)[2], seen[-1])


def test_decoder_end_token_never_collides_with_a_character():
    # vocab_size 10: the CTC classes are 0..9, id 9 a real character. <sos/eos> is id 10.
    model = tiny_model(decoder_layers=1, dropout=0.0).eval()
    config = model.config
    assert config.eos_token_id == config.bos_token_id == config.vocab_size == 10
    assert config.decoder_vocab_size == 11
    labels = torch.tensor([[9, 9, -100], [3, 9, 9]])  # transcripts ending in the last character
    inputs, targets = teacher_forcing(labels, config.bos_token_id, config.eos_token_id)
    assert targets.tolist() == [[9, 9, 10, -100], [3, 9, 9, 10]]  # "9" and "end" stay apart
    with torch.no_grad():
        out = model(torch.randn(2, 40, 13), labels=labels)
    assert out.decoder_logits.shape == (2, 4, 11) and torch.isfinite(out.decoder_loss)
    # the CTC head keeps the 10 classes
    assert out.logits.shape[-1] == 10


def test_a_saved_decoder_with_the_old_end_token_loads_unchanged(tmp_path):
    # Models saved before the fix stored bos = eos = vocab_size - 1: same shapes, same ids.
    old = tiny_model(decoder_layers=1, bos_token_id=9, eos_token_id=9).eval()
    assert old.config.decoder_vocab_size == 10 and old.decoder.lm_head.out_features == 10
    old.save_pretrained(tmp_path)
    loaded = AutoModelForCTC.from_pretrained(tmp_path)
    assert (loaded.config.bos_token_id, loaded.decoder.lm_head.out_features) == (9, 10)
    with pytest.raises(ConfigError, match="bos_token_id=0: must differ from pad_token_id"):
        tiny(decoder_layers=1, bos_token_id=0)


def test_too_long_labels_for_decoder_positions_is_a_clear_error():
    model = tiny_model(decoder_layers=1, max_target_positions=4).eval()
    with pytest.raises(ShapeError, match="max_target_positions=4"):
        model(torch.randn(1, 40, 13), labels=torch.tensor([[1, 2, 3, 4]]))


def test_ctc_greedy_on_hand_made_logits():
    path = [[1, 1, 0, 1, 2, 2, 0, 0, 3], [0, 4, 4, 4, 0, 0, 5, 5, 5]]
    logits = F.one_hot(torch.tensor(path), num_classes=6).float()
    assert ctc_greedy(logits) == [[1, 1, 2, 3], [4, 5]]
    assert ctc_greedy(logits, torch.tensor([5, 3])) == [[1, 1, 2], [4]]
    assert ctc_greedy(logits, blank_id=5) == [[1, 0, 1, 2, 0, 3], [0, 4, 0]]


# ------------------------------------------------------------------ transformers integration


def test_save_pretrained_and_auto_from_pretrained_round_trip(tmp_path):
    model = tiny_model(decoder_layers=1).eval()
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "asrfit_conformer"
    loaded = AutoModelForCTC.from_pretrained(tmp_path).eval()
    assert type(loaded) is ConformerForCTC
    feats = torch.randn(2, 30, 13)
    labels = torch.tensor([[1, 2], [3, -100]])
    with torch.no_grad():
        a, b = model(feats, labels=labels), loaded(feats, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.decoder_logits, b.decoder_logits)

    profile = ModelProfile.from_pretrained(str(tmp_path))  # a local folder resolves too
    assert (profile.family, profile.total_params) == ("asrfit_conformer", n_params(model))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 30}, "d_model"),  # not divisible by 4 heads
        ({"d_model": 34}, "d_model"),  # even, but not divisible by 4 heads
        ({"d_model": 3.5}, "d_model"),
        ({"conv_kernel_size": 4}, "conv_kernel_size"),
        ({"subsampling_factor": 2}, "subsampling_factor"),
        ({"subsampling_conv_channels": 0}, "subsampling_conv_channels"),
        ({"dropout": 1.0}, "dropout"),
        ({"ctc_weight": 1.5}, "ctc_weight"),
        ({"intermediate_ctc_layer": 2}, "intermediate_ctc_layer"),  # the last block of 2
        ({"intermediate_ctc_layer": -1}, "intermediate_ctc_layer"),
        ({"intermediate_ctc_layer": 1, "intermediate_ctc_weight": 1.0}, "intermediate_ctc_weight"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"pad_token_id": 10}, "pad_token_id"),
        ({"encoder_layers": 0}, "encoder_layers"),
        ({"decoder_layers": 1, "eos_token_id": -1}, "eos_token_id"),
    ],
)
def test_bad_config_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"ConformerCTCConfig\.{field}="):
        tiny(**overrides)


def test_decoder_heads_are_checked_against_d_model():
    assert tiny(d_model=36).d_model == 36  # even and divisible by 4 encoder heads
    with pytest.raises(ConfigError, match="divisible by decoder_attention_heads=8"):
        tiny(d_model=36, decoder_layers=1, decoder_attention_heads=8)


def test_unknown_size_lists_the_presets():
    with pytest.raises(ConfigError, match="small, medium, large"):
        conformer_config("huge")


# ------------------------------------------------------------------ registry and profile


@pytest.mark.parametrize("size", sorted(CONFORMER_SIZES))
def test_bundled_sizes_profile_like_a_real_instantiation(size):
    name = f"conformer-ctc-{size}"
    entry = get_bundled(name)
    assert (entry.hub_id, entry.published_params, entry.model_class) == (
        None,
        None,
        "ConformerForCTC",
    )
    profile = ModelProfile.from_pretrained(name)
    torch.manual_seed(0)
    real = ConformerForCTC(conformer_config(size))  # real CPU weights
    preset = CONFORMER_SIZES[size]
    assert profile.total_params == profile.trainable_params == n_params(real)
    assert (profile.family, profile.model_class) == ("asrfit_conformer", "ConformerForCTC")
    assert (profile.hidden_size, profile.num_layers, profile.num_heads) == (
        preset["d_model"],
        preset["encoder_layers"],
        preset["encoder_attention_heads"],
    )
    assert (profile.input_kind, profile.num_mel_bins, profile.vocab_size) == ("log_mel", 80, 32)
    assert profile.encoder_frames_per_second == 100 / 4
    assert profile.decoder_layers is None
    assert ModelProfile.from_json(profile.to_json()) == profile
    rows = dict(profile.summary_rows())
    assert rows["Family"] == "asrfit_conformer" and rows["Encoder frame rate"] == "25 frames/s"
    assert type(profile.build_model()) is ConformerForCTC


def test_profile_of_a_config_with_decoder_and_factor_8():
    profile = ModelProfile.from_config(tiny(subsampling_factor=8, decoder_layers=2))
    assert profile.encoder_frames_per_second == 12.5
    assert profile.decoder_layers == 2
    assert profile.total_params == n_params(tiny_model(subsampling_factor=8, decoder_layers=2))


def test_registry_imports_the_conformer_only_on_demand(monkeypatch):
    import ast
    import inspect
    import types

    from asrfit.profiles import registry

    # No module-level import of asrfit.models in the registry: importing it stays light.
    tree = ast.parse(inspect.getsource(registry))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [getattr(n, "module", None) or n.names[0].name for n in top_level]
    assert not [m for m in names if m and m.startswith("asrfit.models")], names

    imported: list[str] = []

    def spy(name: str):
        imported.append(name)
        return importlib.import_module(name)

    monkeypatch.setattr(registry, "importlib", types.SimpleNamespace(import_module=spy))
    config = registry.load_config("conformer-ctc-small")
    assert type(config) is ConformerCTCConfig and imported == ["asrfit.models.conformer"]
    assert registry.model_class_for(config) is ConformerForCTC
    registry.load_config("whisper-tiny")  # other model types import nothing of asrfit's
    assert imported == ["asrfit.models.conformer", "asrfit.models.conformer"]


# ------------------------------------------------------------------ memory simulation


def _storage_bytes(tensors) -> int:
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()
    )


def _real_cpu_peak_bytes(config: ConformerCTCConfig, shape: BatchShape, setup: Setup) -> int:
    """Peak bytes of a real second training step, from the CPU allocator's profiler events.

    The step follows the simulator's order (inputs, forward+loss under autocast, backward,
    optimizer step, ``zero_grad(set_to_none=True)``) with non-reentrant checkpointing when the
    setup asks for it; the bytes live before profiling are the weights.
    """
    torch.manual_seed(0)
    model = ConformerForCTC(config).train()
    if setup.gradient_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    optimizer = make_optimizer(setup, list(model.parameters()))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=setup.precision.value == "bf16")
    base_bytes = _storage_bytes([*model.parameters(), *model.buffers()])
    cpu = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[cpu], profile_memory=True) as prof:
        for step in (1, 2):
            with torch.profiler.record_function(f"conformer_step_{step}"):
                gen = torch.Generator().manual_seed(0)
                b, n, u = shape.batch_size, shape.input_length, shape.label_length
                inputs = {
                    "input_features": torch.randn(b, n, config.num_mel_bins),
                    "attention_mask": padded_attention_mask(b, n),
                    "labels": torch.randint(1, config.vocab_size - 1, (b, u), generator=gen),
                }
                with autocast:
                    loss = model(**inputs).loss
                loss.backward()
                del loss, inputs
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    events = list(prof.profiler.kineto_results.events())
    (mark,) = [e for e in events if e.name() == "conformer_step_2"]
    memory = sorted(
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(events)
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live, peak = base_bytes, 0
    for t_ns, _, nbytes in memory:
        live += nbytes
        if mark.start_ns() <= t_ns <= mark.end_ns():
            peak = max(peak, live)
    return peak


# Four blocks and a decoder: the encoder, not the conv subsampling, holds most activations.
SIM_KW = dict(d_model=64, vocab_size=32, num_mel_bins=80, encoder_layers=4, decoder_layers=1)
SIM_SHAPE = BatchShape(batch_size=2, input_length=400, label_length=20)


def _sim_config() -> ConformerCTCConfig:
    config = tiny(**SIM_KW)
    config.architectures = ["ConformerForCTC"]
    return config


def test_simulated_peak_matches_a_real_cpu_step():
    config, setup = _sim_config(), Setup()  # fp32 AdamW
    sim = simulate_step(hf_adapter(config), SIM_SHAPE, setup, target="cpu")
    real = _real_cpu_peak_bytes(config, SIM_SHAPE, setup)

    params = list(ConformerForCTC(config).parameters())
    count = sum(p.numel() for p in params)
    assert sim.peak_raw_bytes > 4 * count * 4  # weights + gradients + two AdamW moments
    # AdamW keeps two fp32 moments per parameter tensor, each rounded up to 512 bytes, and a
    # 4-byte `step` scalar (on a CPU target in the same memory: one block each).
    moments = 2 * sum(-(-4 * p.numel() // 512) * 512 for p in params)
    assert sim.optimizer_state_bytes == moments + 512 * len(params)
    assert sim.assumptions == []
    error = (sim.peak_raw_bytes - real) / real
    # the published bound for a simulated CPU step against the allocator's peak: README and
    # docs/benchmarks.md, "Memory accuracy on held-out steps (CPU)", 47 cases, max 0.45 %
    assert abs(error) <= 0.0045, f"simulated {sim.peak_raw_bytes} B, measured {real} B"


class _LiveStorages(TorchDispatchMode):
    """Bytes of the storages that aten ops return, live over time: a tensor-level reference.

    It sees what any tensor trace can see, but not the buffers CPU kernels allocate inside
    themselves (oneDNN convolution reorders and backward columns), which the CPU allocator's
    events include; on CPU those make a checkpointed step's peak, at the subsampling convs'
    backward, larger than any tensor trace (see ``docs/benchmarks.md``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = self.peak_bytes = 0
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        if key in self._refs:
            return
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

        def free(_ref: weakref.ref, key: int = key, nbytes: int = nbytes) -> None:
            self._refs.pop(key, None)
            self.live_bytes -= nbytes

        self._refs[key] = weakref.ref(storage, free)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out


def test_checkpointed_peak_matches_real_tensors(monkeypatch):
    import asrfit.memory.simulate as simulate_module

    config, setup = _sim_config(), Setup(precision="bf16", gradient_checkpointing=True)
    # The reference counts tensors only, so leave out the CPU kernels' internal scratch.
    monkeypatch.setattr(simulate_module, "scratch_rules", lambda target, tracker: {})
    sim = simulate_step(hf_adapter(config), SIM_SHAPE, setup, target="cpu")
    torch.manual_seed(0)
    model = ConformerForCTC(config).train()
    model.activation_checkpointing_enable({"use_reentrant": False})
    optimizer = make_optimizer(setup, list(model.parameters()))
    b, n, u = SIM_SHAPE.batch_size, SIM_SHAPE.input_length, SIM_SHAPE.label_length
    tracker = _LiveStorages()
    with tracker:
        for t in [*model.parameters(), *model.buffers()]:
            tracker.add(t)
        for _ in (1, 2):
            tracker.peak_bytes = tracker.live_bytes  # keep the second step's peak
            gen = torch.Generator().manual_seed(0)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(
                    input_features=torch.randn(b, n, config.num_mel_bins),
                    attention_mask=padded_attention_mask(b, n),
                    labels=torch.randint(1, config.vocab_size - 1, (b, u), generator=gen),
                ).loss
            loss.backward()
            del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert sim.assumptions == []
    error = (sim.peak_raw_bytes - tracker.peak_bytes) / tracker.peak_bytes
    assert abs(error) <= 0.05, f"simulated {sim.peak_raw_bytes} B, real {tracker.peak_bytes} B"


def test_simulator_rejects_more_labels_than_frames():
    config = tiny()
    with pytest.raises(ShapeError, match="CTC needs at least one frame per label"):
        simulate_step(hf_adapter(config), BatchShape(1, 40, 11), Setup())  # 10 frames
