"""ZeRO sharding and data parallelism applied to a traced breakdown, **by formula**.

The trace runs one process with whole model states; what DeepSpeed and DDP change is
counted here from the breakdown at the peak:

- DDP (world size > 1, ZeRO 0): its gradient buckets, flat buffers allocated when the model
  is wrapped and kept while it lives, hold a copy of every trainable gradient
  (``gradient_as_bucket_view=False``, the PyTorch default): one gradient's bytes per
  trainable parameter, live at every phase, on top of the gradients the step holds (none
  in the forward pass after ``zero_grad(set_to_none=True)``, all of them after backward).
- DeepSpeed keeps parameters and gradients in the training precision (bf16/fp16: 2 bytes)
  and, in the optimizer state, an fp32 master copy of the parameters and an fp32 copy of its
  gradient partition (the optimizer steps on fp32): with Adam 4 + 8 + 4 = 16 bytes per
  parameter, sharded, as DeepSpeed's own ``estimate_zero2_model_states_mem_needs`` counts.
- Stage 1 shards optimizer state over the world size; stage 2 also gradients; every stage
  holds a reduce bucket of ``reduce_bucket_size`` = 5e8 elements (DeepSpeed allocates it
  whole with contiguous gradients, however small the model); stage 3 also parameters
  (plus the gathered parameters in flight, ``stage3_prefetch_bucket_size`` = 5e7 elements
  at most, DeepSpeed's defaults).
- Offload moves the (sharded) optimizer state, and in stage 3 optionally the parameters,
  to host memory.

Activations and temporaries are left as traced.
"""

from __future__ import annotations

from dataclasses import replace

from asrfit.memory.setup import Precision, Setup

REDUCE_BUCKET_ELEMENTS = 500_000_000
PREFETCH_BUCKET_ELEMENTS = 50_000_000


def gradient_bytes(setup: Setup, trainable_params: int) -> int:
    """Bytes of one gradient per trainable parameter, in the parameters' dtype (fp32 under
    mixed precision, bf16 for pure bf16): the step's gradients, and DDP's buckets."""
    return trainable_params * (2 if setup.precision is Precision.PURE_BF16 else 4)


def shard_breakdown(
    breakdown: dict[str, int], setup: Setup, trainable_params: int
) -> tuple[dict[str, int], list[str]]:
    """Return the per-device breakdown under ``setup``'s ZeRO stage and world size, and notes.

    Args:
        breakdown: Category -> bytes at the traced peak (one process, whole model states).
        setup: The setup (its ``zero_stage``, offload flags and ``world_size`` are applied).
        trainable_params: Number of trainable parameters.
    """
    out = dict(breakdown)
    notes: list[str] = []
    n = setup.world_size
    if setup.zero_stage == 0:
        if n > 1:
            buckets = gradient_bytes(setup, trainable_params)
            out["gradients"] = out.get("gradients", 0) + buckets
            notes.append(
                f"DDP: gradient buckets hold every trainable gradient, {buckets / 2**30:.2f} GiB "
                "in every phase (gradient_as_bucket_view=False)"
            )
        return out, notes
    half = setup.precision in (Precision.BF16, Precision.FP16)
    if half:
        master = out.get("parameters", 0)
        out["parameters"] = master // 2
        out["gradients"] = out.get("gradients", 0) // 2
        fp32_grads = 4 * trainable_params
        out["optimizer_state"] = out.get("optimizer_state", 0) + master + fp32_grads
        notes.append(
            "DeepSpeed mixed precision: 2-byte params/grads, fp32 master weights and fp32 "
            "gradient partition in optimizer state"
        )
    elem = 2 if half else 4
    out["optimizer_state"] = 0 if setup.offload_optimizer else out.get("optimizer_state", 0) // n
    notes.append(
        f"ZeRO-{setup.zero_stage}: optimizer state / {n}"
        + (" then offloaded to CPU" if setup.offload_optimizer else "")
    )
    # With contiguous gradients (as asrfit's DeepSpeed export sets them, at every stage)
    # DeepSpeed allocates the whole reduce bucket, torch.empty(reduce_bucket_size) in the
    # gradients' precision, however few parameters the model has
    bucket = REDUCE_BUCKET_ELEMENTS * elem
    if setup.zero_stage == 1:
        out["gradients"] = out.get("gradients", 0) + bucket
        notes.append("ZeRO-1: gradients + reduce bucket")
    if setup.zero_stage >= 2:
        out["gradients"] = out.get("gradients", 0) // n + bucket
        notes.append(f"ZeRO-2: gradients / {n} + reduce bucket")
    if setup.zero_stage == 3:
        gathered = min(PREFETCH_BUCKET_ELEMENTS, trainable_params) * elem
        out["parameters"] = (
            0 if setup.offload_params else out.get("parameters", 0) // n
        ) + gathered
        notes.append(
            f"ZeRO-3: parameters / {n}"
            + (" offloaded to CPU" if setup.offload_params else "")
            + " + prefetch bucket"
        )
    notes.append("model states sharded by formula, not traced")
    return out, notes


def unmodelled_step_time(setup: Setup) -> str:
    """What a step's predicted time (the traced kernels) leaves out for this setup, as a clause
    to append to the time's description ("" when it leaves nothing out)."""
    left = []
    if setup.world_size > 1 or setup.zero_stage:
        left.append(
            "the collectives between processes (DDP's all-reduce, ZeRO's reduce-scatter and "
            "gathers)"
        )
    if setup.offload_optimizer or setup.offload_params:
        left.append("offload's host transfers and CPU optimizer step")
    if not left:
        return ""
    return "; not in the step time: " + " and ".join(left)


def offloaded_bytes(states: dict[str, int], setup: Setup, trainable_params: int) -> int:
    """Bytes of ``states`` (whole-model, one process) that CPU offload keeps in host memory
    per process: the per-device states without offload less those with it."""
    kept = replace(setup, offload_optimizer=False, offload_params=False)
    on_gpu, _ = shard_breakdown(states, kept, trainable_params)
    sharded, _ = shard_breakdown(states, setup, trainable_params)
    return sum(on_gpu.values()) - sum(sharded.values())
