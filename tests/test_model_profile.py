"""ModelProfile, the bundled model configs and the meta-device builder.

References are independent of the code under test: tiny models instantiated for real on CPU
(counted with ``sum(p.numel() for p in model.parameters())``), hand-computed closed forms, and
the parameter counts published in papers and model cards.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time

import pytest
import torch
from torch import nn
from transformers import (
    HubertConfig,
    HubertForCTC,
    ParakeetCTCConfig,
    ParakeetForCTC,
    ParakeetForTDT,
    ParakeetTDTConfig,
    Wav2Vec2Config,
    Wav2Vec2ForCTC,
    WavLMConfig,
    WavLMForCTC,
    WhisperConfig,
    WhisperForConditionalGeneration,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from asrfit.errors import ConfigError, UnknownModelError, UnsupportedModelError
from asrfit.profiles import registry
from asrfit.profiles.model import (
    ModelProfile,
    build_model,
    family_of,
    list_bundled_models,
    load_config,
)
from asrfit.profiles.registry import get_bundled

EXPECTED_BUNDLED = {
    "conformer-ctc-tiny",
    "conformer-ctc-small",
    "conformer-ctc-medium",
    "conformer-ctc-large",
    "wav2vec2-base",
    "wav2vec2-large-lv60",
    "xls-r-300m",
    "xls-r-1b",
    "xls-r-2b",
    "hubert-large",
    "wavlm-large",
    "whisper-tiny",
    "whisper-base",
    "whisper-small",
    "whisper-medium",
    "whisper-large-v2",
    "whisper-large-v3",
    "parakeet-ctc-0.6b",
    "parakeet-ctc-1.1b",
    "parakeet-tdt-0.6b-v2",
    "parakeet-tdt-0.6b-v3",
}

# ---------------------------------------------------------------- tiny configs of each family

_W2V_KW = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=37,
    conv_dim=(8, 8),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    vocab_size=12,
)


def tiny_wav2vec2(**overrides) -> Wav2Vec2Config:
    return Wav2Vec2Config(**{**_W2V_KW, **overrides})


def tiny_whisper() -> WhisperConfig:
    return WhisperConfig(
        vocab_size=100,
        num_mel_bins=8,
        encoder_layers=1,
        decoder_layers=2,
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
        begin_suppress_tokens=[1, 2],
    )


_ENCODER = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=24,
    subsampling_conv_channels=4,
    num_mel_bins=16,
)


def tiny_parakeet_ctc() -> ParakeetCTCConfig:
    return ParakeetCTCConfig(vocab_size=11, pad_token_id=10, encoder_config=dict(_ENCODER))


def tiny_parakeet_tdt() -> ParakeetTDTConfig:
    return ParakeetTDTConfig(
        vocab_size=11,
        blank_token_id=10,
        pad_token_id=2,
        decoder_hidden_size=8,
        encoder_config=dict(_ENCODER),
    )


TINY_CASES = [
    ("wav2vec2", tiny_wav2vec2, Wav2Vec2ForCTC),
    ("hubert", lambda: HubertConfig(**_W2V_KW), HubertForCTC),
    ("wavlm", lambda: WavLMConfig(**_W2V_KW, num_buckets=8, max_bucket_distance=16), WavLMForCTC),
    ("whisper", tiny_whisper, WhisperForConditionalGeneration),
    ("parakeet_ctc", tiny_parakeet_ctc, ParakeetForCTC),
    ("parakeet_tdt", tiny_parakeet_tdt, ParakeetForTDT),
]


def _real_counts(model: nn.Module) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


@pytest.mark.parametrize(
    ("family", "make_config", "model_cls"), TINY_CASES, ids=[c[0] for c in TINY_CASES]
)
def test_meta_counts_equal_a_real_instantiation(family, make_config, model_cls):
    real = model_cls(make_config())  # real weights, on CPU
    total, _ = _real_counts(real)
    if hasattr(real, "freeze_feature_encoder"):
        real.freeze_feature_encoder()
    _, trainable = _real_counts(real)

    profile = ModelProfile.from_config(make_config())
    assert profile.family == family
    assert profile.model_class == model_cls.__name__
    assert profile.total_params == total
    assert profile.trainable_params == trainable
    assert profile.frozen_params == total - trainable
    assert profile.param_bytes_fp32 == 4 * total
    if family in ("wav2vec2", "hubert", "wavlm"):
        assert profile.feature_encoder_frozen
        assert trainable < total
    else:
        assert not profile.feature_encoder_frozen


def test_tiny_wav2vec2_closed_form_count():
    h, v, ff, c = 32, 12, 37, 8
    feature_encoder = 1 * c * 10 + 2 * c + c * c * 3  # conv0 (no bias), GroupNorm(c), conv1
    projection = 2 * c + (c * h + h)  # LayerNorm(c) + Linear(c -> h)
    masked_spec_embed = h
    pos_conv = h * (h // 16) * 16 + 16 + h  # weight_v, weight_g (norm over dim 2), bias
    layer = 4 * (h * h + h) + 2 * h + (h * ff + ff) + (ff * h + h) + 2 * h
    encoder = pos_conv + 2 * h + 2 * layer
    ctc_head = (h + 1) * v
    expected = feature_encoder + projection + masked_spec_embed + encoder + ctc_head

    profile = ModelProfile.from_config(tiny_wav2vec2())
    assert profile.total_params == expected == 15734
    assert profile.frozen_params == feature_encoder
    # The CTC head alone: one more output class adds hidden + 1 parameters.
    bigger = ModelProfile.from_config(tiny_wav2vec2(vocab_size=v + 1))
    assert bigger.total_params - profile.total_params == h + 1


def test_whisper_tied_output_projection_counted_once():
    real = WhisperForConditionalGeneration(tiny_whisper())
    assert real.proj_out.weight is real.model.decoder.embed_tokens.weight
    untied_total = sum(p.numel() for p in real.state_dict().values() if p.is_floating_point())
    profile = ModelProfile.from_config(tiny_whisper())
    assert untied_total - profile.total_params == 100 * 16  # the tied vocab x d_model matrix
    # Encoder positions are a frozen parameter in transformers: 30 x 16 of them.
    assert profile.frozen_params == 30 * 16


# ---------------------------------------------------------------- bundled configs


@functools.cache
def _bundled_profile(name: str) -> ModelProfile:
    return ModelProfile.from_pretrained(name)


def test_bundled_list():
    assert set(list_bundled_models()) == EXPECTED_BUNDLED


@pytest.mark.parametrize("name", sorted(EXPECTED_BUNDLED))
def test_bundled_config_builds_and_matches_published_count(name):
    entry = get_bundled(name)
    start = time.perf_counter()
    model = build_model(name)
    build_seconds = time.perf_counter() - start
    assert all(p.is_meta for p in model.parameters())
    assert build_seconds < 15.0, f"{name}: meta build took {build_seconds:.1f} s"
    assert type(model).__name__ == entry.model_class

    profile = _bundled_profile(name)
    assert profile.family == entry.family
    assert profile.hub_id == entry.hub_id
    if entry.published_params is None:  # asrfit's own model: test_conformer counts it by hand
        assert entry.family == "asrfit_conformer"
        return
    gap = abs(profile.total_params / entry.published_params - 1)
    assert gap <= entry.published_params_tolerance, (
        f"{name}: {profile.total_params:,} parameters vs published {entry.published_params:,} "
        f"({entry.published_params_source}); gap {gap:.1%}"
    )
    assert entry.published_params_tolerance <= 0.05


@pytest.mark.parametrize("name", sorted(EXPECTED_BUNDLED))
def test_bundled_config_keys_are_all_known_to_the_config_class(name):
    def check(data: dict, where: str) -> None:
        registry.ensure_registered(data["model_type"])
        cls = CONFIG_MAPPING[data["model_type"]]
        known = {f.name for f in dataclasses.fields(cls)} | {"model_type"}
        assert set(data) <= known, f"{where}: invented keys {sorted(set(data) - known)}"

    data = get_bundled(name).config_dict()
    check(data, name)
    if "encoder_config" in data:
        check(data["encoder_config"], f"{name}.encoder_config")


def test_wav2vec2_base_frozen_feature_encoder_matches_hand_count():
    # 7 conv layers of 512 channels, no bias, GroupNorm(512) after the first only.
    conv = 1 * 512 * 10 + 4 * (512 * 512 * 3) + 2 * (512 * 512 * 2)
    profile = _bundled_profile("wav2vec2-base")
    assert profile.frozen_params == conv + 2 * 512 == 4_200_448
    unfrozen = ModelProfile.from_pretrained("wav2vec2-base", freeze_feature_encoder=False)
    assert unfrozen.trainable_params == unfrozen.total_params == profile.total_params
    assert not unfrozen.feature_encoder_frozen


def test_frame_rates_and_inputs():
    w2v = _bundled_profile("wav2vec2-base")
    assert w2v.encoder_frames_per_second == 16000 / (5 * 2**6) == 50.0
    assert (w2v.input_kind, w2v.sampling_rate, w2v.input_frames_per_second) == (
        "waveform",
        16000,
        16000.0,
    )
    assert w2v.max_input_seconds is None
    assert w2v.encoder_frames(2.0) == 100

    for name in ("whisper-tiny", "whisper-large-v3"):
        whisper = _bundled_profile(name)
        assert whisper.encoder_frames_per_second == 50.0
        assert (whisper.input_kind, whisper.input_frames_per_second) == ("log_mel", 100.0)
        assert whisper.max_input_seconds == 30.0
        assert whisper.encoder_frames(1.0) == 1500  # padded to 30 s
    assert _bundled_profile("whisper-large-v3").num_mel_bins == 128
    assert _bundled_profile("whisper-tiny").decoder_layers == 4

    for name in ("parakeet-ctc-0.6b", "parakeet-tdt-0.6b-v3"):
        parakeet = _bundled_profile(name)
        assert parakeet.encoder_frames_per_second == 100 / 8 == 12.5
        assert parakeet.input_kind == "log_mel"
        assert parakeet.max_input_seconds is None


def test_hub_id_alias_and_short_name_resolve_alike():
    by_short = _bundled_profile("xls-r-1b")
    by_hub = ModelProfile.from_pretrained("facebook/wav2vec2-xls-r-1b")
    by_case = ModelProfile.from_pretrained("Facebook/Wav2Vec2-XLS-R-1B")
    assert by_short == by_hub == by_case
    assert by_short.source == "bundled"
    assert ModelProfile.from_pretrained("parakeet-tdt-0.6b").name == "parakeet-tdt-0.6b-v3"


# ---------------------------------------------------------------- resolution and errors


def test_unknown_model_offline_lists_bundled_names(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UnknownModelError) as info:
        ModelProfile.from_pretrained("someone/not-a-real-asr-model")
    message = str(info.value)
    assert "someone/not-a-real-asr-model" in message
    for name in ("xls-r-1b", "whisper-tiny", "parakeet-ctc-0.6b"):
        assert name in message
    assert "local folder" in message and "HF_HUB_OFFLINE" in message

    with pytest.raises(UnknownModelError, match="no such folder"):
        ModelProfile.from_pretrained(str(tmp_path / "missing-model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnknownModelError, match="has no config.json"):
        ModelProfile.from_pretrained(str(tmp_path / "empty"))


def test_local_folder_with_config_json(tmp_path):
    folder = tmp_path / "my-w2v"
    tiny_wav2vec2().save_pretrained(folder)
    real = Wav2Vec2ForCTC(tiny_wav2vec2())
    real.freeze_feature_encoder()
    total, trainable = _real_counts(real)

    profile = ModelProfile.from_pretrained(str(folder))
    assert (profile.name, profile.source, profile.family) == ("my-w2v", "local", "wav2vec2")
    assert (profile.total_params, profile.trainable_params) == (total, trainable)

    # A single JSON file works too, including a bundled-style one with asrfit_meta.
    data = get_bundled("whisper-tiny").config_dict()
    data["asrfit_meta"] = {"note": "ignored"}
    (tmp_path / "w.json").write_text(json.dumps(data))
    from_file = ModelProfile.from_pretrained(str(tmp_path / "w.json"))
    assert from_file.total_params == _bundled_profile("whisper-tiny").total_params


def test_bad_config_dict_names_the_problem():
    with pytest.raises(ConfigError, match="model_type"):
        load_config({"hidden_size": 8})
    with pytest.raises(ConfigError, match="not-a-model"):
        load_config({"model_type": "not-a-model"})
    with pytest.raises(UnsupportedModelError):
        ModelProfile.from_spec(42)


# ---------------------------------------------------------------- serialisation, modules, specs


def test_json_round_trip_and_rebuild(tmp_path):
    for profile in (
        _bundled_profile("whisper-tiny"),
        ModelProfile.from_config(tiny_parakeet_tdt()),
    ):
        again = ModelProfile.from_json(profile.to_json())
        assert again == profile
        path = profile.save(tmp_path / f"{profile.name}.json")
        assert ModelProfile.load(path) == profile
        rebuilt = again.build_model()
        assert sum(p.numel() for p in rebuilt.parameters()) == profile.total_params
    with pytest.raises(ConfigError, match="frozen_params"):
        bad = json.loads(_bundled_profile("whisper-tiny").to_json())
        bad["frozen_params"] += 1
        ModelProfile.from_dict(bad)


def test_summary_rows_are_strings():
    rows = _bundled_profile("wav2vec2-base").summary_rows()
    labels = [label for label, _ in rows]
    assert all(isinstance(label, str) and isinstance(value, str) for label, value in rows)
    assert {"Model", "Parameters", "Trainable parameters", "Encoder frame rate"} <= set(labels)
    assert dict(rows)["Feature encoder"] == "frozen"


def test_from_module_plain_sequential():
    first = nn.Linear(4, 3)
    module = nn.Sequential(first, nn.ReLU(), nn.Linear(3, 2))
    first.requires_grad_(False)
    profile = ModelProfile.from_module(module)
    assert (profile.family, profile.model_class, profile.name) == (
        "custom",
        "Sequential",
        "Sequential",
    )
    assert profile.total_params == (4 * 3 + 3) + (3 * 2 + 2) == 23
    assert profile.frozen_params == 15 and profile.trainable_params == 8
    assert profile.config == {} and profile.input_kind is None
    assert ModelProfile.from_json(profile.to_json()) == profile

    shared = nn.Linear(3, 3)
    assert ModelProfile.from_module(nn.Sequential(shared, shared), name="tied").total_params == 12


def test_from_spec_dispatch_and_family_of():
    config = tiny_whisper()
    from_config = ModelProfile.from_spec(config)
    real = WhisperForConditionalGeneration(tiny_whisper())
    from_module = ModelProfile.from_spec(real)
    assert from_config.total_params == from_module.total_params == _real_counts(real)[0]
    assert ModelProfile.from_spec(from_config) is from_config
    assert ModelProfile.from_spec("whisper-tiny") == _bundled_profile("whisper-tiny")
    assert family_of(real) == family_of(config) == family_of(config.to_dict()) == "whisper"
    assert family_of(nn.Linear(2, 2)) == "custom"
    assert config.dtype is None  # building did not touch the caller's config


@pytest.mark.parametrize("name", ["wav2vec2-base", "whisper-tiny", "parakeet-ctc-0.6b"])
def test_build_model_under_fake_tensor_mode(name):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        model = build_model(name, device=None)
        if name == "whisper-tiny":
            out = model.model.encoder(torch.empty(1, 80, 3000)).last_hidden_state
            assert tuple(out.shape) == (1, 1500, 384)
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    assert all(isinstance(b, FakeTensor) for b in model.buffers())
    profile = ModelProfile.from_module(model)
    expected = _bundled_profile(name)
    assert (profile.total_params, profile.trainable_params) == (
        expected.total_params,
        expected.trainable_params,
    )


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("float32", torch.float32), ("bfloat16", torch.bfloat16), (torch.float16, torch.float16)],
)
def test_build_model_takes_a_dtype_or_its_name(dtype, expected):
    model = build_model("conformer-ctc-tiny", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {expected}


def test_build_model_names_a_dtype_name_that_is_none():
    with pytest.raises(ConfigError, match="'float33'"):
        build_model("conformer-ctc-tiny", dtype="float33")


def test_a_whisper_step_longer_than_its_window_is_counted_for_the_window(
    monkeypatch, tmp_path
) -> None:
    from asrfit.memory.report import simulate
    from asrfit.profiles.model import ModelProfile

    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))
    window = ModelProfile.from_spec(tiny_whisper()).max_input_seconds
    assert window is not None
    longer = simulate(tiny_whisper(), batch_size=2, seconds=3 * window, gpu="T4")
    exact = simulate(tiny_whisper(), batch_size=2, seconds=window, gpu="T4")
    # one input holds one window of audio: the same step, timed and counted for the window
    assert longer.batch == exact.batch and longer.audio_seconds == exact.audio_seconds == window
    assert longer.audio_seconds_per_second == pytest.approx(exact.audio_seconds_per_second)
    assert "input window" in longer.notes[0] and not any("input window" in n for n in exact.notes)
