"""The host's share of a GPU step, cuDNN's hidden buffers and a held-out boundary (raw data).

Run on a machine with a CUDA GPU (one short call of a lent GPU):
``PYTHONPATH=src python3 -m bench gpu_host --out $OUT/gpu_host.json``

Four parts, each appended to ``--out`` (JSON) as soon as it ends, so a time limit keeps
what was measured:

1. ``fixed``: the per-kernel fixed costs of :mod:`asrfit.profiles.host_kernels` measured
   on the GPU (tiny kernels: the host's cost per kernel, launch included) and on the same
   machine's CPU, and the per-``nn.Module`` Python cost.
2. ``cudnn``: peak allocated bytes of four grid cases with cuDNN on and off (the Parakeet-TDT
   cases' missing 14-16 MiB and the wav2vec2 family's convolution workspace, unseparated in
   the first GPU run), beside the simulated peak.
3. ``timing``: the step-time cases of ``bench/validate_gpu.py`` plus three large steps:
   measured wall time per step (median of 7 after 2 warm-ups), the catalog
   prediction, and the simulated :class:`StepCost` rows, so that any host model can be
   evaluated later on a CPU without the GPU.
4. ``boundary``: the out-of-memory boundary of whisper-base (bf16, AdamW, 30 s, 128 labels),
   searched from the planner's prediction outwards (gallop, then bisect).

Without CUDA it says so and exits 0. ``--render RAW.json`` needs no GPU: it prints the
step-time table of a saved run (``bench/data/h200-2026-11-27.json``) predicted with the
current model from the saved :class:`StepCost` rows, beside the measured times;
``--repredict-grid docs/benchmarks.md`` the first GPU run's grid peaks against the current
simulator (no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch


def _write(out: Path | None, data: dict) -> None:
    text = json.dumps(data, indent=1, default=str)
    print(text[-2000:], flush=True)
    if out is not None:
        out.write_text(text, encoding="utf-8")


def fixed_costs(device: str) -> dict:
    """Per-kernel fixed seconds on ``device``."""
    from asrfit.profiles import host_kernels as hk

    started = time.perf_counter()
    result = {
        "by_kind": hk.kernel_seconds_by_kind(device),
        "int": hk.int_kernel_seconds(device),
        "optimizer": hk.optimizer_kernel_seconds(device),
    }
    if device == "cpu":
        result["module"] = hk.module_call_seconds()
        result["module_factor"] = hk.MODULE_FACTOR
    result["seconds"] = time.perf_counter() - started
    return result


def cudnn_check(validate_gpu: object) -> list[dict]:
    """Peak allocated with cuDNN on and off, beside the simulated peak."""
    from bench import _grid

    rows = []
    for case in (
        _grid.Case("parakeet-tdt", "fp32", False, "adamw", 1, 1.0, 10),
        _grid.Case("parakeet-tdt", "fp32", False, "sgd", 3, 2.0, 10),
        _grid.Case("wav2vec2", "bf16", False, "adamw", 3, 2.0, 10),
        _grid.Case("hubert", "bf16", False, "adamw", 3, 2.0, 10),
    ):
        row: dict = {"case": case.name}
        try:
            row["simulated"] = validate_gpu._predict(case)[0].peak_bytes
            for enabled in (True, False):
                validate_gpu._release("cuda")
                with torch.backends.cudnn.flags(enabled=enabled):
                    real = _grid.run_real_step(case, "cuda")
                row["cudnn_on" if enabled else "cudnn_off"] = real.peak_bytes
        except Exception as exc:  # noqa: BLE001  (reported, the others still run)
            row["failure"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        print(row, flush=True)
    return rows


def timing_cases() -> list:
    from bench import _grid
    from bench.cases import cases as case_list
    from bench.cases import family_group

    return [
        *case_list("step-time-fit", "step-time-1"),
        *family_group("wav2vec2-base", "adamw", 8.0, 100),
        _grid.Case("wav2vec2-base", "fp32", False, "adamw", 32, 8.0, 100),
        _grid.Case("wav2vec2-base", "bf16", False, "adamw", 32, 8.0, 100),
        _grid.Case("whisper-base", "bf16", False, "adamw", 32, 30.0, 128),
    ]


def timing(validate_gpu: object, data: dict, out: Path | None) -> None:
    from asrfit.memory.steptime.roofline import step_seconds_parts
    from asrfit.profiles.hardware import HardwareProfile
    from asrfit.profiles.rates import gpu_rates
    from bench._timing import time_case

    spec = HardwareProfile.detect().spec
    rates = gpu_rates(spec)
    data["timing"] = []
    for case in timing_cases():
        try:
            r = time_case(case, rates, device="cuda", steps=7)
        except Exception as exc:  # noqa: BLE001  (reported, the others still run)
            validate_gpu._release("cuda")
            data["timing"].append({"case": case.name, "failure": f"{type(exc).__name__}: {exc}"})
            continue
        fixed, host, arithmetic = step_seconds_parts(r.cost, rates)
        data["timing"].append(
            {
                "case": case.name,
                "measured": r.measured_seconds,
                "steps": r.steps_seconds,
                "predicted": r.predicted_seconds,
                "catalog_parts": [fixed, host, arithmetic],
                "rows": r.cost.rows,
            }
        )
        print(
            f"{case.name:40s} measured {r.measured_seconds * 1e3:8.2f} ms, "
            f"catalog {r.predicted_seconds * 1e3:8.2f} ms",
            flush=True,
        )
        validate_gpu._release("cuda")
        _write(out, data)


def boundary(validate_gpu: object, budget: int) -> dict:
    """whisper-base's largest batch: predicted first, then searched from there."""
    from bench import _grid

    arch, precision, ckpt, optimizer, seconds, labels = validate_gpu.OOM_CONFIGS[1]

    def case(b: int) -> object:
        return _grid.Case(arch, precision, ckpt, optimizer, b, seconds, labels)

    started = time.perf_counter()
    predicted = validate_gpu.largest_batch(
        lambda b: validate_gpu._predict(case(b))[1].reserved_bytes <= budget
    )
    predict_seconds = time.perf_counter() - started
    trials: dict[int, bool] = {}

    def fits(b: int) -> bool:
        if b not in trials:
            t0 = time.perf_counter()
            trials[b] = validate_gpu._fits_real(case(b), "cuda")
            print(
                f"batch {b}: {'runs' if trials[b] else 'OOM'} ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        return trials[b]

    real = validate_gpu.largest_batch_from(predicted, fits)
    return {
        "config": f"{arch} {precision} {optimizer} {seconds:g}s {labels} labels",
        "budget": budget,
        "predicted": predicted,
        "predict_seconds": predict_seconds,
        "real": real,
        "trials": trials,
        "search_seconds": time.perf_counter() - started - predict_seconds,
    }


def render(raw: Path) -> str:
    """The step-time table of a saved run, predicted by the current model (markdown)."""
    import statistics

    from asrfit.memory.steptime.roofline import StepCost, step_seconds, step_seconds_parts
    from asrfit.profiles.gpus.catalog import find_gpu
    from asrfit.profiles.rates import gpu_rates

    data = json.loads(raw.read_text(encoding="utf-8"))
    run = data.get("call3", data)
    rates = gpu_rates(find_gpu(run["gpu"]))
    lines = [
        "| case | measured ms | device ms | host ms | predicted ms (host + device) | error "
        "| longer of the two | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sums, maxes = [], []
    for row in run["timing"]:
        if "failure" in row:
            lines.append(f"| {row['case']} | failed: {row['failure'][:60]} | | | | | | |")
            continue
        cost = StepCost(row["rows"])
        fixed, host, arithmetic = step_seconds_parts(cost, rates)
        device, measured = fixed + arithmetic, row["measured"]
        predicted = step_seconds(cost, rates)
        longer = max(device, host)
        sums.append(100 * (predicted / measured - 1))
        maxes.append(100 * (longer / measured - 1))
        lines.append(
            f"| {row['case']} | {measured * 1e3:.2f} | {device * 1e3:.2f} | {host * 1e3:.2f} | "
            f"{predicted * 1e3:.2f} | {sums[-1]:+.0f} % | {longer * 1e3:.2f} | {maxes[-1]:+.0f} % |"
        )

    def summary(errors: list[float]) -> str:
        return (
            f"median |error| {statistics.median(map(abs, errors)):.1f} %, "
            f"{min(errors):+.0f} % to {max(errors):+.0f} %"
        )

    lines.append("")
    lines.append(
        f"{len(sums)} steps on {run['gpu']}: host + device {summary(sums)}; "
        f"the longer of the two {summary(maxes)}."
    )
    return "\n".join(lines)


def repredict_grid(markdown: Path) -> str:
    """The grid's allocated peaks measured by the first GPU run (the memory-accuracy-gpu
    section of ``markdown``) against the current simulator's (markdown table)."""
    import re
    import statistics

    from asrfit.memory.models.adapters import hf_adapter
    from asrfit.memory.simulate import simulate_step
    from bench import _grid

    text = markdown.read_text(encoding="utf-8")
    section = text[text.index("<!-- memory-accuracy-gpu:start -->") :]
    measured = {}
    for line in section[: section.index("<!-- memory-accuracy-gpu:end -->")].splitlines():
        row = re.match(r"\| (\S.*?) \| ([\d.]+) \| ([\d.]+) \| ([-+\d.]+) %", line)
        if row:
            measured[row.group(1)] = float(row.group(3))
    lines = ["| case | predicted MiB | measured MiB (first run) | error |", "|---|---:|---:|---:|"]
    errors = []
    for case in _grid.grid():
        if case.name not in measured:
            continue
        sim = simulate_step(hf_adapter(case.config()), case.batch, case.setup, target="cuda")
        predicted, real = sim.peak_bytes / 2**20, measured[case.name]
        errors.append(100 * (predicted - real) / real)
        lines.append(f"| {case.name} | {predicted:.2f} | {real:.2f} | {errors[-1]:+.2f} % |")
    lines += [
        "",
        f"{len(errors)} cases: median |error| {statistics.median(map(abs, errors)):.2f} %, "
        f"{min(errors):+.1f} % to {max(errors):+.1f} %.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--parts", nargs="*", default=["fixed", "cudnn", "timing", "boundary"])
    parser.add_argument("--render", type=Path, help="print a saved run's table (no GPU needed)")
    parser.add_argument(
        "--repredict-grid",
        type=Path,
        metavar="MARKDOWN",
        help="the first GPU run's grid measurements (docs/benchmarks.md) against today's simulator",
    )
    args = parser.parse_args()
    if args.render is not None:
        print(render(args.render))
        return
    if args.repredict_grid is not None:
        print(repredict_grid(args.repredict_grid))
        return
    if not torch.cuda.is_available():
        print("gpu_host: CUDA is not available; nothing measured.", file=sys.stderr)
        return
    from bench import validate_gpu

    validate_gpu._load()
    torch.cuda.set_device(0)
    budget = torch.cuda.mem_get_info()[0]
    data: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "cpu": validate_gpu._grid.environment_line(),
        "budget": budget,
        "workspace": validate_gpu.measure_workspace_bytes("cuda"),
    }
    if "fixed" in args.parts:
        data["fixed"] = {"cuda": fixed_costs("cuda"), "cpu": fixed_costs("cpu")}
        _write(args.out, data)
    if "cudnn" in args.parts:
        data["cudnn"] = cudnn_check(validate_gpu)
        _write(args.out, data)
    if "timing" in args.parts:
        timing(validate_gpu, data, args.out)
    if "boundary" in args.parts:
        validate_gpu._release("cuda")
        data["boundary"] = boundary(validate_gpu, budget)
        _write(args.out, data)


if __name__ == "__main__":
    main()
