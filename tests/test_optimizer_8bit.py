"""The simulator's 8-bit AdamW state against a real bitsandbytes optimizer's state."""

from __future__ import annotations

import bitsandbytes as bnb
import torch

from asrfit.memory.trace.optimizers import AdamW8bitState


def _state_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, tuple]]:
    seen: dict[int, int] = {}
    layout: dict[str, tuple] = {}
    for i, state in enumerate(optimizer.state.values()):
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and name != "step":
                st = value.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
                layout[f"{i}.{name}"] = (tuple(value.shape), value.dtype)
    return sum(seen.values()), layout


def test_adamw8bit_state_matches_bitsandbytes() -> None:
    """Blockwise 8-bit states, float32 absmax per 256 block, shared qmaps, fp32 below 4096."""
    shapes = [(300, 70), (4096,), (4095,), (64, 64, 3), (10,)]
    real_params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    sim_params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    real = bnb.optim.AdamW8bit(real_params, lr=1e-3)
    sim = AdamW8bitState(sim_params)
    for p in (*real_params, *sim_params):
        p.grad = torch.randn_like(p)
    real.step()
    sim.step()
    real_bytes, real_layout = _state_bytes(real)
    sim_bytes, sim_layout = _state_bytes(sim)
    assert sim_layout == real_layout
    assert sim_bytes == real_bytes
