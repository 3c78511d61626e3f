"""Optimizers as the simulator runs them: the real PyTorch / transformers code where it can,
and bitsandbytes' 8-bit AdamW by its documented state layout.

- AdamW and SGD run with ``foreach=True``, PyTorch's default for CUDA parameters (the
  multi-tensor path; its temporaries are part of the step's peak).
- Adafactor is ``transformers.optimization.Adafactor`` with a fixed learning rate.
- 8-bit AdamW (``bitsandbytes.optim.AdamW8bit``) cannot run on fake tensors; :class:`AdamW8bitState`
  allocates exactly the state bitsandbytes allocates (blockwise quantisation, block 256:
  two uint8 states plus two float32 absmax per block; tensors under ``min_8bit_size`` =
  4096 elements keep two float32 states; one pair of 256-entry float32 quantisation maps,
  ``qmap1``/``qmap2``, shared by all 8-bit parameters) and updates parameters in place, as
  its fused kernel does. ``tests/test_optimizer_8bit.py`` checks the state against a real
  ``bitsandbytes.optim.AdamW8bit`` step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch

from asrfit.memory.setup import OptimizerKind, Setup

BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
BNB_QMAP_SIZE = 256  # dynamic quantisation map entries (8 bits)


class AdamW8bitState(torch.optim.Optimizer):
    """The memory behaviour of ``bitsandbytes.optim.AdamW8bit`` (state sizes, in-place update)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})
        self.state = defaultdict(dict)
        self._qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # noqa: D102
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    n = p.numel()
                    if n >= BNB_MIN_8BIT_SIZE:
                        blocks = -(-n // BNB_BLOCK)
                        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)
                        if self._qmaps is None:  # shared by every 8-bit parameter
                            self._qmaps = (
                                torch.zeros(BNB_QMAP_SIZE, dtype=torch.float32),
                                torch.zeros(BNB_QMAP_SIZE, dtype=torch.float32),
                            )
                        state["qmap1"], state["qmap2"] = self._qmaps
                    else:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                p.add_(p.grad, alpha=-group["lr"])


def make_optimizer(setup: Setup, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer of ``setup`` over ``params``, ready to run on fake tensors."""
    kind = setup.optimizer
    if kind is OptimizerKind.ADAMW:
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if kind is OptimizerKind.SGD:
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if kind is OptimizerKind.ADAFACTOR:
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False
        )
    return AdamW8bitState(params)
