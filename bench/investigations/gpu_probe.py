"""Where a GPU step's memory and time go that the simulator misses (raw data for offline reading).

Question (2026-11-27): Where do a GPU step's memory and time go that the simulator missed on the
grid cases it under-predicted?

Answer: Three mechanisms, read from the caching allocator's history on a lent H200: CUDA
autocast runs layer norm, group norm and softmax in fp32; CUDA layer norm copies a strided
input; Parakeet-TDT's 14-16 MiB is cuDNN's LSTM backward workspace. The first two are in the
simulator since; the third is not modelled (cuDNN picks its size) (docs/benchmarks.md, "Memory:
three mechanisms, from the allocator's history").

Run on a machine with a CUDA GPU:
``PYTHONPATH=src python3 -m bench investigations.gpu_probe --out $OUT``

1. ``snapshot-*.pickle``: the CUDA caching allocator's history over the second step of three
   under-predicted grid cases (``torch.cuda.memory._record_memory_history``), to be read on
   a CPU (which blocks are live at the peak, and from which Python frames).
2. ``enqueue.json``: per step, the seconds until the Python step returns (the host's work:
   the GPU runs behind it) and until the GPU is done, for the small step-time cases; and
   one large fp32 step with TF32 matmuls off (PyTorch's default) and on.
3. ``profile-*.txt``: ``torch.profiler`` tables (host time by op, calls) of two small steps.

Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch


def _model(case: object) -> tuple:
    from asrfit.memory.trace.optimizers import make_optimizer
    from bench import _grid

    model = _grid.build_real_model(case, "cuda")
    optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
    batch = _grid.make_real_inputs(case, model.config, "cuda")
    return model, optimizer, batch


def snapshots(out: Path) -> None:
    from bench import _grid

    for case in (
        _grid.Case("wav2vec2", "bf16", False, "adamw", 3, 2.0, 10),
        _grid.Case("wav2vec2", "fp32", False, "adamw", 1, 1.0, 8),
        _grid.Case("parakeet-tdt", "fp32", False, "adamw", 1, 1.0, 8),
    ):
        model, optimizer, batch = _model(case)
        _grid._train_step(case, model, optimizer, "cuda", 1, batch)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        _grid._train_step(case, model, optimizer, "cuda", 2, batch)
        torch.cuda.synchronize()
        name = case.name.replace(" ", "_")
        torch.cuda.memory._dump_snapshot(str(out / f"snapshot-{name}.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
        print(name, torch.cuda.max_memory_allocated(), flush=True)
        del model, optimizer, batch
        torch.cuda.empty_cache()


def _enqueue(case: object, steps: int = 7) -> dict:
    from bench import _grid

    model, optimizer, batch = _model(case)
    host, total = [], []
    for i in range(2 + steps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        _grid._train_step(case, model, optimizer, "cuda", i, batch)
        returned = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        if i >= 2:
            host.append(returned - started)
            total.append(done - started)
    del model, optimizer, batch
    torch.cuda.empty_cache()
    return {"case": case.name, "host": statistics.median(host), "total": statistics.median(total)}


def enqueue(out: Path) -> None:
    from bench import _grid
    from bench.cases import cases as case_list
    from bench.cases import family_group

    rows = []
    for case in [
        *case_list("step-time-fit", "step-time-1"),
        *family_group("wav2vec2-base", "adamw", 8.0, 100),
    ]:
        try:
            rows.append(_enqueue(case))
        except Exception as exc:  # noqa: BLE001  (reported, the others still run)
            rows.append({"case": case.name, "failure": f"{type(exc).__name__}: {exc}"})
        print(rows[-1], flush=True)
        (out / "enqueue.json").write_text(json.dumps(rows, indent=1))
    big = _grid.Case("wav2vec2-base", "fp32", False, "adamw", 32, 8.0, 100)
    for tf32 in (False, True, False):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        row = _enqueue(big, steps=5)
        row["tf32_matmul"] = tf32
        rows.append(row)
        print(rows[-1], flush=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    (out / "enqueue.json").write_text(json.dumps(rows, indent=1))


def profiles(out: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from bench import _grid

    for case in (
        _grid.Case("wav2vec2", "fp32", False, "adamw", 2, 1.5, 10),
        _grid.Case("whisper", "fp32", False, "sgd", 2, 2.0, 10),
    ):
        model, optimizer, batch = _model(case)
        for i in range(2):
            _grid._train_step(case, model, optimizer, "cuda", i, batch)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                _grid._train_step(case, model, optimizer, "cuda", 2 + i, batch)
            torch.cuda.synchronize()
        averages = prof.key_averages()
        name = case.name.replace(" ", "_")
        (out / f"profile-{name}.txt").write_text(
            averages.table(sort_by="self_cpu_time_total", row_limit=120, max_name_column_width=60)
        )
        print(name, "profiled", flush=True)
        del model, optimizer, batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", nargs="*", default=["snapshots", "enqueue", "profiles"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_probe: CUDA is not available; nothing measured.", file=sys.stderr)
        return
    torch.cuda.set_device(0)
    args.out.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        started = time.perf_counter()
        {"snapshots": snapshots, "enqueue": enqueue, "profiles": profiles}[part](args.out)
        print(f"{part}: {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
