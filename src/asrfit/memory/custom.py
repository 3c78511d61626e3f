"""Simulate any ``nn.Module`` with any loss function: the public call for custom models.

Example::

    from asrfit.memory import simulate_model

    def make_batch():  # real tensors, as a DataLoader would give them
        return {"x": torch.randn(8, 400, 80), "lengths": torch.full((8,), 400)}

    result = simulate_model(
        lambda: MyEncoder(d_model=256),
        make_batch,
        lambda model, batch: model(batch["x"], batch["lengths"]).mean(),
        setup=Setup(precision="bf16"),
        target="cuda",
    )
    print(result.peak_bytes)

The model is built under ``FakeTensorMode`` (no weights are allocated), so ``build`` must
construct it with ordinary ``torch`` calls and no file reads of real weights. The batch is
made for real (it should be cheap: audio and labels), then turned into fake tensors; small
tensors and every integer tensor keep their real values, so lengths, masks and labels drive
length-dependent code (CTC, ``masked_select``, ``.item()``) exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily

from asrfit.memory.setup import Setup
from asrfit.memory.simulate import StepMemory, simulate_step
from asrfit.memory.step import BatchShape, StepAdapter
from asrfit.memory.trace.tracker import StorageTracker
from asrfit.memory.trace.values import fake_with_value

# Float tensors up to this many elements keep their real values in the trace.
_SMALL_VALUE_NUMEL = 4096


def _to_fake(tracker: StorageTracker, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_fake(tracker, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fake(tracker, v) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    integer = not (value.is_floating_point() or value.is_complex())
    if integer or value.numel() <= _SMALL_VALUE_NUMEL:
        return fake_with_value(tracker, value)
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    return mode.from_tensor(value) if mode is not None else value


def _batch_shape(batch: Any) -> BatchShape:
    tensors = [t for t in _flatten(batch) if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not tensors:
        raise ValueError(
            "simulate_model: make_batch returned no tensors; return the model's inputs "
            "(a dict, list or tensor) as a DataLoader would."
        )
    first = max(tensors, key=lambda t: t.numel())
    length = first.shape[1] if first.dim() > 1 else 1
    return BatchShape(int(first.shape[0]), int(max(1, length)), 1)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    return [value]


def simulate_model(
    build: Callable[[], nn.Module],
    make_batch: Callable[[], Any],
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    *,
    setup: Setup | None = None,
    target: str = "cuda",
    name: str = "custom",
    steps: int = 2,
    supports_checkpointing: bool = False,
) -> StepMemory:
    """Simulate training steps of any module and loss on fake tensors.

    Args:
        build: Builds the model (called under ``FakeTensorMode``; no real weights).
        make_batch: Returns one real batch (a tensor, or a dict/list/tuple of them).
        loss_fn: ``(model, batch) -> scalar loss``; the batch arrives as fake tensors.
        setup: Precision, checkpointing, optimizer (Default: fp32 AdamW).
        target: "cuda" (Default) or "cpu": whose kernels to follow (see ``simulate_step``).
        name: Name for reports.
        steps: Steps to trace (Default: 2; the second is the steady state).
        supports_checkpointing: Whether ``setup.gradient_checkpointing`` may be asked of a
            model without ``gradient_checkpointing_enable`` (it must then checkpoint itself).

    Returns:
        The peak and its breakdown, as :func:`asrfit.memory.simulate.simulate_step` gives it.

    Raises:
        ValueError: When ``make_batch`` returns no tensor, or checkpointing is asked of a
            model that cannot do it.
    """
    with unset_fake_temporarily():
        real_batch = make_batch()
    shape = _batch_shape(real_batch)

    def make_inputs(_shape: BatchShape, tracker: StorageTracker) -> dict[str, Any]:
        with unset_fake_temporarily():
            batch = make_batch()
        return {"batch": _to_fake(tracker, batch)}

    def loss(model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        return loss_fn(model, inputs["batch"])

    adapter = StepAdapter(
        name=name,
        build=build,
        make_inputs=make_inputs,
        loss=loss,
        supports_checkpointing=supports_checkpointing,
    )
    return simulate_step(adapter, shape, setup, target=target, steps=steps)
