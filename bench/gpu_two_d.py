"""Measured throughput of 1-D vs 2-D bucket plans on a real GPU (issue 18's open question).

``bench/two_d_buckets.py`` predicts that duration x label bins (2-D) speed up
Parakeet-TDT-0.6B only 1.05x over duration bins (1-D), because at the batches the bins free
the step-time model says the GPU is already saturated. This checks that on a GPU:

1. ``--plan FILE --gpu NAME`` (any machine, no GPU): the LibriSpeech-like manifest of
   ``bench/two_d_buckets.py`` planned with ``bucketing="1d"`` and ``"2d"`` for the named
   catalog GPU; each bucket's shape ``(batch, frames, labels)``, its share of the
   utterances, its mean duration and the step time the planner predicted for it (recorded
   as the planner computes it) are written to FILE, which is committed before the GPU run.
2. ``--measure PLANS --out FILE`` (CUDA): the real model of each plan's setup on the GPU,
   one step per bucket shape to warm up, then two timed steps (``torch.cuda.synchronize``
   around each; the batch is made on the GPU first): their mean, and
   ``max_memory_allocated`` / ``max_memory_reserved`` over the timed steps. A shape that
   raises ``torch.cuda.OutOfMemoryError`` is recorded as such. FILE is rewritten after
   each shape, so a call stopped by a time limit keeps what it measured.
3. ``--render PLANS MEASURED [--out docs/benchmarks.md]``: each plan's throughput over the
   whole dataset, predicted and measured, with the planner's own formula
   (audio seconds / wall seconds, each bucket's wall seconds ``utterances / batch x step``).

Run on a lent GPU: ``PYTHONPATH=src python3 -m bench gpu_two_d --measure
bench/data/gpu-two-d-plans.json --out $OUT/two-d.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch

MODEL = "parakeet-tdt-0.6b-v2"
SECTION = "gpu-two-d-buckets"
GIB = 2**30


def plan_both(gpu: str, utterances: int, cps_sd: float) -> dict[str, Any]:
    """Plan the LibriSpeech-like manifest 1-D and 2-D; each bucket with its predicted step."""
    import asrfit.plan.bucketing as bucketing
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile
    from bench._corpora import write_librispeech_like

    steps: dict[tuple[str, int, int, int], float] = {}
    original = bucketing.bucket_step_seconds

    def recording(costs: Any, hardware: Any, b: int, t: int, u: int) -> float:
        seconds = original(costs, hardware, b, t, u)
        steps[(costs.setup.describe(), b, t, u)] = seconds
        return seconds

    bucketing.bucket_step_seconds = recording
    out: dict[str, Any] = {"model": MODEL, "gpu": gpu, "utterances": utterances, "cps_sd": cps_sd}
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_librispeech_like(Path(tmp) / "ls.jsonl", utterances, cps_sd=cps_sd)
        ds = DatasetProfile.from_manifest(str(manifest))
        hw = HardwareProfile.from_name(gpu)
        for mode in ("1d", "2d"):
            started = time.perf_counter()
            p = plan(hw, ds, MODEL, target_hours=1.0, bucketing=mode)
            setup = p.setup.describe()
            buckets = []
            for b in p.buckets:
                step = steps[(setup, b.batch_size, b.max_input_length, b.max_label_length)]
                buckets.append(
                    {
                        "seconds": [b.min_seconds, b.max_seconds],
                        "labels": [b.min_label_length, b.max_label_length],
                        "batch": b.batch_size,
                        "frames": b.max_input_length,
                        "fraction": b.utterance_fraction,
                        # the planner's throughput is mean x batch / step
                        "mean_seconds": b.throughput_seconds_per_second * step / b.batch_size,
                        "predicted_step_seconds": step,
                        "predicted_reserved_bytes": b.predicted_peak_bytes,
                    }
                )
            out[mode] = {
                "setup": setup,
                "setup_json": p.setup.to_json(),
                "usable_bytes": p.usable_bytes,
                "predicted_throughput": p.predicted_throughput_seconds_per_second,
                "plan_seconds": time.perf_counter() - started,
                "buckets": buckets,
            }
            print(mode, setup, f"{p.predicted_throughput_seconds_per_second:,.1f}", flush=True)
    bucketing.bucket_step_seconds = original
    return out


def throughput(buckets: list[dict], key: str) -> float:
    """Audio seconds per wall second over the dataset (the planner's formula)."""
    audio = sum(b["fraction"] * b["mean_seconds"] for b in buckets)
    wall = sum(b["fraction"] / b["batch"] * b[key] for b in buckets)
    return audio / wall


def _shape_key(setup: str, b: dict) -> str:
    return f"{setup}|{b['batch']}|{b['frames']}|{b['labels'][1]}"


def _step(
    adapter: Any,
    model: torch.nn.Module,
    optimizer: Any,
    autocast: torch.dtype | None,
    device: str,
    batch: dict,
) -> None:
    """One training step: forward and loss under autocast, backward, optimizer step."""
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        loss = adapter.loss(model, batch)
    loss.backward()
    del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(
    plans: dict[str, Any],
    out: Path,
    budget_seconds: float,
    device: str = "cuda",
    one_d_every: int = 1,
    steps: int = 2,
) -> None:
    """Time each distinct bucket shape of both plans on the GPU (see the module doc).

    Every 2-D bucket is measured, and every ``one_d_every``-th 1-D bucket (the first and
    the last always): :func:`render` interpolates the others' measured / predicted ratio.

    ``device="cpu"`` is a dry run of this function (times, no memory figures).
    """
    from asrfit.memory.real_step import build_model, float_dtype
    from asrfit.memory.report import resolve_adapter
    from asrfit.memory.setup import Precision, Setup
    from asrfit.memory.step import BatchShape
    from asrfit.memory.trace.optimizers import make_optimizer
    from bench import _truth

    started = time.perf_counter()
    gpu = device == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    name = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    result: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "plans_gpu": plans["gpu"],
        "total_bytes": torch.cuda.get_device_properties(0).total_memory if gpu else 0,
        "shapes": {},
    }
    adapter, _ = resolve_adapter(MODEL)
    by_setup: dict[str, list[dict]] = {}
    for mode in ("1d", "2d"):
        buckets = plans[mode]["buckets"]
        if mode == "1d":
            buckets = [
                b for i, b in enumerate(buckets) if i % one_d_every == 0 or i == len(buckets) - 1
            ]
        by_setup.setdefault(plans[mode]["setup_json"], []).extend(buckets)
    for setup_json, buckets in by_setup.items():
        setup = Setup.from_json(setup_json)
        torch.manual_seed(0)
        model = build_model(adapter, setup, device)
        optimizer = make_optimizer(setup, [p for p in model.parameters() if p.requires_grad])
        dtype = float_dtype(setup)
        autocast = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(
            setup.precision
        )

        step = functools.partial(_step, adapter, model, optimizer, autocast, device)

        # interleave the plans by duration, so a call cut short has both plans' short buckets
        order = sorted(buckets, key=lambda b: (b["seconds"][1], b["labels"][1]))
        for b in order:
            key = _shape_key(setup.describe(), b)
            if key in result["shapes"]:
                continue
            if time.perf_counter() - started > budget_seconds:
                result["stopped"] = f"budget of {budget_seconds:g} s spent before {key}"
                break
            shape = BatchShape(b["batch"], b["frames"], b["labels"][1])
            row: dict[str, Any] = {"batch": b["batch"], "frames": b["frames"]}
            batch = None
            try:
                host = _truth.real_inputs_from_adapter(adapter, shape, dtype)
                batch = {
                    k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in host.items()
                }
                step(batch)
                sync()
                if gpu:
                    torch.cuda.reset_peak_memory_stats()
                times = []
                for _ in range(steps):
                    sync()
                    t0 = time.perf_counter()
                    step(batch)
                    sync()
                    times.append(time.perf_counter() - t0)
                row["step_seconds"] = sum(times) / len(times)
                row["times"] = times
                if gpu:
                    row["max_allocated"] = torch.cuda.max_memory_allocated()
                    row["max_reserved"] = torch.cuda.max_memory_reserved()
            except torch.cuda.OutOfMemoryError as error:
                row["oom"] = str(error).splitlines()[0][:200]
                optimizer.zero_grad(set_to_none=True)
            del batch
            if gpu:
                torch.cuda.empty_cache()
            result["shapes"][key] = row
            result["elapsed"] = time.perf_counter() - started
            print(key, row.get("step_seconds", row.get("oom")), flush=True)
            out.write_text(json.dumps(result, indent=1), encoding="utf-8")
        del model, optimizer, step
        if gpu:
            torch.cuda.empty_cache()
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")


def _measured_steps(buckets: list[dict], shapes: dict, setup: str) -> list[float | None]:
    """Each bucket's measured step, or None where its shape was not measured."""
    return [shapes.get(_shape_key(setup, b), {}).get("step_seconds") for b in buckets]


def filled_steps(buckets: list[dict], measured: list[float | None], how: str) -> list[float]:
    """Measured steps, each missing one from the measured / predicted ratio of the others.

    ``how``: ``"interpolate"`` (linear in the bucket's longest duration between the
    measured buckets on either side), ``"low"`` or ``"high"`` (the smallest or largest
    measured ratio: the bounds that interpolation stays within).
    """
    import numpy as np

    known = [
        (b["seconds"][1], m / b["predicted_step_seconds"])
        for b, m in zip(buckets, measured, strict=True)
        if m
    ]
    xs, ratios = [x for x, _ in known], [r for _, r in known]
    out = []
    for b, m in zip(buckets, measured, strict=True):
        if m is not None:
            out.append(m)
            continue
        if how == "interpolate":
            ratio = float(np.interp(b["seconds"][1], xs, ratios))
        else:
            ratio = min(ratios) if how == "low" else max(ratios)
        out.append(b["predicted_step_seconds"] * ratio)
    return out


def render(plans: dict[str, Any], measured: dict[str, Any]) -> str:
    """Predicted against measured throughput of both plans, and the per-bucket rows."""
    shapes = measured["shapes"]
    rows, detail, totals, counts = [], [], {}, {}
    for mode in ("1d", "2d"):
        p = plans[mode]
        buckets = p["buckets"]
        steps = _measured_steps(buckets, shapes, p["setup"])
        counts[mode] = sum(m is not None for m in steps)
        for b, m in zip(buckets, steps, strict=True):
            row = shapes.get(_shape_key(p["setup"], b), {})
            if m is None:
                continue
            detail.append(
                f"| {mode[0]}-D | {b['seconds'][0]:g}-{b['seconds'][1]:g} | "
                f"{b['labels'][0]}-{b['labels'][1]} | {b['batch']} | "
                f"{b['predicted_step_seconds']:.2f} | {m:.2f} | "
                f"{m / b['predicted_step_seconds']:.2f} | "
                f"{b['predicted_reserved_bytes'] / GIB:.1f} | "
                f"{row['max_allocated'] / GIB:.1f} | {row['max_reserved'] / GIB:.1f} |"
            )
        predicted = throughput(buckets, "predicted_step_seconds")
        each = {}
        for how in ("interpolate", "low", "high"):
            filled = filled_steps(buckets, steps, how)
            each[how] = throughput(
                [dict(b, measured=f) for b, f in zip(buckets, filled, strict=True)], "measured"
            )
        totals[mode] = (predicted, each)
        rows.append(
            f"| {mode[0]}-D | {p['setup']} | {len(buckets)} ({counts[mode]} measured) | "
            f"{predicted:,.1f} | {each['interpolate']:,.1f} |"
        )
    (p1, m1), (p2, m2) = totals["1d"], totals["2d"]
    bounds = [m2[a] / m1[b] for a in ("low", "high") for b in ("low", "high")]
    rows.append(
        f"| 2-D / 1-D | | | **{p2 / p1:.3f}x** | **{m2['interpolate'] / m1['interpolate']:.3f}x** "
        f"({min(bounds):.3f}-{max(bounds):.3f}x) |"
    )
    return "\n".join(
        [
            f"Planned for {plans['gpu']} ({plans['utterances']:,} LibriSpeech-like utterances, "
            f"speaking-rate sd {plans['cps_sd']:g} chars/s); measured on {measured['device']} "
            f"(torch {measured['torch']}, {measured['total_bytes'] / GIB:.1f} GiB).",
            "",
            "| plan | setup | buckets | predicted audio s/s | measured audio s/s |",
            "|---|---|---:|---:|---:|",
            *rows,
            "",
            "A bucket not measured takes the measured / predicted step ratio interpolated "
            "between its measured neighbours (in the bracket: every unmeasured bucket at the "
            "smallest or the largest measured ratio, the most each plan could move). Each "
            "measured bucket shape (batch x the bucket's longest duration and the label "
            "range's upper edge), one timed step after one warm-up step; allocated is the "
            "timed step's peak, reserved what the cache held over both steps (it was emptied "
            "before the warm-up):",
            "",
            "| plan | seconds | labels | batch | predicted step s | measured step s | "
            "measured / predicted | predicted reserved GiB | measured allocated GiB | "
            "measured reserved GiB |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
            *detail,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", type=Path, help="write both plans (CPU) to this file")
    parser.add_argument("--gpu", default="H200", help="catalog GPU to plan for")
    parser.add_argument("--utterances", type=int, default=28_539)
    parser.add_argument("--cps-sd", type=float, default=2.5)
    parser.add_argument("--measure", type=Path, help="plans file to measure on CUDA")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for --measure")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of --measure")
    parser.add_argument("--one-d-every", type=int, default=1, help="measure every Nth 1-D bucket")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per shape")
    parser.add_argument("--render", type=Path, nargs=2, metavar=("PLANS", "MEASURED"))
    parser.add_argument("--out", type=Path, help="--measure: results file; --render: docs file")
    args = parser.parse_args()
    if args.plan:
        args.plan.write_text(
            json.dumps(plan_both(args.gpu, args.utterances, args.cps_sd), indent=1),
            encoding="utf-8",
        )
    elif args.measure:
        if args.device == "cuda" and not torch.cuda.is_available():
            print("no CUDA device: nothing measured")
            return
        plans = json.loads(args.measure.read_text(encoding="utf-8"))
        measure(plans, args.out, args.budget, args.device, args.one_d_every, args.steps)
    elif args.render:
        from bench._report import write_section

        plans, measured = (json.loads(p.read_text(encoding="utf-8")) for p in args.render)
        body = "\n".join(
            [
                "### Parakeet-TDT-0.6B: 2-D against 1-D buckets, measured",
                "",
                f"Plans: `PYTHONPATH=src .venv/bin/python -m bench gpu_two_d --plan {args.render[0]} "
                f"--gpu {plans['gpu']}` (CPU, {plans['1d']['plan_seconds']:.0f} + "
                f"{plans['2d']['plan_seconds']:.0f} s beside other work). Measured: "
                "`PYTHONPATH=src python3 -m bench "
                f"gpu_two_d --measure {args.render[0]} --out $OUT/two-d.json "
                "--one-d-every 3 --steps 1 --budget 400` on the GPU"
                + (
                    f", in {len(measured['calls'])} calls ({'; '.join(measured['calls'])})"
                    if measured.get("calls")
                    else ""
                )
                + f". Rendered with `PYTHONPATH=src .venv/bin/python -m bench gpu_two_d --render "
                f"{args.render[0]} {args.render[1]} --out docs/benchmarks.md` ({date.today()}).",
                "",
                render(plans, measured),
            ]
        )
        if args.out:
            write_section(args.out, SECTION, body)
        print(body)


if __name__ == "__main__":
    main()
