"""What is: the hardware, the dataset and the model a plan is made from.

- :mod:`asrfit.profiles.hardware`: ``HardwareProfile``, detected or from the GPU catalog.
- :mod:`asrfit.profiles.dataset`: ``DatasetProfile`` from manifests, HF datasets, lhotse cuts, folders.
- :mod:`asrfit.profiles.model`: ``ModelProfile`` built on the meta device, and the bundled configs.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "HardwareProfile": "asrfit.profiles.hardware",
    "DatasetProfile": "asrfit.profiles.dataset",
    "ModelProfile": "asrfit.profiles.model",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asrfit.profiles' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
