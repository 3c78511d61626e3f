"""Plan exports checked against hand-computed values and the real consumers' own loaders."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import yaml

from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.plan.exports import EXPORT_FILENAMES, EXPORT_FORMATS, export_plan, export_text
from asrfit.testing import make_plan

# Hand-made plan: buckets of 32 / 12 / 5 utterances, accumulation 2, 4 workers, target 32.
SMALLEST_BATCH = 5
ACCUMULATION = 2
# A fixed batch of 5 needs round(32 / 5) = 6 micro-batches for 30 utterances per step
# (31.25 / 5 would be 6.4: 6 is nearest); the plan's 2 would give 10.
FIXED_ACCUMULATION = 6


def example_plan(
    precision="bf16",
    zero_stage=0,
    world_size=1,
    offload=False,
    offload_params=False,
    optimizer="adamw",
    long_utterances="chunk",
    last_fraction=0.1,
):
    """asrfit.testing's reference plan (batches 32 / 12 / 5 over 0-4-10-20 s) for xls-r-300m."""
    return make_plan(
        model="xls-r-300m",
        setup=Setup(
            precision=precision,
            gradient_checkpointing=True,
            optimizer=optimizer,
            zero_stage=zero_stage,
            offload_optimizer=offload,
            offload_params=offload_params,
            world_size=world_size,
        ),
        utterance_fractions=(0.5, 0.4, last_fraction),
        num_workers=4,
        long_utterances=long_utterances,
        long_utterance_fraction=0.01,
        data_reasons=["cache: fits in RAM"],
    )


def quiet_export(plan, fmt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export_plan(plan, fmt)


# ---------------------------------------------------------------- generic behaviour


def test_unknown_format_names_every_known_one():
    with pytest.raises(ConfigError) as info:
        export_plan(example_plan(), "fairseq")
    message = str(info.value)
    assert "fairseq" in message
    for fmt in ("hf", "deepspeed", "accelerate", "nemo", "lightning"):
        assert fmt in message
    with pytest.raises(ConfigError):
        export_text(example_plan(), "yaml")


def test_format_names_are_case_insensitive_and_have_file_names():
    plan = example_plan()
    assert quiet_export(plan, " HF ") == quiet_export(plan, "hf")
    assert set(EXPORT_FILENAMES) == set(EXPORT_FORMATS)


@pytest.mark.parametrize(
    "setup",
    [
        dict(precision="fp16", zero_stage=0, world_size=4),
        dict(precision="bf16", zero_stage=3, world_size=2, offload=True, offload_params=True),
    ],
)
def test_export_never_mutates_the_plan_and_returns_fresh_data(setup):
    plan = example_plan(**setup)
    before = copy.deepcopy(plan.to_dict())
    for fmt in EXPORT_FORMATS:
        first = quiet_export(plan, fmt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_text(plan, fmt)
        snapshot = copy.deepcopy(first)
        # Vandalise every nested container of the first export; a second one is untouched.
        stack = [first]
        while stack:
            node = stack.pop()
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for _key, value in list(items):
                if isinstance(value, (dict, list)):
                    stack.append(value)
            if isinstance(node, dict):
                node["vandal"] = 1
            else:
                node.append(-1)
        assert quiet_export(plan, fmt) == snapshot
    assert plan.to_dict() == before


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_text_parses_back_to_the_same_data(fmt):
    plan = example_plan(zero_stage=2, world_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = export_text(plan, fmt)
    parsed = yaml.safe_load(text) if fmt in ("accelerate", "nemo") else json.loads(text)
    assert parsed == quiet_export(plan, fmt)
    if fmt in ("accelerate", "nemo"):
        assert text.startswith("# asrfit plan for xls-r-300m on 4 x T4")


# ---------------------------------------------------------------- precision mapping

# precision -> (hf bf16, hf fp16, ds bf16.enabled, ds fp16.enabled, accelerate, lightning, nemo)
PRECISION_TABLE = {
    "fp32": (False, False, False, False, "no", "32-true", "32"),
    "bf16": (True, False, True, False, "bf16", "bf16-mixed", "bf16-mixed"),
    "fp16": (False, True, False, True, "fp16", "16-mixed", "16-mixed"),
    "pure_bf16": (False, False, True, False, "no", "bf16-true", "bf16-true"),
}


@pytest.mark.parametrize("precision", sorted(PRECISION_TABLE))
def test_precision_mapping_without_zero(precision):
    hf_bf16, hf_fp16, ds_bf16, ds_fp16, acc, light, nemo = PRECISION_TABLE[precision]
    plan = example_plan(precision=precision)
    hf = quiet_export(plan, "hf")
    assert (hf["bf16"], hf["fp16"]) == (hf_bf16, hf_fp16)
    ds = quiet_export(plan, "deepspeed")
    assert (ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == (ds_bf16, ds_fp16)
    assert quiet_export(plan, "accelerate")["mixed_precision"] == acc
    assert quiet_export(plan, "lightning")["precision"] == light
    assert quiet_export(plan, "nemo")["trainer"]["precision"] == nemo


@pytest.mark.parametrize("precision", sorted(PRECISION_TABLE))
def test_precision_under_deepspeed_matches_between_hf_accelerate_and_deepspeed(precision):
    # pure_bf16 under DeepSpeed has to switch DeepSpeed's bf16 mode on: HF and Accelerate follow.
    expected = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "pure_bf16": "bf16"}[precision]
    plan = example_plan(precision=precision, zero_stage=2)
    hf = quiet_export(plan, "hf")
    assert hf["bf16"] == (expected == "bf16") and hf["fp16"] == (expected == "fp16")
    assert hf["deepspeed"]["bf16"]["enabled"] == "auto"  # filled from bf16 by transformers
    assert quiet_export(plan, "deepspeed")["bf16"]["enabled"] == (expected == "bf16")
    assert quiet_export(plan, "accelerate")["mixed_precision"] == expected


def test_fp16_gets_dynamic_loss_scaling_and_bf16_does_not():
    fp16 = quiet_export(example_plan(precision="fp16", zero_stage=2), "deepspeed")["fp16"]
    assert fp16 == {
        "enabled": True,
        "loss_scale": 0,  # 0 = dynamic
        "initial_scale_power": 16,  # 65536, GradScaler's initial scale
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    assert quiet_export(example_plan(precision="bf16", zero_stage=2), "deepspeed")["fp16"] == {
        "enabled": False
    }


def test_pure_bf16_under_deepspeed_warns_about_master_weights():
    with pytest.warns(UserWarning, match="master weights"):
        export_plan(example_plan(precision="pure_bf16", zero_stage=2), "deepspeed")


# ---------------------------------------------------------------- DeepSpeed

# Keys from DeepSpeed's config-json documentation and its pydantic config models.
DS_TOP_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "fp16",
    "bf16",
    "zero_optimization",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
}
DS_ZERO_KEYS = {
    "stage",
    "overlap_comm",
    "contiguous_gradients",
    "reduce_bucket_size",
    "offload_optimizer",
    "offload_param",
    "stage3_prefetch_bucket_size",
    "stage3_gather_16bit_weights_on_model_save",
}
DS_FP16_KEYS = {
    "enabled",
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "min_loss_scale",
}


def test_deepspeed_batch_numbers_for_four_gpus():
    ds = quiet_export(example_plan(zero_stage=2, world_size=4), "deepspeed")
    # round(32 / (5 x 4)) = 2 micro-batches: 40 utterances, within half a batch per GPU of 32.
    assert ds["train_micro_batch_size_per_gpu"] == 5
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 5 * 2 * 4
    assert ds["gradient_clipping"] == 1.0
    single = quiet_export(example_plan(zero_stage=2, world_size=1), "deepspeed")
    assert single["gradient_accumulation_steps"] == FIXED_ACCUMULATION
    assert single["train_batch_size"] == 5 * FIXED_ACCUMULATION


@pytest.mark.parametrize(
    ("setup", "zero"),
    [
        (
            dict(zero_stage=1, world_size=2),
            {
                "stage": 1,
                "overlap_comm": False,
                "contiguous_gradients": True,
                "reduce_bucket_size": 500_000_000,
            },
        ),
        (
            dict(zero_stage=2, world_size=4, offload=True),
            {
                "stage": 2,
                "overlap_comm": False,
                "contiguous_gradients": True,
                "reduce_bucket_size": 500_000_000,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
            },
        ),
        (
            dict(zero_stage=3, world_size=4, offload=True, offload_params=True),
            {
                "stage": 3,
                "overlap_comm": True,
                "contiguous_gradients": True,
                "reduce_bucket_size": 500_000_000,
                "stage3_prefetch_bucket_size": 50_000_000,
                "stage3_gather_16bit_weights_on_model_save": True,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu", "pin_memory": True},
            },
        ),
        (
            dict(zero_stage=3, world_size=2),
            {
                "stage": 3,
                "overlap_comm": True,
                "contiguous_gradients": True,
                "reduce_bucket_size": 500_000_000,
                "stage3_prefetch_bucket_size": 50_000_000,
                "stage3_gather_16bit_weights_on_model_save": True,
            },
        ),
    ],
)
def test_deepspeed_zero_and_offload_mapping(setup, zero):
    ds = quiet_export(example_plan(**setup), "deepspeed")
    assert ds["zero_optimization"] == zero
    assert set(ds) <= DS_TOP_KEYS
    assert set(ds["zero_optimization"]) <= DS_ZERO_KEYS
    assert set(ds["fp16"]) <= DS_FP16_KEYS
    assert ds["zero_allow_untested_optimizer"] is True
    assert "zero_force_ds_cpu_optimizer" not in ds  # AdamW: let DeepSpeed use its CPU Adam


def test_offloaded_non_adam_optimizer_is_kept():
    ds = quiet_export(example_plan(zero_stage=2, offload=True, optimizer="adafactor"), "deepspeed")
    assert ds["zero_force_ds_cpu_optimizer"] is False


def test_deepspeed_export_of_a_zero0_plan_warns():
    with pytest.warns(UserWarning, match="ZeRO stage 0"):
        ds = export_plan(example_plan(), "deepspeed")
    assert ds["zero_optimization"] == {
        "stage": 0,
        "overlap_comm": False,
        "contiguous_gradients": True,
    }


# ---------------------------------------------------------------- Hugging Face

transformers = pytest.importorskip("transformers")


def make_args(tmp_path, kwargs):
    extra = {"use_cpu": True} if kwargs.get("bf16") or kwargs.get("fp16") else {}
    return transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs, **extra)


def test_hf_kwargs_build_real_training_arguments_fp32(tmp_path):
    kwargs = quiet_export(example_plan(precision="fp32"), "hf")
    assert "deepspeed" not in kwargs
    args = transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    assert args.per_device_train_batch_size == SMALLEST_BATCH
    assert args.gradient_accumulation_steps == FIXED_ACCUMULATION
    assert args.remove_unused_columns is False
    assert args.max_grad_norm == 1.0
    assert args.dataloader_num_workers == 4
    assert args.dataloader_persistent_workers is True
    assert args.gradient_checkpointing is True  # mirrored from activation_checkpointing
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert args.train_sampling_strategy == "group_by_length"
    assert args.optim.value == "adamw_torch_fused"
    assert (args.bf16, args.fp16) == (False, False)


@pytest.mark.parametrize(
    ("precision", "mixed"), [("bf16", "bf16"), ("fp16", "fp16"), ("pure_bf16", "no")]
)
def test_hf_kwargs_build_real_training_arguments_mixed(tmp_path, precision, mixed):
    args = make_args(tmp_path, quiet_export(example_plan(precision=precision), "hf"))
    assert args.mixed_precision == mixed


@pytest.mark.parametrize(
    ("optimizer", "offload", "optim"),
    [
        ("adamw", False, "adamw_torch_fused"),
        ("adamw", True, "adamw_torch"),
        ("adamw8bit", False, "adamw_bnb_8bit"),
        ("adafactor", False, "adafactor"),
        ("sgd", False, "sgd"),
    ],
)
def test_hf_optimizer_names(tmp_path, optimizer, offload, optim):
    plan = example_plan(
        precision="fp32", optimizer=optimizer, zero_stage=2 if offload else 0, offload=offload
    )
    kwargs = quiet_export(plan, "hf")
    assert kwargs["optim"] == optim
    kwargs.pop("deepspeed", None)  # needs the deepspeed package to construct
    assert make_args(tmp_path, kwargs).optim.value == optim


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_hf_deepspeed_autos_are_filled_by_transformers(tmp_path, precision):
    """transformers' own HfTrainerDeepSpeedConfig fills every "auto" from the arguments."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    plan = example_plan(precision=precision, zero_stage=2, world_size=1, offload=True)
    kwargs = quiet_export(plan, "hf")
    ds = kwargs.pop("deepspeed")
    assert "auto" in json.dumps(ds)
    args = make_args(tmp_path, kwargs)
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(ds))
    hf.trainer_config_process(args)
    hf.trainer_config_finalize(args, model=None, num_training_steps=10)
    assert "auto" not in json.dumps(hf.config)
    # Filled, it is the standalone DeepSpeed export: the same numbers either way.
    assert hf.config == quiet_export(plan, "deepspeed")
    assert hf.is_zero2() and hf.is_offload()
    # The same check catches a hand-edited number that disagrees with the arguments.
    bad = HfTrainerDeepSpeedConfig(dict(copy.deepcopy(ds), train_micro_batch_size_per_gpu=32))
    with pytest.raises(ValueError, match="mismatch"):
        bad.trainer_config_process(args)
        bad.trainer_config_finalize(args, model=None, num_training_steps=10)


# ---------------------------------------------------------------- Accelerate


@pytest.mark.parametrize(
    ("setup", "distributed", "deepspeed_config"),
    [
        (dict(zero_stage=0, world_size=1), "NO", None),
        (dict(zero_stage=0, world_size=4), "MULTI_GPU", None),
        (
            dict(zero_stage=2, world_size=4, offload=True),
            "DEEPSPEED",
            {
                "gradient_accumulation_steps": 2,  # round(32 / (5 x 4)): fixed-batch
                "gradient_clipping": 1.0,
                "offload_optimizer_device": "cpu",
                "offload_param_device": "none",
                "zero3_init_flag": False,
                "zero3_save_16bit_model": False,
                "zero_stage": 2,
            },
        ),
        (
            dict(zero_stage=3, world_size=2, offload=True, offload_params=True),
            "DEEPSPEED",
            {
                "gradient_accumulation_steps": 3,  # round(32 / (5 x 2)): fixed-batch
                "gradient_clipping": 1.0,
                "offload_optimizer_device": "cpu",
                "offload_param_device": "cpu",
                "zero3_init_flag": True,
                "zero3_save_16bit_model": True,
                "zero_stage": 3,
            },
        ),
    ],
)
def test_accelerate_yaml_loads_with_accelerate(tmp_path, setup, distributed, deepspeed_config):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    plan = example_plan(precision="fp16", **setup)
    path = tmp_path / "accelerate.yaml"
    path.write_text(export_text(plan, "accelerate"), encoding="utf-8")
    config = config_args.ClusterConfig.from_yaml_file(str(path))
    assert config.distributed_type == DistributedType(distributed)
    assert config.num_processes == setup["world_size"]
    assert config.mixed_precision == "fp16"
    assert config.deepspeed_config == (deepspeed_config or {})
    # `accelerate launch` copies deepspeed_config keys onto its own arguments: they must exist.
    launch_args = launch_command_parser().parse_args(["train.py"])
    for key in config.deepspeed_config:
        assert hasattr(launch_args, key), key


# ---------------------------------------------------------------- NeMo

# Field names of NeMo 2.x's LhotseDataLoadingConfig (nemo/collections/common/data/lhotse/
# dataloader.py); NeMo is not installable here (it pins its own torch and Lightning), so this
# list is the one comparison against names copied from the consumer.
NEMO_LHOTSE_KEYS = {
    "concurrent_bucketing",
    "bucketing_2d_strict_mode",
    "drop_last",
    "seed",
    "shard_seed",
    "num_cuts_for_bins_estimate",
    "use_bucketing",
    "num_buckets",
    "bucket_duration_bins",
    "bucket_batch_size",
    "batch_duration",
    "batch_size",
    "min_duration",
    "max_duration",
    "shuffle",
    "num_workers",
    "pin_memory",
    "bucket_buffer_size",
    "cuda_expandable_segments",
    "shuffle_buffer_size",
    "quadratic_duration",
}


def test_nemo_snippet_values():
    plan = example_plan(precision="bf16", world_size=4)
    with pytest.warns(UserWarning, match="drops them"):
        text = export_text(plan, "nemo")
    data = yaml.safe_load(text)
    ds = data["model"]["train_ds"]
    assert ds["use_lhotse"] is True and ds["use_bucketing"] is True
    assert ds["num_buckets"] == 3
    assert ds["bucket_duration_bins"] == [4.0, 10.0, 20.0]
    assert ds["bucket_batch_size"] == [32, 12, 5]
    assert ds["batch_duration"] is None
    assert (ds["min_duration"], ds["max_duration"]) == (0.0, 20.0)
    assert ds["num_workers"] == 4 and ds["shuffle"] is True
    assert ds["bucket_buffer_size"] == 10_000  # 2 * 32 / 0.5 = 128 cuts needed: lhotse's default
    assert ds["cuda_expandable_segments"] is True
    assert ds["bucketing_2d_strict_mode"] is False  # 1-D (duration) buckets only
    assert ds["shard_seed"] == "randomized" and ds["concurrent_bucketing"] is True
    assert set(ds) - {"use_lhotse"} <= NEMO_LHOTSE_KEYS
    assert data["trainer"] == {
        "accelerator": "gpu",
        "devices": 4,
        "num_nodes": 1,
        "strategy": "ddp",
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
        "gradient_clip_val": 1.0,
        "use_distributed_sampler": False,
    }


def test_nemo_buffer_grows_for_a_rare_bucket():
    # Last bucket holds 0.05 % of utterances: 2 * 5 / 0.0005 = 20 000 cuts to fill two batches.
    plan = example_plan(last_fraction=0.0005, long_utterances="filter")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "filter" plans raise no chunking warning
        ds = export_plan(plan, "nemo")["model"]["train_ds"]
    assert ds["bucket_buffer_size"] == 20_000
    tiny = example_plan(last_fraction=1e-7, long_utterances="filter")
    assert export_plan(tiny, "nemo")["model"]["train_ds"]["bucket_buffer_size"] == 100_000  # capped


# ---------------------------------------------------------------- Lightning


@pytest.mark.parametrize(
    ("setup", "strategy", "approximate"),
    [
        (dict(zero_stage=0, world_size=1), "auto", False),
        (dict(zero_stage=0, world_size=4), "ddp", False),
        (dict(zero_stage=1, world_size=4), "deepspeed_stage_1", False),
        (dict(zero_stage=2, world_size=4), "deepspeed_stage_2", False),
        (dict(zero_stage=2, world_size=4, offload=True), "deepspeed_stage_2_offload", False),
        (dict(zero_stage=3, world_size=4), "deepspeed_stage_3", False),
        (
            dict(zero_stage=3, world_size=4, offload=True, offload_params=True),
            "deepspeed_stage_3_offload",
            False,
        ),
        (dict(zero_stage=3, world_size=4, offload=True), "deepspeed_stage_3_offload", True),
        (dict(zero_stage=3, world_size=4, offload_params=True), "deepspeed_stage_3_offload", True),
        (dict(zero_stage=1, world_size=4, offload=True), "deepspeed_stage_2_offload", True),
    ],
)
def test_lightning_trainer_kwargs(setup, strategy, approximate):
    plan = example_plan(precision="fp16", **setup)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kwargs = export_plan(plan, "lightning")
    assert any("no registered strategy" in str(w.message) for w in caught) == approximate
    assert kwargs == {
        "accelerator": "gpu",
        "devices": setup["world_size"],
        "num_nodes": 1,
        "strategy": strategy,
        "precision": "16-mixed",
        # fixed batch of 5: round(32 / (5 x world size)) micro-batches per step
        "accumulate_grad_batches": max(1, round(32 / (5 * setup["world_size"]))),
        "gradient_clip_val": 1.0,
    }
    # tests/test_lightning_integration.py checks each name against Lightning's own registry


def test_a_cpu_plan_exports_to_the_cpu():
    # a plan made where no GPU was found (`asrfit plan --gpu auto` there, `asrfit train`'s own)
    plan = copy.deepcopy(example_plan(precision="fp32"))
    plan.gpu = "cpu-only"
    assert quiet_export(plan, "lightning")["accelerator"] == "cpu"
    assert quiet_export(plan, "nemo")["trainer"]["accelerator"] == "cpu"
    assert quiet_export(plan, "accelerate")["use_cpu"] is True
    gpu = example_plan(precision="fp32")
    assert quiet_export(gpu, "lightning")["accelerator"] == "gpu"
    assert quiet_export(gpu, "accelerate")["use_cpu"] is False
