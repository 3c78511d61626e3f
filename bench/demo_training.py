"""`make demo`'s training run on this machine: epochs, error rates and the plan's predictions.

Run: ``PYTHONPATH=src .venv/bin/python -m bench demo_training --out docs/benchmarks.md``

It makes the demo corpus (``asrfit demo-data``) in a temporary folder and runs the same
``asrfit train`` command as the Makefile's ``demo`` target (its model, batch, epochs and
learning rate, read from the Makefile), then writes the section from the run's own
``report.json``: per epoch the train loss, dev WER/CER, measured and predicted seconds;
the test split's scores; predicted and measured throughput and peak memory; the wall time
of ``asrfit train`` (planning for this CPU included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._report import write_section

SECTION = "demo-training"
ROOT = Path(__file__).resolve().parents[1]


def makefile_variable(name: str) -> str:
    """The default of ``NAME ?= value`` in the Makefile."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{name} \?= (.*)$", text, flags=re.MULTILINE)
    if match is None:
        raise SystemExit(f"Makefile: no `{name} ?= ...` line; update bench/demo_training.py")
    return match.group(1).strip()


def train_command(data: Path, out: Path) -> list[str]:
    """The Makefile's ``asrfit train`` line of the ``demo`` target, for these folders."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"\$\(BIN\)/asrfit train (.*?--random-init[^\n]*)", text, flags=re.DOTALL)
    if match is None:
        raise SystemExit("Makefile: no `asrfit train ... --random-init` line in the demo target")
    line = match.group(1).replace("\\\n", " ")
    values = {
        "DEMO_MODEL": makefile_variable("DEMO_MODEL"),
        "DEMO_DIR": str(data),
        "DEMO_RUN": str(out),
        "DEMO_TRAIN_ARGS": makefile_variable("DEMO_TRAIN_ARGS"),
    }
    line = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], line)
    return [sys.executable, "-m", "asrfit.cli.main", "train", *line.split()]


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def render(report: dict, command: list[str], wall: float) -> str:
    """The section's text from ``report.json`` and the command's wall time."""
    shown = " ".join(["asrfit", *command[3:]])
    lines = [
        "## Demo training: Conformer-CTC on the demo corpus (CPU)",
        "",
        "Command: `PYTHONPATH=src .venv/bin/python -m bench demo_training --out "
        "docs/benchmarks.md`, which runs `make demo`'s training step on a fresh demo corpus:",
        f"`{shown}`.",
        f"Run: {platform.machine()} {platform.system()}, nproc={os.cpu_count()}, "
        f"device {report['device']}.",
        "",
        "| stage | epoch | steps | train loss | dev WER | dev CER | measured s | predicted s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in report["epochs"]:
        dev = e.get("dev") or {}
        predicted = e.get("predicted_seconds")
        lines.append(
            f"| {e['stage']} | {e['epoch']} | {e['steps']} | {e['train_loss']:.3f} "
            f"| {pct(dev['wer']) if dev else '-'} | {pct(dev['cer']) if dev else '-'} "
            f"| {e['wall_seconds']:.1f} | {'-' if predicted is None else f'{predicted:.1f}'} |"
        )
    test = report["test"]
    lines += [
        "",
        f"- test split ({test['utterances']} utterances, the best dev model reloaded): "
        f"**WER {pct(test['wer'])}, CER {pct(test['cer'])}**;",
        f"- throughput: predicted {report['predicted_audio_seconds_per_second']:.1f}, measured "
        f"{report['measured_audio_seconds_per_second']:.1f} audio s per s;",
        f"- memory: predicted peak {report['predicted_peak_bytes'] / 2**30:.2f} GiB of tensors "
        f"(largest bucket), measured {report['measured_peak_bytes'] / 2**30:.2f} GiB "
        f"({report.get('measured_peak_kind', 'peak')}: not the same quantity on the CPU);",
        f"- `asrfit train` wall time, planning for this CPU included: {wall:.0f} s.",
        "",
        "The demo corpus is synthetic (one fixed sound per character), so near-zero error says",
        "the pipeline trains, decodes and scores correctly, not how it does on real speech.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the section to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asrfit-demo-") as tmp:
        data, out = Path(tmp) / "demo", Path(tmp) / "run"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        subprocess.run(
            [sys.executable, "-m", "asrfit.cli.main", "demo-data", str(data), "--overwrite"],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        command = train_command(data, out)
        started = time.perf_counter()
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    shown = [c.replace(str(data), "demo").replace(str(out), "runs/demo") for c in command]
    text = render(report, shown, wall)
    print(text)
    if args.out is not None:
        write_section(args.out, SECTION, text)


if __name__ == "__main__":
    main()
