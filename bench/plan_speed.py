"""How long planning takes: a ~1B model (XLS-R 1B) for a 10^6-utterance manifest on an L4.

Run: ``python bench/plan_speed.py [--out docs/benchmarks.md]``. It plans twice in one
process-free sequence: cold (empty simulation cache) and warm (cache filled by the cold
run), each end to end in a fresh subprocess (profile the manifest, profile the model,
search). Target (issue 4): <= 20 s end to end with simulations cached by (model, setup).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _corpora import write_librispeech_like  # noqa: E402
from _report import write_section  # noqa: E402

PLAN = """
import time, logging
logging.disable(logging.WARNING)
t = time.perf_counter()
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.plan.search import plan
ds = DatasetProfile.from_manifest({manifest!r})
p = plan(HardwareProfile.from_name("L4"), ds, "xls-r-1b", target_effective_batch=32)
print(f"RESULT {{time.perf_counter() - t:.1f}} {{len(p.buckets)}} {{p.setup.describe()}} {{p.rests_on[0]}}")
"""


def run_once(manifest: Path, cache: Path) -> tuple[float, str]:
    env = {**os.environ, "ASRFIT_CACHE_DIR": str(cache)}
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PLAN.format(manifest=str(manifest))], env=env, capture_output=True, text=True, check=True
    ).stdout
    wall = time.perf_counter() - started
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    return wall, line.split(" ", 2)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--utterances", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        manifest = write_librispeech_like(Path(tmp) / "train.jsonl", args.utterances)
        cache = Path(tmp) / "cache"
        cold, detail = run_once(manifest, cache)
        warm, _ = run_once(manifest, cache)
    lines = [
        f"Command: `python bench/plan_speed.py --out docs/benchmarks.md` ({date.today()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, no GPU).",
        "",
        f"Planning XLS-R 1B on an L4 for a {args.utterances:,}-utterance LibriSpeech-like manifest, "
        "end to end in a fresh process (manifest profile, model profile, search):",
        "",
        "| cache | wall seconds |",
        "|---|---|",
        f"| cold (empty simulation cache) | {cold:.1f} |",
        f"| warm (simulations cached by model, setup and shape) | {warm:.1f} |",
        "",
        f"Plan: {detail}. Target: <= 20 s with simulations cached.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, "plan-speed", f"## Planning time\n\n{text}")


if __name__ == "__main__":
    main()
