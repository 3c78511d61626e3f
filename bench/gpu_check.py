"""The GPU check: what a machine with a GPU runs first, predictions committed before it runs.

Three modes, one folder of results:

1. ``--predict FILE`` (any machine, no GPU; the file is committed before any measurement):
   every case below predicted through asrfit's public API (:func:`asrfit.memory.simulate`
   for the catalog H100-80GB): the held-out steps' allocated and reserved peaks, their step
   time on catalog rates and their kernel rows (so that a calibration measured later can
   re-time them without the GPU); each boundary config's largest batch whose predicted
   reserved bytes fit :data:`BUDGET_BYTES`, and its step time there.
2. ``--measure DIR`` (a CUDA machine, at most 8 minutes): in order, each phase within its
   share of the time and written to ``DIR/gpu_check.json`` as soon as it ends:
   ``calibrate`` (``asrfit calibrate`` on this GPU, its file kept as ``DIR/calibration.json``),
   ``heldout`` (each held-out step for real: ``max_memory_allocated`` and
   ``max_memory_reserved`` over its second step, median of 5 timed steps),
   ``demo`` (``asrfit demo-data`` and ``asrfit train --gpu auto`` on the demo corpus: the
   plan made on the GPU, trained end to end), ``boundary`` (the allocator capped at
   :data:`BUDGET_BYTES` with ``torch.cuda.set_per_process_memory_fraction``; the optimizer's
   state made first, then the largest batch that runs, searched outwards from the committed
   prediction and bisected; the step timed at the predicted batch when it runs).
3. ``--render PREDICTIONS DIR --out docs/benchmarks.md``: the tables, with the calibrated
   step times re-timed from the committed kernel rows.

``--dry-run`` runs the measurement code paths on this CPU with tiny cases (no memory
figures, no calibration, a synthetic boundary) so that the script is tested without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch

from asrfit.train.calibrate import median_seconds

GPU = "H100-80GB"  # the catalog entry the predictions are made for
BUDGET_BYTES = 40 * 2**30  # the allocator's cap in the boundary search (fits an H100 and an H200)
TIME_LIMIT_SECONDS = 470.0
# each phase ends by its cumulative share of the time; the boundary search takes what is left
PHASE_SHARES = {"calibrate": 0.14, "heldout": 0.22, "demo": 0.26, "boundary": 0.38}
MAX_BATCH = 2048
SECTION = "gpu-check"
TITLE = "GPU check: held-out steps, out-of-memory boundaries, calibration, the demo"


@dataclass(frozen=True)
class Step:
    """One training step: a published model at a batch shape and setup."""

    model: str
    precision: str
    optimizer: str
    batch: int
    seconds: float
    labels: int
    checkpointing: bool = False

    @property
    def name(self) -> str:
        ckpt = "+ckpt" if self.checkpointing else ""
        return (
            f"{self.model} {self.precision}{ckpt} {self.optimizer} {self.batch}x{self.seconds:g}s"
        )

    def setup(self) -> Any:
        from asrfit.memory.setup import Setup

        return Setup.from_dict(
            {
                "precision": self.precision,
                "optimizer": self.optimizer,
                "gradient_checkpointing": self.checkpointing,
            }
        )

    def at(self, batch: int) -> Step:
        return Step(
            self.model,
            self.precision,
            self.optimizer,
            batch,
            self.seconds,
            self.labels,
            self.checkpointing,
        )


# Held-out steps: published layouts that no GPU run of asrfit has measured, written before
# this script's first run; none of them was used to write a rule.
HELDOUT = (
    Step("hubert-large", "bf16", "adamw", 4, 8.0, 120),
    Step("wavlm-large", "bf16", "adamw", 4, 10.0, 150, checkpointing=True),
    Step("xls-r-300m", "fp32", "adamw", 2, 6.0, 90),
    Step("whisper-tiny", "fp32", "adamw", 8, 30.0, 100),
    Step("whisper-small", "bf16", "adamw", 4, 30.0, 120),
    Step("parakeet-ctc-0.6b", "bf16", "adamw", 4, 12.0, 48),
    Step("conformer-ctc-medium", "fp32", "adamw", 8, 8.0, 120),
    Step("conformer-ctc-large", "bf16", "adamw", 4, 14.0, 210),
)
# Out-of-memory boundaries at full size: one CTC encoder, Whisper and Parakeet-TDT, two
# precisions each; the batch is searched.
BOUNDARY = (
    Step("wav2vec2-base", "fp32", "adamw", 0, 16.0, 240),
    Step("wav2vec2-base", "bf16", "adamw", 0, 16.0, 240),
    Step("whisper-base", "fp32", "adamw", 0, 30.0, 128),
    Step("whisper-base", "bf16", "adamw", 0, 30.0, 128),
    Step("parakeet-tdt-0.6b-v2", "fp32", "adamw", 0, 12.0, 48),
    Step("parakeet-tdt-0.6b-v2", "bf16", "adamw", 0, 12.0, 48),
)
DRY_HELDOUT = (Step("conformer-ctc-tiny", "fp32", "adamw", 2, 2.0, 20),)
DRY_BOUNDARY = (Step("conformer-ctc-tiny", "fp32", "adamw", 0, 2.0, 20),)


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


# -- predictions ------------------------------------------------------------------------


def predict_step(step: Step) -> dict:
    """The simulator's figures for ``step`` on the catalog :data:`GPU`."""
    from asrfit import simulate

    started = time.perf_counter()
    report = simulate(
        step.model,
        batch_size=step.batch,
        seconds=step.seconds,
        label_length=step.labels,
        setup=step.setup(),
        gpu=GPU,
    )
    return {
        "case": step.name,
        "allocated_bytes": report.cuda.allocated_bytes,
        "reserved_bytes": report.cuda.reserved_bytes,
        "step_seconds": report.step_seconds,
        "cost_rows": report.step.cost.rows,
        "sim_seconds": time.perf_counter() - started,
    }


def predict_boundary(step: Step, budget: int) -> dict:
    """The largest batch whose predicted reserved bytes fit ``budget``: two traces give the
    bytes per utterance, then traces outwards from that estimate decide it
    (:func:`search_from`, as the measurement searches)."""
    from asrfit import simulate

    started = time.perf_counter()
    reserved: dict[int, int] = {}

    def fits(b: int) -> bool:
        if b not in reserved:
            report = simulate(
                step.model,
                batch_size=b,
                seconds=step.seconds,
                label_length=step.labels,
                setup=step.setup(),
                gpu=GPU,
            )
            reserved[b] = report.cuda.reserved_bytes
        return reserved[b] <= budget

    fits(1)
    second = 2  # at small batches the peak may sit in the optimizer step, flat in the batch
    while fits(second) and reserved[second] == reserved[1] and second < MAX_BATCH:
        second *= 4
    per = max(1, (reserved[second] - reserved[1]) // (second - 1))
    guess = min(MAX_BATCH, max(1, int((budget - reserved[1]) // per) + 1))
    largest = search_from(guess, fits)
    timed = predict_step(step.at(largest)) if largest else None
    return {
        "case": step.name,
        "budget_bytes": budget,
        "predicted_batch": largest,
        "reserved_bytes": reserved,
        "at_boundary": timed,
        "sim_seconds": time.perf_counter() - started,
    }


def predict(path: Path, dry_run: bool) -> dict:
    heldout, boundary = (DRY_HELDOUT, DRY_BOUNDARY) if dry_run else (HELDOUT, BOUNDARY)
    budget = 256 * 2**20 if dry_run else BUDGET_BYTES
    out: dict = {"gpu": GPU, **_versions(), "heldout": [], "boundary": []}
    for step in heldout:
        out["heldout"].append(predict_step(step))
        print(f"predicted {step.name}", flush=True)
        _write(path, out)
    for step in boundary:
        out["boundary"].append(predict_boundary(step, budget))
        print(f"predicted boundary {step.name}: {out['boundary'][-1]['predicted_batch']}")
        _write(path, out)
    return out


# -- measurements ------------------------------------------------------------------------


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


class RealModel:
    """One model on the device with its optimizer, reused across batch sizes."""

    def __init__(self, step: Step, device: str) -> None:
        from asrfit.memory.real_step import build_model, make_step
        from asrfit.memory.report import resolve_adapter

        self.step, self.device = step, device
        self.adapter, self.profile = resolve_adapter(step.model)
        self.gpu = device.startswith("cuda")
        gc.collect()  # the previous case's model and optimizer
        if self.gpu:
            torch.cuda.empty_cache()
        self.base_allocated = torch.cuda.memory_allocated() if self.gpu else 0
        self.base_reserved = torch.cuda.memory_reserved() if self.gpu else 0
        torch.manual_seed(0)
        self.model = build_model(self.adapter, step.setup(), device)
        self.run = make_step(self.adapter, self.model, step.setup(), device)

    def inputs(self, batch: int) -> dict:
        from asrfit.memory.real_step import real_inputs
        from asrfit.memory.report import batch_for_seconds

        shape = batch_for_seconds(self.profile, batch, self.step.seconds, self.step.labels)
        return real_inputs(self.adapter, shape, self.step.setup(), self.device)

    def release(self) -> None:
        for p in self.model.parameters():
            p.grad = None
        if self.gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def measure_heldout(step: Step, device: str) -> dict:
    """Peak allocated and reserved over the second step, and the median step time."""
    real = RealModel(step, device)
    inputs = real.inputs(step.batch)
    real.run(inputs)  # creates the optimizer's state
    sync = _sync(device)
    sync()
    row: dict = {"case": step.name}
    if real.gpu:
        torch.cuda.reset_peak_memory_stats()
    real.run(inputs)
    sync()
    if real.gpu:
        row["allocated_bytes"] = torch.cuda.max_memory_allocated() - real.base_allocated
        row["reserved_bytes"] = torch.cuda.max_memory_reserved() - real.base_reserved
    real.run(inputs)
    row["step_seconds"] = median_seconds(lambda: real.run(inputs), _sync(device), 5)
    real.release()
    return row


def measure_boundary(step: Step, predicted: int, device: str, deadline: float) -> dict:
    """The largest batch that runs under the budget, searched outwards from ``predicted``."""
    from asrfit.train.oom import is_oom

    real = RealModel(step, device)
    real.run(real.inputs(1))  # the optimizer's state exists before any trial: steady steps
    real.release()
    trials: dict[int, bool] = {}
    row: dict = {"case": step.name, "predicted_batch": predicted, "trials": trials}

    def fits(b: int) -> bool:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"out of time after trials {trials}")
        if b not in trials:
            started = time.perf_counter()
            try:
                inputs = real.inputs(b)
                real.run(inputs)
                _sync(device)()
                trials[b] = True
            except Exception as exc:  # noqa: BLE001  (an OOM is the answer; others are raised)
                if not is_oom(exc):
                    raise
                trials[b] = False
            inputs = None
            real.release()
            print(
                f"  {step.name} batch {b}: {'runs' if trials[b] else 'OOM'} "
                f"({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        return trials[b]

    if predicted > 0 and fits(predicted):
        inputs = real.inputs(predicted)
        row["step_seconds_at_predicted"] = median_seconds(
            lambda: real.run(inputs), _sync(device), 3
        )
        inputs = None
        real.release()
    row["largest_batch"] = search_from(predicted, fits)
    real.release()
    return row


def search_from(start: int, fits: Callable[[int], bool], limit: int = MAX_BATCH) -> int:
    """The largest ``b`` with ``fits(b)``, searched outwards from ``start`` (a prediction):
    steps of ``start // 32`` doubling away from it until ``fits`` changes, then bisection (0
    if none fits; nothing above ``limit`` is tried). Near a good prediction this takes a few
    trials where doubling from 1 takes many."""
    start = max(start, 1)
    step = max(1, start // 32)
    if fits(start):
        low, high = start, start + step
        while high <= limit and fits(high):
            low, step = high, step * 2
            high = low + step
        high = min(high, limit + 1)
    else:
        high, low = start, start - step
        while low > 0 and not fits(low):
            high, step = low, step * 2
            low = max(low - step, 0)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def run_demo(folder: Path, device: str, seconds: float) -> dict:
    """``asrfit demo-data`` then ``asrfit train --gpu auto`` (the GPU plan), as subprocesses."""
    cli = [sys.executable, "-c", "from asrfit.cli.main import main; main()"]
    corpus, run = folder / "demo", folder / "demo-run"
    steps = [
        [*cli, "demo-data", str(corpus), "--overwrite"],
        [
            *cli,
            "train",
            "--model",
            "conformer-ctc-tiny",
            "--data",
            str(corpus / "train.jsonl"),
            "--dev",
            str(corpus / "dev.jsonl"),
            "--test",
            str(corpus / "test.jsonl"),
            "--gpu",
            "auto",
            "--out",
            str(run),
            "--target-batch",
            "8",
            "--epochs",
            "4" if device.startswith("cuda") else "1",
            "--lr",
            "1e-3",
            "--random-init",
            "--no-spec-augment",
            *([] if device.startswith("cuda") else ["--max-steps", "3"]),
        ],
    ]
    started, row = time.perf_counter(), {"commands": [" ".join(s[3:]) for s in steps]}
    for command in steps:
        left = seconds - (time.perf_counter() - started)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=max(left, 1.0), check=False
            )
        except subprocess.TimeoutExpired:
            row["failure"] = f"timed out: {' '.join(command[3:5])}"
            return row
        row.setdefault("tails", []).append((done.stdout + done.stderr)[-3000:])
        if done.returncode != 0:
            row["failure"] = f"exit {done.returncode}: {' '.join(command[3:5])}"
            return row
    report = run / "report.json"
    if report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        for epoch in data.get("epochs", []):
            (epoch.get("dev") or {}).pop("examples", None)
        (data.get("test") or {}).pop("examples", None)
        row["report"] = data
        plan_file = run / "plan.json"
        if plan_file.exists():
            row["plan_rests_on"] = json.loads(plan_file.read_text(encoding="utf-8"))["rests_on"]
    row["seconds"] = time.perf_counter() - started
    return row


def measure(folder: Path, predictions: Path, dry_run: bool, work: Path | None = None) -> dict:
    """Every phase within its share of :data:`TIME_LIMIT_SECONDS`; results kept as they come.

    The demo's corpus and run go to ``work`` (Default: a new temporary folder), not to
    ``folder``, which holds only the two result files."""
    folder.mkdir(parents=True, exist_ok=True)
    out_file = folder / "gpu_check.json"
    device = "cpu" if dry_run else "cuda"
    if not dry_run and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available; nothing measured.", file=sys.stderr)
        return {}
    pred = json.loads(predictions.read_text(encoding="utf-8"))
    heldout, boundary = (DRY_HELDOUT, DRY_BOUNDARY) if dry_run else (HELDOUT, BOUNDARY)
    out: dict = {
        "gpu": torch.cuda.get_device_name() if not dry_run else "cpu (dry run)",
        **_versions(),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "phases": {},
    }
    if not dry_run:
        out["total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    started = time.perf_counter()

    def phase_end(name: str) -> float:
        order = list(PHASE_SHARES)
        used = sum(PHASE_SHARES[p] for p in order[: order.index(name) + 1])
        return started + used * TIME_LIMIT_SECONDS

    def record(name: str, value: Any) -> None:
        out["phases"][name] = value
        out["elapsed_seconds"] = time.perf_counter() - started
        _write(out_file, out)

    if not dry_run:
        try:
            from asrfit.train.calibrate import calibrate

            # written where plans look (the demo's plan then rests on it), kept in ``folder``
            calibration, path = calibrate("cuda", say=print)
            shutil.copyfile(path, folder / "calibration.json")
            record("calibrate", {"file": str(path), "seconds": calibration.seconds})
        except Exception as exc:  # noqa: BLE001  (reported; the other phases still run)
            record("calibrate", {"failure": f"{type(exc).__name__}: {exc}"[:500]})
    rows: list = []
    for step in heldout:
        if time.perf_counter() > phase_end("heldout"):
            rows.append({"case": step.name, "failure": "not run: the phase's time was spent"})
            continue
        try:
            rows.append(measure_heldout(step, device))
        except Exception as exc:  # noqa: BLE001
            rows.append({"case": step.name, "failure": f"{type(exc).__name__}: {exc}"[:300]})
        print(rows[-1], flush=True)
        record("heldout", rows)
    left = max(30.0, phase_end("demo") - time.perf_counter())
    record("demo", run_demo(work or Path(tempfile.mkdtemp(prefix="gpu_check-")), device, left))
    rows = []
    if not dry_run:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(BUDGET_BYTES / total)
    predicted = {r["case"]: r["predicted_batch"] for r in pred["boundary"]}
    for i, step in enumerate(boundary):
        left = phase_end("boundary") - time.perf_counter()
        deadline = time.perf_counter() + left / (len(boundary) - i)
        try:
            if dry_run:  # a synthetic limit: the search code path, no memory figure
                row = {"case": step.name, "predicted_batch": predicted[step.name]}
                row["largest_batch"] = search_from(predicted[step.name], lambda b: b <= 7)
                row["step_seconds_at_predicted"] = measure_heldout(step.at(2), device)[
                    "step_seconds"
                ]
            else:
                row = measure_boundary(step, predicted[step.name], device, deadline)
        except Exception as exc:  # noqa: BLE001
            row = {"case": step.name, "failure": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(row, flush=True)
        record("boundary", rows)
    if not dry_run:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    return out


# -- rendering ---------------------------------------------------------------------------


def _pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted / measured - 1.0)


def _summary(errors: list[float]) -> str:
    if not errors:
        return "none measured"
    return (
        f"median |error| {statistics.median(map(abs, errors)):.1f} %, "
        f"{min(errors):+.1f} % to {max(errors):+.1f} %"
    )


def render(predictions: Path, folder: Path) -> str:
    """The markdown section of a measured run."""
    from asrfit.memory.steptime.roofline import StepCost, step_seconds
    from asrfit.profiles.calibration import read_calibration

    pred = json.loads(predictions.read_text(encoding="utf-8"))
    meas = json.loads((folder / "gpu_check.json").read_text(encoding="utf-8"))
    phases = meas["phases"]
    calibrated = None
    if (folder / "calibration.json").exists():
        calibrated = read_calibration(folder / "calibration.json").apply()
    lines = [
        f"### Run on {meas['gpu']}, {meas['started']}",
        "",
        f"Measured on {meas['gpu']} (torch {meas['torch']}, transformers "
        f"{meas['transformers']}), {meas['started']}; predictions for the catalog {pred['gpu']} "
        f"made before the run (torch {pred['torch']}, transformers {pred['transformers']}).",
        *(
            [
                "",
                f"The lent machine was not the {pred['gpu']} the predictions name: memory and "
                "boundaries do not depend on the board within one architecture (same cuBLAS "
                "workspace, same allocator); the catalog step times do (bandwidth and clocks "
                "differ), which the calibrated column, measured on this GPU, does not share.",
            ]
            if pred["gpu"].split("-")[0] not in meas["gpu"]
            else []
        ),
        "",
        "#### Held-out steps (no rule was written on them)",
        "",
        "| case | alloc. pred. MiB | measured | error | reserved pred. | measured | error "
        "| time pred. ms | calibrated ms | measured ms | error | calibrated error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    got = {r["case"]: r for r in phases.get("heldout", [])}
    mem, res, tim, cal = [], [], [], []
    for p in pred["heldout"]:
        m = got.get(p["case"])
        if m is None or "failure" in m:
            why = "not measured" if m is None else m["failure"][:90]
            lines.append(f"| {p['case']} | {why} |" + " |" * 10)
            continue
        e_tim = _pct(p["step_seconds"], m["step_seconds"])
        tim.append(e_tim)
        memory_cells = "- | - | - | - | - | -"  # a dry run on the CPU measures no memory
        if "allocated_bytes" in m:
            mem.append(_pct(p["allocated_bytes"], m["allocated_bytes"]))
            res.append(_pct(p["reserved_bytes"], m["reserved_bytes"]))
            memory_cells = (
                f"{p['allocated_bytes'] / 2**20:.0f} | {m['allocated_bytes'] / 2**20:.0f} | "
                f"{mem[-1]:+.1f} % | {p['reserved_bytes'] / 2**20:.0f} | "
                f"{m['reserved_bytes'] / 2**20:.0f} | {res[-1]:+.1f} %"
            )
        c_cell = c_err = "-"
        if calibrated is not None:
            c = step_seconds(StepCost(rows=p["cost_rows"]), calibrated)
            cal.append(_pct(c, m["step_seconds"]))
            c_cell, c_err = f"{c * 1e3:.1f}", f"{cal[-1]:+.0f} %"
        lines.append(
            f"| {p['case']} | {memory_cells} | {p['step_seconds'] * 1e3:.1f} | {c_cell} | "
            f"{m['step_seconds'] * 1e3:.1f} | {e_tim:+.0f} % | {c_err} |"
        )
    lines += [
        "",
        f"Allocated: {_summary(mem)}. Reserved: {_summary(res)}. Step time on catalog "
        f"figures: {_summary(tim)}; calibrated (`asrfit calibrate` on this GPU, the "
        f"committed kernel rows re-timed): {_summary(cal)}.",
        "",
        f"#### Out-of-memory boundaries at full size (allocator capped at "
        f"{BUDGET_BYTES / 2**30:.0f} GiB)",
        "",
        "| config | predicted largest batch | largest batch that runs | error | trials "
        "| step ms predicted at it | measured | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    got = {r["case"]: r for r in phases.get("boundary", [])}
    bound, full = [], []
    for p in pred["boundary"]:
        m = got.get(p["case"])
        if m is None or "failure" in m:
            why = "not measured" if m is None else m["failure"][:90]
            lines.append(f"| {p['case']} | {p['predicted_batch']} | {why} |" + " |" * 5)
            continue
        real = m["largest_batch"]
        e_b = _pct(p["predicted_batch"], real) if real else float("nan")
        bound.append(e_b)
        t_pred = (p.get("at_boundary") or {}).get("step_seconds")
        t_meas = m.get("step_seconds_at_predicted")
        t_cells = "- | - | -"
        if t_pred and t_meas:
            full.append(_pct(t_pred, t_meas))
            t_cells = f"{t_pred * 1e3:.0f} | {t_meas * 1e3:.0f} | {full[-1]:+.0f} %"
        lines.append(
            f"| {p['case']} | {p['predicted_batch']} | {real} | {e_b:+.1f} % | "
            f"{len(m.get('trials', {})) or '-'} | {t_cells} |"
        )
    over = sum(1 for e in bound if e > 0)
    lines += [
        "",
        f"Boundaries: {_summary(bound)}; {over} of {len(bound)} predicted above the largest "
        f"batch that runs. Full-size step time (catalog figures): {_summary(full)}.",
    ]
    demo = phases.get("demo", {})
    lines += ["", "#### `asrfit train --gpu auto` on the demo corpus", ""]
    if "failure" in demo:
        lines.append(f"Failed: {demo['failure']}.")
    elif demo.get("report"):
        report = demo["report"]
        last = report["epochs"][-1]
        lines.append(
            f"Trained end to end on {report.get('device')} in {demo['seconds']:.0f} s "
            f"(`asrfit {demo['commands'][-1]}`): {len(report['epochs'])} epochs, last dev CER "
            f"{100 * last['dev']['cer']:.1f} %, test CER {100 * report['test']['cer']:.1f} %; "
            f"epoch {last['wall_seconds']:.1f} s measured, {last['predicted_seconds']:.1f} s "
            "predicted by the plan."
        )
        calibrated = [line for line in demo.get("plan_rests_on", []) if "calibration" in line]
        if calibrated:
            lines.append(f"The plan's `rests_on`: {calibrated[0]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predict", type=Path, help="write the predictions here")
    parser.add_argument("--measure", type=Path, help="measure into this folder (CUDA)")
    parser.add_argument(
        "--predictions", type=Path, default=Path("bench/data/gpu-check-predictions.json")
    )
    parser.add_argument("--render", type=Path, nargs="+", help="render the runs in these folders")
    parser.add_argument("--out", type=Path, help="with --render: write the section into this file")
    parser.add_argument("--commit", default="", help="with --out: the commit the run ran on")
    parser.add_argument("--dry-run", action="store_true", help="tiny cases on this CPU")
    parser.add_argument("--work", type=Path, help="the demo's corpus and run (default: a temp dir)")
    args = parser.parse_args()
    if args.predict:
        predict(args.predict, args.dry_run)
    if args.measure:
        measure(args.measure, args.predictions, args.dry_run, args.work)
    if args.render:
        body = "\n\n".join(render(args.predictions, folder) for folder in args.render)
        print(body)
        if args.out:
            from bench._report import write_section

            command = (
                "`PYTHONPATH=src HF_HUB_OFFLINE=1 python3 -m bench gpu_check --measure $OUT/gc` "
                "on the GPU (its predictions: `PYTHONPATH=src .venv/bin/python -m bench gpu_check "
                "--predict bench/data/gpu-check-predictions.json`, committed first); rendered with "
                f"`python -m bench gpu_check --render {' '.join(map(str, args.render))} --out {args.out}`"
            )
            stamp = f"Commit {args.commit or 'unknown'}. Command: {command}."
            write_section(args.out, SECTION, f"## {TITLE}\n\n{stamp}\n\n{body}")


if __name__ == "__main__":
    main()
