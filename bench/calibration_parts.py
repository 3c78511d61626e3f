"""Which part of a GPU calibration moves held-out step times, from the committed GPU check.

Run: ``PYTHONPATH=src .venv/bin/python -m bench calibration_parts [--out docs/benchmarks.md]``.

``asrfit calibrate`` changes two things: the rates (host cost per kernel and per module call,
matmul, convolution and bandwidth, measured on the GPU's machine) and two scales solved from
two real steps of one model (host costs x ``host_scale``, device rates / ``device_scale``).
The GPU check (``bench/data/gpu-check-h200/``) kept the calibration file and every held-out
step's kernel rows, so each part can be applied alone to the same rows, on a CPU, without a
GPU: catalog rates; the measured rates with no scale; the host scale alone; the device scale
alone; both (what a plan uses). The held-out steps are models the calibration did not run
(its model was ``conformer-ctc-small``); nothing here was fitted on them.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench._report import write_section

DATA = Path(__file__).resolve().parent / "data"
SECTION = "calibration-parts-gpu"


def _pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def table(predictions: Path, folder: Path) -> str:
    """The markdown section: one row per held-out step, one column per part."""
    from asrfit.memory.steptime.roofline import StepCost, step_seconds
    from asrfit.profiles.calibration import read_calibration, scaled_rates
    from asrfit.profiles.rates import DeviceRates

    pred = json.loads(predictions.read_text(encoding="utf-8"))
    meas = json.loads((folder / "gpu_check.json").read_text(encoding="utf-8"))
    cal = read_calibration(folder / "calibration.json")
    measured = DeviceRates.from_dict(cal.rates)
    parts = {
        "catalog": None,
        "measured rates": scaled_rates(measured, 1.0, 1.0, "measured rates"),
        "host scale": scaled_rates(measured, cal.host_scale, 1.0, "host scale"),
        "device scale": scaled_rates(measured, 1.0, cal.device_scale, "device scale"),
        "both (a plan)": cal.apply(),
    }
    got = {r["case"]: r for r in meas["phases"].get("heldout", []) if "failure" not in r}
    errors: dict[str, list[float]] = {name: [] for name in parts}
    lines = [
        "## Calibration parts on held-out GPU steps",
        "",
        "Command: `PYTHONPATH=src .venv/bin/python -m bench calibration_parts --out "
        "docs/benchmarks.md` (no GPU: it re-times the committed kernel rows of "
        f"`{predictions.relative_to(DATA.parent.parent)}` against the measured steps and the "
        f"calibration in `{folder.relative_to(DATA.parent.parent)}`).",
        "",
        f"Calibration: {cal.key.get('device', cal.device)}, model {cal.model}, host costs x "
        f"{cal.host_scale:.2f}, device rates / {cal.device_scale:.2f}. Step time error "
        "(predicted against measured) per held-out step:",
        "",
        "| step | measured ms | " + " | ".join(parts) + " |",
        "|---|---:|" + "---:|" * len(parts),
    ]
    for p in pred["heldout"]:
        m = got.get(p["case"])
        if m is None:
            continue
        cost = StepCost(rows=p["cost_rows"])
        cells = []
        for name, rates in parts.items():
            seconds = p["step_seconds"] if rates is None else step_seconds(cost, rates)
            errors[name].append(_pct(seconds, m["step_seconds"]))
            cells.append(f"{errors[name][-1]:+.0f} %")
        lines.append(f"| {p['case']} | {m['step_seconds'] * 1e3:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "| part | median abs. error | median error | range |", "|---|---:|---:|---|"]
    for name, e in errors.items():
        lines.append(
            f"| {name} | {statistics.median(abs(x) for x in e):.1f} % | "
            f"{statistics.median(e):+.1f} % | {min(e):+.0f} to {max(e):+.0f} % |"
        )
    median_abs = {name: statistics.median(abs(x) for x in e) for name, e in errors.items()}
    best = min(median_abs, key=median_abs.get)
    spread = min(max(e) - min(e) for e in errors.values())
    closer = (
        "closer than" if median_abs["measured rates"] < median_abs["catalog"] else "no closer than"
    )
    lines += [
        "",
        f"Reading: the closest part is {best} (median {median_abs[best]:.1f} %), "
        + ("within" if median_abs[best] <= 10 else "outside")
        + " the 10 % goal for calibrated held-out steps. Every column spans at least "
        f"{spread:.0f} points from its most under- to its most over-predicted step: the error "
        "is per model, and a scale solved on one model moves every other model by the same "
        f"factor. The measured rates alone are {closer} the catalog's. A scale per kernel "
        "class (matmul, convolution, memory-bound), measured on more than one model, is the "
        "next step; it is not built.",
    ]
    return "\n".join(lines)


def main() -> None:
    """Print the section, or write it into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=Path, default=DATA / "gpu-check-predictions.json")
    parser.add_argument("--run", type=Path, default=DATA / "gpu-check-h200")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    body = table(args.predictions.resolve(), args.run.resolve())
    if args.out is None:
        print(body)
    else:
        write_section(args.out, SECTION, body)


if __name__ == "__main__":
    main()
