"""Check the simulator against real training steps on a CUDA GPU.

Run (on a machine with a CUDA GPU and a CUDA build of torch):
``PYTHONPATH=src .venv/bin/python -m bench validate_gpu --device cuda --out docs/benchmarks.md``

1. Each item of ``docs/memory_cuda.md`` that a CPU trace cannot see (allocator rounding
   and segments, cuBLAS workspace, cuDNN convolution workspace, RNN reserve space,
   attention kernel buffers), checked on its own by ``bench/_gpu_effects.py``.
2. The grid of ``bench/_grid.py`` (the same 30 cases as the CPU benchmark): each case is
   simulated with ``target="cuda"`` and run for real on the GPU; the second step's
   ``torch.cuda.max_memory_allocated`` is compared with ``StepMemory.peak_bytes`` (live
   storages rounded to 512-byte blocks), and ``max_memory_reserved`` with
   :func:`asrfit.memory.cuda.allocator.predict_cuda`'s reserved figure. The cuBLAS/cuBLASLt
   workspaces are allocated once by a warm-up matmul before the first case and measured on
   their own; each case's bytes are counted above what was allocated before its model was
   built, so ``measured`` holds the step's own bytes, as ``peak_bytes`` does.
3. Step time (unless ``--skip-timing``): the cases of ``bench/step_time_accuracy.py`` plus
   a base-size wav2vec2 group, each simulated with ``target="cuda"`` and timed by the per-op
   roofline on the detected GPU's catalog rates (:func:`asrfit.profiles.rates.gpu_rates`),
   against the median of 7 real steps after 2 warm-ups (``torch.cuda.synchronize`` around
   each; the batch is made on the GPU before the timed steps). (The process's CPU time per
   step was tried as the host's share and equals the wall time: CUDA's synchronisation
   spins; ``bench/gpu_host.py`` measures the host's cost per kernel instead.) Written as its
   own section,
   ``step-time-accuracy-gpu``.
4. The out-of-memory boundary of base-size models (unless ``--skip-oom``; wav2vec2-base at
   16 s, whisper-base): the largest batch whose predicted reserved bytes fit in the memory
   free on the GPU at start is found first; the real one is searched from it, in steps
   away from it until ``torch.cuda.OutOfMemoryError`` starts or stops, then by bisection.

Each section is written into ``--out`` as soon as its part ends, so that a run stopped by a
time limit keeps what it measured. ``--cases`` keeps the grid and step-time cases whose
name contains one of the given strings. On a lent GPU (no network) run it with the
machine's own torch and ``HF_HUB_OFFLINE=1``: the 2026-11-27 run on an H200 took 260 s for
everything but whisper-base's boundary search (which did not finish in the 130 s left).

Without CUDA it prints why and exits with status 0 without touching ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# asrfit trains with expandable segments; set it before CUDA initialises (an explicit
# setting in the environment wins).
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch

# The grid, transformers and the simulator are imported only once CUDA is known to be
# there (see _load), so that a machine without it gets its answer at once.
_grid = None

SECTION = "memory-accuracy-gpu"
TIMING_SECTION = "step-time-accuracy-gpu"
COMMAND = (
    "PYTHONPATH=src .venv/bin/python -m bench validate_gpu --device cuda --out docs/benchmarks.md"
)
MIB = 2**20
GIB = 2**30
# (arch, precision, checkpointing, optimizer, seconds, label_length) whose OOM boundary is searched.
OOM_CONFIGS = (
    ("wav2vec2-base", "fp32", False, "adamw", 16.0, 200),
    ("whisper-base", "bf16", False, "adamw", 30.0, 128),
)
MAX_BATCH = 4096


def cuda_unavailable_reason() -> str | None:
    """Why this script cannot run here, or None when a CUDA device is usable."""
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build of the "
            'same version (e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126" make test)'
        )
    if not torch.cuda.is_available():
        return (
            "torch was built with CUDA but sees no GPU (check the driver and CUDA_VISIBLE_DEVICES)"
        )
    return None


def _load() -> None:
    """Import the grid (and with it transformers and the simulator)."""
    global _grid
    from bench import _grid as grid_module

    _grid = grid_module


def _predict(case: Any) -> tuple[Any, Any]:
    """``(StepMemory, CudaPrediction)`` of ``case`` simulated for this GPU."""
    from asrfit.memory.cuda.allocator import predict_cuda
    from asrfit.memory.models.adapters import hf_adapter
    from asrfit.memory.simulate import simulate_step

    sim = simulate_step(hf_adapter(case.config()), case.batch, case.setup, target="cuda")
    prediction = predict_cuda(
        sim.peak_bytes,
        sim.segment_bytes(_expandable()),
        architecture=_architecture(),
        expandable_segments=_expandable(),
    )
    return sim, prediction


def _architecture() -> str | None:
    major, _ = torch.cuda.get_device_capability()
    return "hopper" if major == 9 else None


def _expandable() -> bool:
    return "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()


def measure_workspace_bytes(device: str) -> int:
    """Bytes the cuBLAS/cuBLASLt workspaces take from the caching allocator (fp32 and bf16)."""
    before = torch.cuda.memory_allocated(device)
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(64, 64, device=device, dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(
            a, w, torch.zeros(64, device=device, dtype=dtype)
        ).sum().backward()
        del a, w
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) - before


def _release(device: str) -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(device)


def validate_case(case: _grid.Case, device: str) -> dict[str, float | str]:
    """Simulate and run one case; the numbers of its table row."""
    sim, prediction = _predict(case)
    _release(device)
    real = _grid.run_real_step(case, device)
    return {
        "case": case.name,
        "predicted": sim.peak_bytes,
        "measured": real.peak_bytes,
        "error": 100.0 * (sim.peak_bytes - real.peak_bytes) / real.peak_bytes,
        "predicted_reserved": prediction.reserved_bytes,
        "measured_reserved": real.reserved_bytes,
        "reserved_error": 100.0
        * (prediction.reserved_bytes - real.reserved_bytes)
        / real.reserved_bytes,
    }


def _fits_real(case: _grid.Case, device: str) -> bool:
    try:
        _grid.run_real_step(case, device)
        fits = True
    except torch.cuda.OutOfMemoryError:
        fits = False
    _release(device)
    return fits


def largest_batch(fits: Callable[[int], bool]) -> int:
    """The largest batch size ``b`` with ``fits(b)``: double from 1, then bisect (0 if none)."""
    if not fits(1):
        return 0
    low = 1
    while low * 2 <= MAX_BATCH and fits(low * 2):
        low *= 2
    high = low * 2
    if high > MAX_BATCH:
        return low
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def largest_batch_from(start: int, fits: Callable[[int], bool]) -> int:
    """:func:`gpu_check.search_from` up to :data:`MAX_BATCH` (whisper-base on an H200: 8
    trials, 46 s, against more than 130 s doubling from 1)."""
    from bench.gpu_check import search_from

    return search_from(start, fits, MAX_BATCH)


def oom_boundary(spec: tuple, device: str, budget_bytes: int) -> dict[str, int | str]:
    """Real and predicted largest batch of one OOM config (the real one searched from the
    prediction, :func:`largest_batch_from`)."""
    arch, precision, checkpointing, optimizer, seconds, labels = spec

    def case(b: int) -> _grid.Case:
        return _grid.Case(arch, precision, checkpointing, optimizer, b, seconds, labels)

    def fits_predicted(b: int) -> bool:
        return _predict(case(b))[1].reserved_bytes <= budget_bytes

    predicted = largest_batch(fits_predicted)
    started = time.perf_counter()
    real = largest_batch_from(predicted, lambda b: _fits_real(case(b), device))
    real_seconds = time.perf_counter() - started
    return {
        "config": case(1).name.rsplit(" ", 1)[0] + f" {seconds:g}s",
        "real": real,
        "predicted": predicted,
        "seconds": round(real_seconds),
    }


def render(rows: list[dict], workspace_bytes: int, booms: list[dict], budget_bytes: int) -> str:
    """The markdown section."""
    failed = [r for r in rows if "failure" in r]
    rows = [r for r in rows if "failure" not in r]
    errors = [abs(float(r["error"])) for r in rows]
    reserved_errors = [abs(float(r["reserved_error"])) for r in rows]
    lines = [
        "## Memory accuracy of the simulator (CUDA)",
        "",
        f"Command: `{COMMAND}`  ",
        f"Run: {_grid.environment_line()}, GPU {torch.cuda.get_device_name()} "
        f"({torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GIB:.1f} GiB), CUDA {torch.version.cuda}, "
        f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}.",
        "",
        '*Predicted*: `simulate_step(..., target="cuda").peak_bytes`; *measured*: '
        "`torch.cuda.max_memory_allocated()` over the second real step, cuBLAS workspaces "
        f"excluded (measured separately: {workspace_bytes / MIB:.1f} MiB). Reserved: "
        "`predict_cuda(...).reserved_bytes` (segments, workspace, fragmentation allowance) vs "
        "`max_memory_reserved()`.",
        "",
        "| case | predicted MiB | measured MiB | error | predicted reserved MiB | measured reserved MiB | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['predicted'] / MIB:.2f} | {r['measured'] / MIB:.2f} | {r['error']:+.2f} % "
            f"| {r['predicted_reserved'] / MIB:.2f} | {r['measured_reserved'] / MIB:.2f} "
            f"| {r['reserved_error']:+.2f} % |"
        )
    if errors:
        lines += [
            "",
            f"Allocated |error| over {len(rows)} cases: **median {statistics.median(errors):.2f} %, "
            f"max {max(errors):.2f} %**. Reserved |error|: median {statistics.median(reserved_errors):.2f} %, "
            f"max {max(reserved_errors):.2f} %.",
        ]
    if failed:
        lines += ["", f"{len(failed)} case(s) failed:"]
        lines += [f"- {r['case']}: `{r['failure']}`" for r in failed]
    if booms:
        lines += [
            "",
            f"Out-of-memory boundary (budget: {budget_bytes / GIB:.2f} GiB free at start; predicted = "
            "largest batch whose predicted reserved bytes fit in it):",
            "",
            "| config | largest batch that runs | predicted largest batch | search seconds |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {b['config']} | {b['real']} | {b['predicted']} | {b['seconds']} |" for b in booms
        ]
    return "\n".join(lines)


def main() -> None:
    """Validate on the GPU and write the section into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda", help="a CUDA device: cuda or cuda:N (Default: cuda)"
    )
    parser.add_argument("--out", type=Path, help="markdown file to write the section into")
    parser.add_argument(
        "--cases", nargs="*", default=[], help="only cases whose name contains one of these"
    )
    parser.add_argument(
        "--skip-oom", action="store_true", help="skip the out-of-memory boundary search"
    )
    parser.add_argument("--skip-timing", action="store_true", help="skip the step-time check")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        raise SystemExit(
            f"--device {args.device!r}: this script validates CUDA devices; use cuda or cuda:N."
        )
    reason = cuda_unavailable_reason()
    if reason is not None:
        print(
            f"validate_gpu: CUDA is not available: {reason}. Nothing was measured.", file=sys.stderr
        )
        if args.out:
            print(f"validate_gpu: {args.out} is unchanged.", file=sys.stderr)
        raise SystemExit(0)
    _load()
    # set_device needs an index: plain "cuda" is the first device
    torch.cuda.set_device(torch.device(args.device if ":" in args.device else "cuda:0"))
    device = "cuda"
    budget_bytes = torch.cuda.mem_get_info()[0]
    workspace_bytes = measure_workspace_bytes(device)
    from bench import _gpu_effects

    effects = _gpu_effects.run_all(device, workspace_bytes)
    _release(device)
    cases = [c for c in _grid.grid() if not args.cases or any(s in c.name for s in args.cases)]
    rows = []
    for case in cases:
        try:
            row = validate_case(case, device)
        except Exception as exc:  # one broken case is reported, the others still run
            _release(device)
            row = {
                "case": case.name,
                "failure": f"{type(exc).__name__}: {exc}".splitlines()[0][:120],
            }
            print(f"{case.name:42s} failed: {row['failure']}", flush=True)
        else:
            print(
                f"{case.name:42s} predicted {row['predicted']:>11d}  measured {row['measured']:>11d}  "
                f"error {row['error']:+.2f} %",
                flush=True,
            )
        rows.append(row)

    def write_memory(booms: list[dict]) -> None:
        section = (
            render(rows, workspace_bytes, booms, budget_bytes) + "\n" + _gpu_effects.render(effects)
        )
        print("\n" + section, flush=True)
        if args.out:
            _grid.write_section(args.out, SECTION, section)
            print(f"\nwrote {args.out}", flush=True)

    # Written as each part ends (the grid, the step times, the out-of-memory searches), so
    # that a run stopped by a time limit keeps what it measured.
    write_memory([])
    if not args.skip_timing:
        timing = step_time_section(device, args.cases)
        print("\n" + timing, flush=True)
        if args.out:
            _grid.write_section(args.out, TIMING_SECTION, timing)
    if args.skip_oom:
        return
    booms = []
    for spec in OOM_CONFIGS:
        try:
            boom = oom_boundary(spec, device, budget_bytes)
        except Exception as exc:  # keep the grid's results when a search breaks
            _release(device)
            message = f"{type(exc).__name__}: {exc}".splitlines()[0][:100]
            boom = {
                "config": " ".join(map(str, spec)),
                "real": message,
                "predicted": "-",
                "seconds": "-",
            }
        booms.append(boom)
        print(
            f"OOM boundary {boom['config']}: runs up to {boom['real']}, predicted {boom['predicted']}",
            flush=True,
        )
        write_memory(booms)


def step_time_section(device: str, only: list[str] | None = None) -> str:
    """Predicted vs measured step time of the step-time cases on this GPU (markdown).

    ``only``: keep the cases whose name contains one of these strings (all when empty).
    """
    import statistics

    from asrfit.profiles.hardware import HardwareProfile
    from asrfit.profiles.rates import gpu_rates
    from bench._timing import time_case
    from bench.cases import cases as case_list
    from bench.cases import family_group

    spec = HardwareProfile.detect().spec
    if spec is None:
        return "## Step time (GPU)\n\nThe detected GPU is not in the catalog: no rates to predict with."
    rates = gpu_rates(spec)
    cases = [
        *case_list("step-time-fit", "step-time-1"),
        *family_group("wav2vec2-base", "adamw", 8.0, 100),
    ]
    cases = [c for c in cases if not only or any(s in c.name for s in only)]
    lines = [
        f"## Step time: predicted vs measured ({spec.name})",
        "",
        f"Command: `{COMMAND}`",
        "",
        "| case | predicted ms | measured ms (median of 7) | error |",
        "|---|---:|---:|---:|",
    ]
    errors = []
    for case in cases:
        try:
            r = time_case(case, rates, device=device, steps=7)
        except Exception as exc:  # one broken case is reported, the others still run
            _release(device)
            lines.append(f"| {case.name} | failed: {type(exc).__name__} | | |")
            continue
        errors.append(abs(r.error_pct))
        lines.append(
            f"| {case.name} | {r.predicted_seconds * 1e3:.2f} | {r.measured_seconds * 1e3:.2f} | "
            f"{r.error_pct:+.1f} % |"
        )
        print(
            f"{case.name:42s} step {r.predicted_seconds * 1e3:8.2f} ms predicted, {r.measured_seconds * 1e3:8.2f} measured",
            flush=True,
        )
        _release(device)
    if errors:
        lines.insert(
            4,
            f"Median |error| {statistics.median(errors):.1f} %, max {max(errors):.1f} % ({len(errors)} cases).\n",
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
