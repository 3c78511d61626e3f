"""Is wav2vec2-conformer's fp32 relative position table freed in a plain step? (issue 11)

Question (2026-11-24): Is wav2vec2-conformer's fp32 relative position table freed in a plain
step once bf16 autocast has replaced it by a bf16 copy?

Answer: Yes. Over the first plain step, net of the optimizer state, glibc's bytes in use fall by
1.16 MB (about -1.28 MB if the fp32 table is freed, +1.28 MB if it stays). The -36.9 % the
memory benchmark's truth once read on that case was the harness (the table's fp32 copy, made
before the profile, stayed counted), fixed in ``bench/_truth.py``; no simulator rule changed
(docs/benchmarks.md, memory accuracy on held-out steps).

Run: ``OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python -m bench investigations.cast_buffer_check``

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

import torch

from asrfit.memory.models.generic import speech_adapter
from asrfit.memory.real_step import build_model
from asrfit.memory.trace.optimizers import make_optimizer
from bench import _truth
from bench.cases import case_set


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

    case = next(c for c in case_set("memory-4").cases if "relative bf16" in c.name)
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
    warm = build_model(adapter, case.setup)
    step(warm, make_optimizer(case.setup, [p for p in warm.parameters() if p.requires_grad]))
    del warm
    torch.manual_seed(0)
    model = build_model(adapter, case.setup)
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
