"""Is wav2vec2-conformer's fp32 relative position table freed in a plain step? (issue 11)

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/cast_buffer_check.py``

Under bf16 autocast the first forward replaces the table (9999 x hidden, fp32) by a bf16
copy. This counts the process's bytes in use at glibc malloc (``mallinfo2``: ``uordblks``
plus ``hblkhd``; the c10 CPU allocator allocates there) before and after the first plain
training step, with no profiler and no dispatch mode: if the fp32 table were still alive the
change net of the optimizer state would be about +1 x the bf16 table; if it was freed, about
-1 x the bf16 table (fp32 freed, bf16 made), plus the small caches a first step leaves.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _heldout_more  # noqa: E402
import _truth  # noqa: E402

from asrfit.memory.generic import speech_adapter  # noqa: E402
from asrfit.memory.optimizers import make_optimizer  # noqa: E402
from asrfit.memory.simulate import _build  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def main() -> None:
    """Print the in-use change over the first plain step against both hypotheses."""
    torch.set_num_threads(1)
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2

    def in_use() -> int:
        gc.collect()
        m = libc.mallinfo2()
        return m.uordblks + m.hblkhd

    case = next(c for c in _heldout_more.held_out_more() if "relative bf16" in c.name)
    adapter = speech_adapter(case.make_config())
    inputs = _truth.real_inputs_from_adapter(adapter, case.batch)

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        batch = {k: v.clone() if torch.is_tensor(v) else v for k, v in inputs.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = adapter.loss(model, batch)
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # a warm-up model first, so the measured step finds oneDNN and autograd caches made
    torch.manual_seed(0)
    warm = _build(adapter, case.setup)
    step(warm, make_optimizer(case.setup, [p for p in warm.parameters() if p.requires_grad]))
    del warm
    torch.manual_seed(0)
    model = _build(adapter, case.setup)
    optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
    table = model.wav2vec2_conformer.encoder.embed_positions
    fp32_bytes = table.pe.untyped_storage().nbytes()
    before = in_use()
    step(model, optimizer)
    change = in_use() - before
    state = _truth.storage_bytes(_truth.optimizer_tensors(optimizer))
    bf16_bytes = table.pe.untyped_storage().nbytes()
    print(f"{case.name}: table fp32 {fp32_bytes} B -> {table.pe.dtype} {bf16_bytes} B")
    print(f"in-use change over the first plain step, net of optimizer state: {change - state} B")
    print(f"  if the fp32 table were still alive: about +{bf16_bytes} B")
    print(f"  if it was freed:                    about {bf16_bytes - fp32_bytes} B")


if __name__ == "__main__":
    main()
