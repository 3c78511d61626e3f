"""Follow-up of ``bench/gpu_heldout.py`` on a lent GPU: cuDNN on and off, host speed.

Question (2026-11-27): Are the held-out GPU memory misses of ``bench/gpu_heldout.py`` cuDNN's
convolution workspace, and is this machine's host as fast as the one that timed the steps first?

Answer: Mostly cuDNN: with cuDNN disabled the measured peak equals the prediction for wav2vec2
h256, parakeet-ctc h48 and conformer d64, and comes within 1.7 % (moonshine) and 11 % (conformer
d96); the workspace changed from run to run and shrinks near the memory limit, so the planner
does not add it (docs/benchmarks.md, held-out GPU check; raw data
``bench/data/gpu-recheck.json``).

``PYTHONPATH=src python3 -m bench investigations.gpu_recheck --out $OUT/recheck.json``: for the held-out
cases the simulator missed most, the real step's peak with cuDNN enabled and disabled (a
miss that vanishes without cuDNN is its workspace); this machine's per-kernel host costs
(:func:`gpu_host.fixed_costs`, CUDA and CPU); and three held-out steps timed again, to
compare this machine's host with the one that timed them first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

MISSED = (
    "wav2vec2 h256 x4 layer fp32 adamw 4x4s",
    "conformer d96 fp32 adamw 3x3s",
    "moonshine h64 fp32 adamw 2x1.8s",
    "parakeet-ctc h48 bf16+ckpt adamw 4x2.4s",
    "conformer d64 bf16 sgd 6x2s",
    "wav2vec2-conformer h48 fp32 adafactor 2x1.8s",
)
RETIME = (
    "hubert h48 layer bf16 sgd 4x1.4s",
    "whisper d48 bf16 adamw 5x1.5s",
    "conformer d96 fp32 adamw 3x3s",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_recheck: CUDA is not available; nothing measured.", file=sys.stderr)
        return
    from bench import gpu_heldout, gpu_host

    torch.cuda.set_device(0)
    by_name = {c.name: c for c in gpu_heldout.cases()}
    out: dict = {"cudnn": [], "retime": []}
    out["fixed"] = {"cuda": gpu_host.fixed_costs("cuda"), "cpu": gpu_host.fixed_costs("cpu")}
    args.out.write_text(json.dumps(out, indent=1))
    for name in MISSED:
        row: dict = {"case": name}
        for enabled in (True, False):
            try:
                with torch.backends.cudnn.flags(enabled=enabled):
                    got = gpu_heldout.measure(by_name[name], steps=1)
                row["on" if enabled else "off"] = got["peak_bytes"]
            except Exception as exc:  # noqa: BLE001  (reported, the others still run)
                row["failure"] = f"{type(exc).__name__}: {exc}"[:200]
        out["cudnn"].append(row)
        print(row, flush=True)
        args.out.write_text(json.dumps(out, indent=1))
    for name in RETIME:
        out["retime"].append(gpu_heldout.measure(by_name[name]))
        print(out["retime"][-1], flush=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
