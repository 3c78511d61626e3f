"""The real counterpart of a simulated step: the same model and batch, on real tensors.

What a measurement needs to compare itself with :func:`asrfit.memory.simulate.simulate_step`
without sharing its arithmetic: the model built as the simulator builds it (same adapter,
default dtype, activation checkpointing, train mode; real weights, seeded by the caller),
the batch the adapter defines (its integer inputs with the values the simulation uses,
float inputs as seeded noise) and a plain training step. ``asrfit calibrate`` and the GPU
benchmarks time and measure these; nothing here predicts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from asrfit.memory.setup import Precision, Setup
from asrfit.memory.simulate import _build, _float_dtype, default_dtype
from asrfit.memory.step import BatchShape, StepAdapter


def float_dtype(setup: Setup) -> torch.dtype:
    """The dtype of the weights under ``setup`` (bf16 for pure bf16, else fp32)."""
    return _float_dtype(setup)


def build_model(adapter: StepAdapter, setup: Setup, device: str = "cpu") -> nn.Module:
    """The adapter's model with real weights on ``device``, built as the simulator builds it."""
    with default_dtype(float_dtype(setup)):
        model = _build(adapter, setup)
    return model.to(device)


def real_inputs(adapter: StepAdapter, batch: BatchShape, setup: Setup, device: str = "cpu") -> dict:
    """Real tensors of the batch the adapter makes for the simulator: the same shapes, the
    same integer values (labels, lengths, masks), float inputs as seeded standard noise."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    from asrfit.memory.trace.tracker import StorageTracker

    tracker = StorageTracker()
    with FakeTensorMode(), default_dtype(float_dtype(setup)):
        fake = adapter.make_inputs(batch, tracker)
        generator = torch.Generator().manual_seed(0)
        real: dict[str, Any] = {}
        with unset_fake_temporarily():
            for name, value in fake.items():
                if not isinstance(value, torch.Tensor):
                    real[name] = value
                    continue
                known = tracker.value_of(value)
                if known is not None:
                    real[name] = known.clone().to(device)
                else:
                    noise = torch.randn(tuple(value.shape), generator=generator)
                    real[name] = noise.to(value.dtype).to(device)
    return real


def autocast_for(setup: Setup, device: str) -> contextlib.AbstractContextManager:
    """The autocast context of ``setup`` on ``device`` (none for fp32 and pure bf16)."""
    dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(setup.precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.split(":")[0], dtype=dtype)


def make_step(
    adapter: StepAdapter, model: nn.Module, setup: Setup, device: str
) -> Callable[[dict], None]:
    """A plain training step of ``model``: forward under autocast, backward, optimizer step,
    gradients set to None (the optimizer is :func:`asrfit.memory.trace.optimizers.make_optimizer`
    of ``setup``)."""
    from asrfit.memory.trace.optimizers import make_optimizer

    optimizer = make_optimizer(setup, [p for p in model.parameters() if p.requires_grad])

    def step(inputs: dict) -> None:
        with autocast_for(setup, device):
            loss = adapter.loss(model, inputs)
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
