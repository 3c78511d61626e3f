"""DDP's gradient buckets, as asrfit counts them, against the bucket sizes PyTorch's DDP
reports for a real wrapped model (``_get_ddp_logging_data``, one gloo process on the CPU).

The buckets are allocated when the model is wrapped and live as long as it does, so the
per-device memory of a DDP step holds them in every phase, the forward pass included,
where the step itself holds no gradients after ``zero_grad(set_to_none=True)``.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from asrfit.memory.cuda.zero import shard_breakdown
from asrfit.memory.setup import Setup
from asrfit.models.conformer import conformer_config
from asrfit.models.conformer.modeling import ConformerForCTC


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("freeze_subsampling", [False, True])
def test_ddp_buckets_hold_every_trainable_gradient_in_every_phase(
    one_process_group, freeze_subsampling
):
    torch.manual_seed(0)
    model = ConformerForCTC(conformer_config("tiny"))
    if freeze_subsampling:  # frozen parameters get no bucket
        for p in model.encoder.subsampling.parameters():
            p.requires_grad_(False)
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    logged = wrapped._get_ddp_logging_data()
    assert not logged["gradient_as_bucket_view"]
    torch_bytes = sum(int(size) for size in str(logged["bucket_sizes"]).split(", "))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    forward_peak = {"parameters": 4 * sum(p.numel() for p in model.parameters()), "gradients": 0}
    out, notes = shard_breakdown(forward_peak, Setup(precision="bf16", world_size=4), trainable)
    assert out["gradients"] == torch_bytes  # no gradient of the step yet, the buckets all the same
    assert any("DDP" in note for note in notes)
    after_backward = {**forward_peak, "gradients": 4 * trainable}
    out, _ = shard_breakdown(after_backward, Setup(precision="bf16", world_size=4), trainable)
    assert out["gradients"] == 4 * trainable + torch_bytes
    alone, _ = shard_breakdown(forward_peak, Setup(precision="bf16", world_size=1), trainable)
    assert alone["gradients"] == 0  # one process: no DDP, no buckets


def test_the_step_time_says_what_it_leaves_out_across_processes() -> None:
    from asrfit.memory.cuda.zero import unmodelled_step_time

    assert unmodelled_step_time(Setup(precision="bf16")) == ""
    assert "all-reduce" in unmodelled_step_time(Setup(precision="bf16", world_size=4))
    offload = Setup(precision="bf16", zero_stage=2, offload_optimizer=True)
    assert "reduce-scatter" in unmodelled_step_time(offload)
    assert "host transfers" in unmodelled_step_time(offload)
