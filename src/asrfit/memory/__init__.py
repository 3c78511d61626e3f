"""Simulate one training step on fake tensors and predict peak memory by category.

Public calls: :func:`asrfit.memory.simulate_model` (any ``nn.Module`` and loss function),
:func:`asrfit.memory.simulate.simulate_step` with
:func:`asrfit.memory.models.generic.speech_adapter` (the supported speech families), and
:func:`asrfit.memory.report.simulate` (from a model name; ``asrfit.simulate``).

Subpackages, lowest first: ``trace`` (the fake-tensor trace), ``steptime`` (op counts and
their seconds), ``models`` (step adapters), ``cuda`` (allocator, ZeRO / DDP), ``fit`` (cost
model, full depth from reduced depths). docs/architecture.md gives the order.
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate_model"]


def __getattr__(name: str) -> Any:
    if name == "simulate_model":
        from asrfit.memory.custom import simulate_model

        return simulate_model
    raise AttributeError(f"module 'asrfit.memory' has no attribute {name!r}")
