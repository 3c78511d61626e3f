"""The seed documents' API: TrainingConfig, ASRConfigManager, create_optimal_config.

References are independent of the code under test: a hand-made Plan whose bucket batches,
accumulation and precision are written out below, dummy audio of known durations, tiny
wav2vec2 models instantiated for real (parameters counted with ``numel``), the T4's
published facts (16 GB GDDR6 with ECC, compute capability 7.5: no bf16), and a real
``transformers.TrainingArguments`` built from the exported keyword arguments.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn
from transformers import TrainingArguments, Wav2Vec2Config, Wav2Vec2ForCTC

from asrfit.errors import ConfigError, UnsupportedModelError
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.profiles.hardware import HardwareProfile
from asrfit.seed import ASRConfigManager, TrainingConfig, create_optimal_config
from asrfit.testing import dummies, make_plan

TINY_W2V = dict(
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
DURATIONS_SECONDS = [1.0, 2.0, 3.5, 6.0]  # multiples of 1/16000: exact in samples


def tiny_wav2vec2_module() -> Wav2Vec2ForCTC:
    torch.manual_seed(0)
    model = Wav2Vec2ForCTC(Wav2Vec2Config(**TINY_W2V))
    model.freeze_feature_encoder()
    return model


def hand_plan(
    precision: str = "bf16", optimizer: str = "adamw", checkpointing: bool = True
) -> Plan:
    """Three buckets with batches 32, 12 and 5; accumulation 2; 4 workers; 13.6 GiB usable."""
    return make_plan(
        (32, 12, 5),
        bucket_edges_seconds=(0.0, 4.0, 10.0, 20.0),
        model="xls-r-300m",
        usable_bytes=int(13.6 * 2**30),
        setup=Setup(precision=precision, gradient_checkpointing=checkpointing, optimizer=optimizer),
        gradient_accumulation_steps=2,
        target_effective_batch="32 utterances",
        num_workers=4,
        long_utterance_fraction=0.01,
        data_reasons=["cache: fits in RAM"],
    )


# ------------------------------------------------------------------ TrainingConfig


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"per_device_train_batch_size": 0}, "per_device_train_batch_size"),
        ({"per_device_train_batch_size": 2.5}, "per_device_train_batch_size"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"accumulation_steps": 0}, "accumulation_steps"),
        ({"accumulation_steps": 4, "gradient_accumulation_steps": 3}, "accumulation_steps"),
        ({"sequence_length_percentile": 0.0}, "sequence_length_percentile"),
        ({"sequence_length_percentile": 100.5}, "sequence_length_percentile"),
        ({"fp16": True, "bf16": True}, "bf16"),
        ({"fp16": True, "mixed_precision": False}, "mixed_precision"),
        ({"learning_rate": -1e-4}, "learning_rate"),
        ({"dataloader_num_workers": -1}, "dataloader_num_workers"),
        ({"max_memory_gb": 0.0}, "max_memory_gb"),
        ({"bucket_duration_bins": [4.0, 10.0], "bucket_batch_sizes": [8]}, "bucket_batch_sizes"),
        (
            {"bucket_duration_bins": [10.0, 4.0], "bucket_batch_sizes": [8, 16]},
            "bucket_duration_bins",
        ),
    ],
)
def test_invalid_training_config_names_the_field(kwargs, field_name):
    with pytest.raises(ConfigError, match=field_name):
        TrainingConfig(**kwargs)


def test_percentile_bounds_are_inclusive_at_100():
    assert TrainingConfig(sequence_length_percentile=100.0).sequence_length_percentile == 100.0


def test_seed_defaults():
    config = TrainingConfig()
    assert (config.learning_rate, config.warmup_steps, config.max_grad_norm) == (1e-4, 500, 1.0)
    assert (config.optim, config.group_by_length, config.adaptive_batching) == (
        "adamw_torch",
        True,
        True,
    )
    assert (config.sequence_length_percentile, config.alpha_constant) == (95.0, 1.2)
    assert config.mixed_precision is False and config.accumulation_steps == 1


def test_accumulation_alias_stays_in_sync():
    config = TrainingConfig(accumulation_steps=4)
    assert config.gradient_accumulation_steps == 4
    config.gradient_accumulation_steps = 6
    assert config.accumulation_steps == 6
    config.accumulation_steps = 3
    assert config.gradient_accumulation_steps == 3
    assert (
        TrainingConfig(accumulation_steps=4, gradient_accumulation_steps=4).accumulation_steps == 4
    )
    # replace() must not resurrect a stale alias value
    assert dataclasses.replace(config, gradient_accumulation_steps=8).accumulation_steps == 8


def test_mixed_precision_is_fp16_or_bf16():
    assert TrainingConfig(mixed_precision=True).fp16 is True  # torch.autocast("cuda") default
    assert TrainingConfig(bf16=True, mixed_precision=True).fp16 is False
    config = TrainingConfig(bf16=True)
    assert config.mixed_precision is True
    config.mixed_precision = False
    assert (config.fp16, config.bf16) == (False, False)
    plain = dataclasses.replace(TrainingConfig(fp16=True), fp16=False)
    assert plain.mixed_precision is False


def test_training_config_json_round_trip_and_unknown_key(tmp_path):
    config = TrainingConfig(
        per_device_train_batch_size=3,
        accumulation_steps=5,
        fp16=True,
        max_memory_gb=13.5,
        bucket_duration_bins=[4.0, 12.5],
        bucket_batch_sizes=[16, 3],
    )
    assert TrainingConfig.from_json(config.to_json()) == config
    assert TrainingConfig.load(config.save(tmp_path / "c.json")) == config
    data = config.to_dict()
    data["batch_sise"] = 4
    with pytest.raises(ConfigError, match="batch_sise"):
        TrainingConfig.from_dict(data)


def test_training_arguments_build_for_real(tmp_path):
    config = TrainingConfig(
        per_device_train_batch_size=3,
        gradient_accumulation_steps=5,
        gradient_checkpointing=True,
        dataloader_num_workers=2,
        learning_rate=3e-4,
        warmup_steps=7,
        num_train_epochs=2.0,
        max_grad_norm=0.5,
        optim="adafactor",
        max_memory_gb=10.0,
    )
    kwargs = config.to_training_arguments(length_column="input_length")
    init_fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    assert set(kwargs) <= init_fields
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)
    assert args.per_device_train_batch_size == 3
    assert args.gradient_accumulation_steps == 5
    assert args.gradient_checkpointing is True
    assert args.dataloader_num_workers == 2
    assert args.learning_rate == 3e-4 and args.warmup_steps == 7
    assert args.num_train_epochs == 2.0 and args.max_grad_norm == 0.5
    assert args.optim == "adafactor"
    assert (args.fp16, args.bf16) == (False, False)
    grouped = getattr(args, "group_by_length", None) is True
    grouped = grouped or getattr(args, "train_sampling_strategy", None) == "group_by_length"
    assert grouped and args.length_column_name == "input_length"
    # without a column of lengths the Trainer cannot group audio (it looks for input_ids)
    plain = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, **config.to_training_arguments()
    )
    assert getattr(plain, "group_by_length", False) is not True
    assert getattr(plain, "train_sampling_strategy", "random") != "group_by_length"


def test_training_arguments_reject_an_unknown_optimizer():
    with pytest.raises(ConfigError, match="optim='adamw_torchh'"):
        TrainingConfig(optim="adamw_torchh").to_training_arguments()


# ------------------------------------------------------------------ from_plan


def test_from_plan_maps_smallest_bucket_accumulation_precision_workers():
    config = TrainingConfig.from_plan(hand_plan("bf16"))
    assert config.per_device_train_batch_size == 5  # min(32, 12, 5)
    assert config.gradient_accumulation_steps == 2 == config.accumulation_steps
    assert (config.bf16, config.fp16, config.mixed_precision) == (True, False, True)
    assert config.gradient_checkpointing is True
    assert config.dataloader_num_workers == 4
    assert config.optim == "adamw_torch"
    assert config.max_memory_gb == pytest.approx(13.6)
    assert config.bucket_duration_bins == [4.0, 10.0, 20.0]
    assert config.bucket_batch_sizes == [32, 12, 5]
    rows = dict(config.summary_rows())
    assert rows["Batch per device"] == "5" and rows["Precision"] == "bf16"
    assert rows["Bucket batches"] == "<=4 s: 32, <=10 s: 12, <=20 s: 5"


@pytest.mark.parametrize(
    ("precision", "optimizer", "fp16", "bf16", "optim"),
    [
        ("fp16", "adafactor", True, False, "adafactor"),
        ("fp32", "sgd", False, False, "sgd"),
        ("fp32", "adamw8bit", False, False, "adamw_bnb_8bit"),
    ],
)
def test_from_plan_precision_and_optimizer(precision, optimizer, fp16, bf16, optim):
    config = TrainingConfig.from_plan(hand_plan(precision, optimizer, checkpointing=False))
    assert (config.fp16, config.bf16, config.optim) == (fp16, bf16, optim)
    assert config.gradient_checkpointing is False


def test_from_plan_fp32_config_builds_training_arguments(tmp_path):
    config = TrainingConfig.from_plan(hand_plan("fp32"), learning_rate=5e-5)
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, **config.to_training_arguments()
    )
    assert args.per_device_train_batch_size == 5
    # a fixed batch of 5 keeps the 32-utterance target with round(32 / 5) = 6 micro-batches
    assert args.gradient_accumulation_steps == 6
    assert (
        config.to_training_arguments(memory_budget_sampler=True)["gradient_accumulation_steps"] == 2
    )  # the plan's own, for its bucketed batches
    assert args.learning_rate == 5e-5
    with pytest.raises(ConfigError, match="lerning_rate"):
        TrainingConfig.from_plan(hand_plan(), lerning_rate=1e-3)


# ------------------------------------------------------------------ ASRConfigManager


def test_profile_hardware_named_and_detected(monkeypatch):
    manager = ASRConfigManager(safety_margin=0.8, gpu="T4")
    hardware = manager.profile_hardware()
    assert manager.hardware is hardware and hardware.spec.name == "T4"
    # 16 GiB of GDDR6 with ECC on: CUDA sees 15/16 of it; usable is that times the margin.
    assert hardware.usable_bytes == round(16 * 2**30 * 15 / 16 * 0.8)
    monkeypatch.setattr("asrfit.profiles.hardware.detect_devices", lambda: [])
    detected = ASRConfigManager(safety_margin=0.7).profile_hardware()
    assert detected.source == "cpu-only" and detected.safety_margin == 0.7


def test_profile_dataset_from_hf_dataset_and_manifest(tmp_path):
    manager = ASRConfigManager(gpu="T4")
    ds = dummies.dummy_hf_dataset(tmp_path / "hf", DURATIONS_SECONDS)
    profile = manager.profile_dataset(ds)
    assert manager.dataset is profile
    assert profile.num_utterances == 4
    assert profile.total_seconds == pytest.approx(12.5)
    assert profile.duration_max_seconds == pytest.approx(6.0)
    manifest = dummies.dummy_manifest(tmp_path / "m", [2.0, 3.0])
    assert manager.profile_dataset(manifest).total_seconds == pytest.approx(5.0)


def test_profile_model_from_module_uses_its_own_config():
    module = tiny_wav2vec2_module()
    manager = ASRConfigManager(gpu="T4")
    profile = manager.profile_model(module, model_name="xls-r-300m")
    assert manager.model is profile
    assert profile.name == "xls-r-300m"
    assert profile.family == "wav2vec2"
    assert profile.hidden_size == 32 and profile.config["hidden_size"] == 32
    assert profile.total_params == sum(p.numel() for p in module.parameters())
    frozen = sum(p.numel() for p in module.wav2vec2.feature_extractor.parameters())
    assert profile.frozen_params == frozen


def test_profile_model_plain_module_borrows_the_named_config():
    manager = ASRConfigManager(gpu="T4")
    profile = manager.profile_model(nn.Linear(4, 4), model_name="xls-r-300m")
    # XLS-R 300M (Babu et al. 2021): 24 layers, 1024 hidden.
    assert (profile.family, profile.hidden_size, profile.num_layers) == ("wav2vec2", 1024, 24)


def test_create_plan_needs_profiles_and_a_config(tmp_path):
    manager = ASRConfigManager(gpu="T4")
    with pytest.raises(ConfigError, match="profile_dataset"):
        manager.create_plan()
    manager.profile_dataset(dummies.dummy_manifest(tmp_path, [1.0]))
    with pytest.raises(ConfigError, match="profile_model"):
        manager.create_plan()
    manager.profile_model(nn.Linear(4, 4))
    with pytest.raises(UnsupportedModelError, match="model_name"):
        manager.create_plan()


@pytest.fixture
def recording_planner(monkeypatch):
    """Replace ``asrfit.plan.search.plan`` with one that records its call and returns hand_plan()."""
    calls: list[tuple] = []

    def planner(hardware, dataset, model, **kwargs):
        calls.append((hardware, dataset, model, kwargs))
        return hand_plan("fp16")

    monkeypatch.setattr("asrfit.plan.search.plan", planner)
    return calls


def test_create_plan_calls_the_planner_and_converts(tmp_path, recording_planner):
    manager = ASRConfigManager(gpu="T4")
    manager.profile_dataset(dummies.dummy_manifest(tmp_path, [1.0, 2.0]))
    manager.profile_model(tiny_wav2vec2_module())
    plan = manager.create_plan(target_batch_size=48, target_hours=0.5)
    ((hardware, dataset, model, kwargs),) = recording_planner
    assert hardware is manager.hardware and hardware.spec.name == "T4"  # profiled on demand
    assert dataset is manager.dataset and model is manager.model
    assert kwargs == {
        "target_effective_batch": 48,
        "target_hours": 0.5,
        "freeze_feature_encoder": True,
    }
    assert manager.plan is plan
    assert manager.config.per_device_train_batch_size == 5 and manager.config.fp16 is True

    torch.manual_seed(0)
    unfrozen = Wav2Vec2ForCTC(Wav2Vec2Config(**TINY_W2V))  # feature encoder left trainable
    manager.profile_model(unfrozen)
    manager.create_plan()
    assert recording_planner[-1][3]["freeze_feature_encoder"] is False


def test_save_load_round_trip_and_unknown_keys(tmp_path):
    manager = ASRConfigManager(safety_margin=0.8, gpu="T4")
    manager.profile_hardware()
    manager.profile_dataset(dummies.dummy_manifest(tmp_path / "data", [1.0, 2.5]))
    manager.profile_model(tiny_wav2vec2_module(), model_name="tiny")
    manager.plan = hand_plan()
    manager.config = TrainingConfig.from_plan(manager.plan, learning_rate=3e-5)
    path = tmp_path / "asrfit_config.json"
    manager.save_config(path)

    loaded = ASRConfigManager()
    config = loaded.load_config(path)
    assert config == manager.config and loaded.config.learning_rate == 3e-5
    for name in ("hardware", "dataset", "model", "plan"):
        assert getattr(loaded, name) == getattr(manager, name), name
    assert (loaded.safety_margin, loaded.gpu) == (0.8, "T4")
    assert isinstance(loaded.hardware, HardwareProfile)

    data = json.loads(path.read_text())
    data["config"]["warmup_step"] = 10
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="warmup_step"):
        ASRConfigManager().load_config(path)
    data["config"].pop("warmup_step")
    data["extra_section"] = {}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="extra_section"):
        ASRConfigManager().load_config(path)
    data.pop("extra_section")
    data["config"]["per_device_train_batch_size"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="per_device_train_batch_size"):
        ASRConfigManager().load_config(path)
    with pytest.raises(ConfigError, match="no such file"):
        ASRConfigManager().load_config(tmp_path / "missing.json")


# ------------------------------------------------------------------ end to end


@pytest.mark.slow  # the real planner runs ~15 fake-tensor simulations (about 10 s)
def test_create_optimal_config_on_hf_dataset_and_wav2vec2_module(tmp_path, monkeypatch):
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path / "cache"))  # a cold, private cache
    ds = dummies.dummy_hf_dataset(tmp_path / "hf", DURATIONS_SECONDS)
    module = tiny_wav2vec2_module()
    config, manager = create_optimal_config(ds, module, gpu="T4", target_batch_size=8)

    assert isinstance(config, TrainingConfig) and manager.config is config
    assert manager.hardware.spec.name == "T4"
    assert manager.dataset.num_utterances == 4
    assert manager.dataset.total_seconds == pytest.approx(12.5)
    assert manager.model.total_params == sum(p.numel() for p in module.parameters())
    assert config.bf16 is False  # T4: compute capability 7.5, no bf16
    plan = manager.plan
    assert config.per_device_train_batch_size == min(b.batch_size for b in plan.buckets)
    assert config.gradient_accumulation_steps == plan.gradient_accumulation_steps
    assert config.bucket_duration_bins == [b.max_seconds for b in plan.buckets]
    assert config.max_memory_gb == pytest.approx(manager.hardware.usable_bytes / 2**30)

    fp32 = dataclasses.replace(config, fp16=False, bf16=False)  # fp16 needs a GPU
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, **fp32.to_training_arguments()
    )
    assert args.per_device_train_batch_size == config.per_device_train_batch_size

    manager.save_config(tmp_path / "plan.json")
    again = ASRConfigManager()
    assert again.load_config(tmp_path / "plan.json") == config
    assert again.plan == plan


@pytest.mark.slow  # plans conformer-ctc-tiny (a few fake-tensor simulations)
def test_create_optimal_config_finds_a_common_voice_sentence_column(tmp_path, monkeypatch):
    # the profile looks the transcript column up among the usual names; the one-call entry
    # point used to insist on "text" and refused the Common Voice layout
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path / "cache"))
    texts = ["hello there", "a longer sentence to read", "yes", "four words in all"]
    ds = dummies.dummy_hf_dataset(
        tmp_path / "cv", DURATIONS_SECONDS, texts=texts, text_column="sentence"
    )
    _, manager = create_optimal_config(ds, "conformer-ctc-tiny", gpu="T4", target_batch_size=8)
    assert manager.dataset.num_utterances == 4
    assert manager.dataset.text_chars_mean == pytest.approx(sum(map(len, texts)) / 4)
