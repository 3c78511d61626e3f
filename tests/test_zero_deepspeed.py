"""ZeRO sharding of model states checked against DeepSpeed's own model-state estimators.

``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` count
bf16/fp16 parameters and gradients (2 bytes each) plus 16 bytes per parameter of optimizer
state (fp32 master, Adam moments, fp32 gradient partition), sharded by the GPUs over all
nodes. asrfit's formula must give the same bytes, except for what it adds on purpose (the
communication buckets DeepSpeed allocates, which its estimators leave out) — each such term
is named and computed here, not fitted, from the bucket sizes DeepSpeed's own config class
reads out of the config ``asrfit export --to deepspeed`` writes, and allocated as DeepSpeed
allocates them: the whole reduce bucket (``torch.empty(reduce_bucket_size)`` with contiguous
gradients), whatever the model's size.
"""

from __future__ import annotations

import pytest

from asrfit.memory.cuda.zero import shard_breakdown
from asrfit.memory.setup import Setup
from asrfit.plan.exports import export_plan
from tests.test_exports import example_plan

stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

zero_config = pytest.importorskip("deepspeed.runtime.zero.config")


def deepspeed_buckets(stage: int, offload: bool = False) -> tuple[int, int]:
    """Reduce and stage-3 prefetch bucket elements, as DeepSpeed reads asrfit's exported config."""
    config = export_plan(example_plan(zero_stage=stage, world_size=2, offload=offload), "deepspeed")
    zero = zero_config.DeepSpeedZeroConfig(**config["zero_optimization"])
    assert zero.contiguous_gradients  # so DeepSpeed allocates the reduce bucket whole
    return zero.reduce_bucket_size, zero.prefetch_bucket_size


# (parameters, GPUs per node, nodes): a tiny model, a wav2vec2-base and an XLS-R-300M size.
CASES = [
    (1_000_000, 1, 1),
    (94_000_000, 4, 1),
    (315_000_000, 8, 2),
    (315_000_000, 2, 1),
]


def traced_fp32_adam(params: int) -> dict[str, int]:
    """What one traced process holds for an fp32 AdamW model: 4 + 4 + 8 bytes per parameter."""
    return {"parameters": 4 * params, "gradients": 4 * params, "optimizer_state": 8 * params}


def asrfit_states(params: int, world: int, **setup: object) -> tuple[int, dict[str, int]]:
    out, _ = shard_breakdown(
        traced_fp32_adam(params),
        Setup(precision="bf16", world_size=world, **setup),
        trainable_params=params,
    )
    return sum(out.values()), out


@pytest.mark.parametrize(("params", "per_node", "nodes"), CASES)
def test_zero2_matches_deepspeed_plus_the_reduce_bucket(params, per_node, nodes):
    world = per_node * nodes
    ours, _ = asrfit_states(params, world, zero_stage=2)
    _, ds_gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        params, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=False
    )
    reduce_bucket = 2 * deepspeed_buckets(2)[0]  # bf16 elements
    # Integer division of the shards: at most a few bytes apart.
    assert abs(ours - reduce_bucket - ds_gpu) <= 4


@pytest.mark.parametrize(("params", "per_node", "nodes"), CASES)
def test_zero2_offload_keeps_params_gradient_shard_and_bucket(params, per_node, nodes):
    world = per_node * nodes
    ours, out = asrfit_states(params, world, zero_stage=2, offload_optimizer=True)
    _, ds_gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(
        params, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=True
    )
    assert out["optimizer_state"] == 0
    # DeepSpeed's offload estimate is the bf16 parameters only; asrfit keeps the gradient
    # shard and the reduce bucket on the GPU (they are filled there before the copy out).
    extra = 2 * params // world + 2 * deepspeed_buckets(2, offload=True)[0]
    assert abs(ours - extra - ds_gpu) <= 4


@pytest.mark.parametrize(("params", "per_node", "nodes"), CASES)
def test_zero3_matches_deepspeed_sharded_bytes(params, per_node, nodes):
    world = per_node * nodes
    largest_layer = params // 10
    ours, _ = asrfit_states(params, world, zero_stage=3)
    _, ds_gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
        params,
        largest_layer,
        num_gpus_per_node=per_node,
        num_nodes=nodes,
        cpu_offload=False,
        cpu_offload_params=False,
    )
    # DeepSpeed: 4 bytes x largest layer (gathered bf16 params and grads) + 18 bytes/param
    # sharded. asrfit: the prefetch and (whole) reduce buckets instead of the largest layer, and the
    # bf16 gradient partition (2 bytes/param sharded), which the stage-3 estimator folds away.
    reduce, prefetch = deepspeed_buckets(3)
    # the prefetch bucket bounds the parameters gathered in flight (at most the whole model)
    buckets = 2 * min(prefetch, params) + 2 * reduce
    grad_partition = 2 * params // world
    assert abs((ours - buckets - grad_partition) - (ds_gpu - 4 * largest_layer)) <= 4


@pytest.mark.parametrize("world", [1, 2, 8, 64])
def test_optimizer_state_shrinks_with_world_size_as_deepspeed_counts(world):
    params = 10_000_000
    _, out = asrfit_states(params, world, zero_stage=1)
    # 16 bytes per parameter (fp32 master + two Adam moments + fp32 gradient), sharded.
    assert abs(out["optimizer_state"] - 16 * params // world) <= 4
    assert out["parameters"] == 2 * params  # stage 1 shards neither parameters
    # nor gradients; with contiguous gradients stage 1 also fills the whole reduce bucket
    # (DeepSpeed registers its gradient hooks and allocates the bucket at every stage)
    assert out["gradients"] == 2 * params + 2 * deepspeed_buckets(1)[0]


# (parameters, GPUs per node, nodes, stage, offload parameters too). DeepSpeed's ZeRO-2 offload
# estimate is its 16 bytes per parameter for at most 4 GPUs (beyond, 4 bytes per GPU) and is
# not divided among nodes, while its ZeRO-3 one is: the ZeRO-2 cases are single-node ones.
OFFLOAD_CASES = [
    (1_000_000, 1, 1, 2, False),
    (94_000_000, 4, 1, 2, False),
    (94_000_000, 4, 1, 3, False),
    (315_000_000, 2, 2, 3, False),
    (94_000_000, 4, 1, 3, True),
    (315_000_000, 8, 2, 3, True),
]


@pytest.mark.parametrize(("params", "per_node", "nodes", "stage", "offload_params"), OFFLOAD_CASES)
def test_offloaded_host_memory_per_node_matches_deepspeed_estimates(
    params, per_node, nodes, stage, offload_params
):
    from asrfit.memory.cuda.zero import offloaded_bytes
    from asrfit.plan.data_side import offload_host_bytes

    world = per_node * nodes
    setup = Setup(
        precision="bf16",
        world_size=world,
        zero_stage=stage,
        offload_optimizer=True,
        offload_params=offload_params,
    )
    ours = offload_host_bytes(offloaded_bytes(traced_fp32_adam(params), setup, params), per_node)
    if stage == 2:
        ds_cpu, _ = stage_1_and_2.estimate_zero2_model_states_mem_needs(
            params, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=True
        )
    else:
        ds_cpu, _, _ = stage3.estimate_zero3_model_states_mem_needs(
            params,
            params // 10,
            num_gpus_per_node=per_node,
            num_nodes=nodes,
            cpu_offload=True,
            cpu_offload_params=offload_params,
        )
    assert abs(ours - ds_cpu) <= 16 * world  # the shards' integer division
