"""Held-out GPU check: memory and step time of cases no GPU run had measured, predicted first.

The memory fixes (CUDA autocast's fp32 ops, CUDA layer norm's contiguous copy) and the
step-time model (measured host costs, host + device time, fp32 matmuls without tf32) were
written from the grid cases of ``bench/validate_gpu.py``. This checks them on 24 cases of
the CPU memory benchmark's held-out sets (``bench/cases.py``: memory-1, memory-2 and memory-5; other families, widths,
shapes and setups) that had never run on a GPU:

1. ``--predict FILE`` (any machine, no GPU): each case simulated with ``target="cuda"``;
   the peak (``peak_bytes``) and the step time on the H200's rates are written to FILE
   (committed before the GPU run: ``bench/data/gpu-heldout-predictions.json``).
2. ``--measure FILE`` (CUDA): each case's real model on the GPU (built as the simulator
   builds it, seeded), two steps with the batch made on the host and copied inside the step
   (``torch.cuda.max_memory_allocated`` of the second, above what was allocated before
   the model), then 7 timed steps after 2 warm-ups on a batch already on the GPU
   (median); then, while ``--sim-seconds`` last, the same predictions made on that machine
   (its torch and transformers).
3. ``--render PREDICTIONS MEASURED``: the markdown table.

Run on a lent GPU: ``PYTHONPATH=src python3 -m bench gpu_heldout --measure $OUT/heldout.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch

NAMES = (
    # larger models (bench/cases.py, set memory-5)
    "wav2vec2 h256 x4 layer fp32 adamw 4x4s",
    "hubert h192 x3 group bf16+ckpt sgd 3x6s",
    "data2vec-audio h192 x3 pure_bf16 adafactor 3x5s",
    "wav2vec2-bert h160 x3 bf16 adamw 2x5s",
    "whisper d256 x2 fp32 adafactor 4x10s",
    "speech_to_text d192 x3 fp32+ckpt sgd 3x6s",
    "parakeet-ctc h192 x2 fp32 sgd 4x6s",
    "conformer d192 x4 bf16 adamw 4x8s",
    # bench/cases.py, set memory-1
    "wav2vec2 h80 layer bf16+ckpt adafactor 3x1.7s",
    "hubert h48 layer bf16 sgd 4x1.4s",
    "wavlm h48 group bf16 adamw 2x2.6s",
    "whisper d96 fp32+ckpt adamw 4x2s",
    "whisper d48 bf16 adamw 5x1.5s",
    "parakeet-ctc h48 bf16+ckpt adamw 4x2.4s",
    "parakeet-tdt h80 bf16 sgd 2x1.2s",
    "conformer d96 fp32 adamw 3x3s",
    "conformer d64 bf16 sgd 6x2s",
    "conformer+dec d112 bf16+ckpt adamw 3x2.2s",
    "data2vec-audio h56 bf16 adamw 3x1.6s",
    "sew-d h48 bf16 sgd 2x1.9s",
    "wav2vec2-conformer h48 fp32 adafactor 2x1.8s",
    "speech_to_text d64 bf16+ckpt adamw 3x2.4s",
    # bench/cases.py, set memory-2
    "moonshine h64 fp32 adamw 2x1.8s",
    "lasr-ctc h40 bf16+ckpt adamw 2x3.2s",
)
GPU = "H200"


def cases() -> list[Any]:
    from bench.cases import cases as case_list

    by_name = {c.name: c for c in case_list("memory-1", "memory-2", "memory-5")}
    return [by_name[n] for n in NAMES]


def predict(case: Any) -> dict:
    """The simulator's peak and the step time on the H200's rates."""
    from asrfit.memory.models.generic import speech_adapter
    from asrfit.memory.simulate import simulate_step
    from asrfit.memory.steptime.roofline import step_seconds
    from asrfit.profiles.gpus.catalog import find_gpu
    from asrfit.profiles.rates import gpu_rates

    started = time.perf_counter()
    sim = simulate_step(speech_adapter(case.make_config()), case.batch, case.setup, target="cuda")
    return {
        "case": case.name,
        "peak_bytes": sim.peak_bytes,
        "step_seconds": step_seconds(sim.cost, gpu_rates(find_gpu(GPU))),
        "sim_seconds": time.perf_counter() - started,
    }


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def measure(case: Any, steps: int = 7, device: str = "cuda") -> dict:
    """The real step's peak allocated bytes and its median time on the GPU."""
    import gc

    from asrfit.memory.models.generic import speech_adapter
    from asrfit.memory.real_step import build_model, float_dtype
    from asrfit.memory.setup import Precision
    from asrfit.memory.trace.optimizers import make_optimizer
    from bench import _truth

    gpu = device == "cuda"  # "cpu": a dry run of this function (no memory figure)
    gc.collect()  # the previous case's model and optimizer
    if gpu:
        torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated() if gpu else 0
    adapter = speech_adapter(case.make_config())
    torch.manual_seed(0)
    dtype = float_dtype(case.setup)
    model = build_model(adapter, case.setup, device)
    optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
    host_batch = _truth.real_inputs_from_adapter(adapter, case.batch, dtype)
    autocast = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
        case.setup.precision
    )

    def to_gpu() -> dict:
        return {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in host_batch.items()
        }

    def step(batch: dict | None = None) -> None:
        inputs = batch if batch is not None else to_gpu()
        with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
            loss = adapter.loss(model, inputs)
        loss.backward()
        del loss, inputs
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    step()
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    step()
    sync()
    peak = torch.cuda.max_memory_allocated() - before if gpu else 0
    batch = to_gpu()
    times = []
    for i in range(2 + steps):
        sync()
        started = time.perf_counter()
        step(batch)
        sync()
        if i >= 2:
            times.append(time.perf_counter() - started)
    return {"case": case.name, "peak_bytes": peak, "step_seconds": statistics.median(times)}


def render(predicted: Path, measured: Path) -> str:
    pred = json.loads(predicted.read_text(encoding="utf-8"))
    meas = json.loads(measured.read_text(encoding="utf-8"))
    there = {r["case"]: r for r in meas.get("predicted_there", [])}
    got = {r["case"]: r for r in meas["rows"]}
    lines = [
        "| case | predicted MiB | measured MiB | error | predicted ms | measured ms | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    memory, timing = [], []
    for p in pred["rows"]:
        m = got.get(p["case"])
        if m is None or "failure" in m:
            why = "not measured" if m is None else m["failure"][:80]
            lines.append(f"| {p['case']} | {p['peak_bytes'] / 2**20:.2f} | {why} | | | | |")
            continue
        e_mem = 100 * (p["peak_bytes"] / m["peak_bytes"] - 1)
        e_time = 100 * (p["step_seconds"] / m["step_seconds"] - 1)
        memory.append(e_mem)
        timing.append(e_time)
        note = ""
        if there.get(p["case"], {}).get("peak_bytes", p["peak_bytes"]) != p["peak_bytes"]:
            note = f" (there: {there[p['case']]['peak_bytes'] / 2**20:.2f})"
        lines.append(
            f"| {p['case']} | {p['peak_bytes'] / 2**20:.2f}{note} | {m['peak_bytes'] / 2**20:.2f} "
            f"| {e_mem:+.1f} % | {p['step_seconds'] * 1e3:.2f} | {m['step_seconds'] * 1e3:.2f} "
            f"| {e_time:+.0f} % |"
        )

    def summary(errors: list[float]) -> str:
        if not errors:
            return "none measured"
        return (
            f"median |error| {statistics.median(map(abs, errors)):.1f} %, "
            f"{min(errors):+.1f} % to {max(errors):+.1f} %"
        )

    lines += [
        "",
        f"{len(memory)} cases. Memory: {summary(memory)}. Step time: {summary(timing)}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predict", type=Path)
    parser.add_argument("--measure", type=Path)
    parser.add_argument("--sim-seconds", type=float, default=120.0)
    parser.add_argument("--render", type=Path, nargs=2, metavar=("PREDICTED", "MEASURED"))
    args = parser.parse_args()
    if args.render:
        print(render(*args.render))
        return
    if args.predict:
        rows = []
        for case in cases():
            rows.append(predict(case))
            print(rows[-1], flush=True)
        args.predict.write_text(
            json.dumps({"gpu": GPU, **_versions(), "rows": rows}, indent=1), encoding="utf-8"
        )
        return
    if not torch.cuda.is_available():
        print("gpu_heldout: CUDA is not available; nothing measured.", file=sys.stderr)
        return
    torch.cuda.set_device(0)
    out: dict = {"gpu": torch.cuda.get_device_name(), **_versions(), "rows": []}
    for case in cases():
        try:
            out["rows"].append(measure(case))
        except Exception as exc:  # noqa: BLE001  (reported, the others still run)
            out["rows"].append({"case": case.name, "failure": f"{type(exc).__name__}: {exc}"})
        print(out["rows"][-1], flush=True)
        args.measure.write_text(json.dumps(out, indent=1), encoding="utf-8")
    started, out["predicted_there"] = time.perf_counter(), []
    for case in cases():
        if time.perf_counter() - started > args.sim_seconds:
            break
        try:
            out["predicted_there"].append(predict(case))
        except Exception as exc:  # noqa: BLE001
            out["predicted_there"].append({"case": case.name, "failure": str(exc)[:200]})
        args.measure.write_text(json.dumps(out, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
