"""Time ``DatasetProfile.from_manifest`` on a synthetic 10^6-line manifest.

Run: ``PYTHONPATH=src .venv/bin/python -m bench profile_speed [--lines 1000000]
[--out docs/benchmarks.md]``

The manifest points at 10 real WAV files (so the header sample finds its audio) and every
line has a ``duration``. Both readers are timed: the pyarrow fast path (used whenever
pyarrow is importable) and the pure-Python line-by-line reader it falls back to.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from asrfit.profiles.dataset import DatasetProfile
from asrfit.testing.dummies import write_dummy_audio
from bench._report import write_section

SECTION = "profile-speed"


def write_big_manifest(folder: Path, num_lines: int, seed: int = 0) -> Path:
    """Write ``num_lines`` manifest lines cycling over 10 short WAV files."""
    rng = random.Random(seed)
    for i in range(10):
        write_dummy_audio(folder / "audio" / f"utt_{i}.wav", duration_seconds=0.5, seed=i)
    path = folder / "big.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(num_lines):
            row = {
                "audio_filepath": f"audio/utt_{i % 10}.wav",
                "duration": round(rng.uniform(0.5, 30.0), 3),
                "text": "the quick brown fox jumps over the lazy dog"[: rng.randint(5, 43)],
            }
            handle.write(json.dumps(row) + "\n")
    return path


def main() -> None:
    """Write the manifest, profile it with each reader, print the timings (and write them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=None, help="write the section here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = write_big_manifest(Path(tmp), args.lines)
        mib = path.stat().st_size / 2**20
        print(f"wrote {args.lines:,} lines ({mib:.0f} MiB) in {time.perf_counter() - start:.1f} s")
        for label in ("pyarrow", "python"):
            # the pure-Python reader is the one asrfit falls back to when pyarrow is not
            # importable: hide pyarrow from the import system for that run
            hidden = {"pyarrow": None, "pyarrow.json": None} if label == "python" else {}
            with mock.patch.dict(sys.modules, hidden):
                start = time.perf_counter()
                profile = DatasetProfile.from_manifest(path)
                elapsed = time.perf_counter() - start
            line = (
                f"{label:8s} reader: {elapsed:.2f} s for {profile.num_utterances:,} utterances "
                f"({profile.total_hours:,.1f} h, p95 {profile.duration_p95_seconds:.2f} s)"
            )
            print(line)
            rows.append(f"| {label} | {elapsed:.2f} | {profile.num_utterances:,} |")
    if args.out:
        command = "PYTHONPATH=src .venv/bin/python -m bench profile_speed"
        command += f" --lines {args.lines}" * (args.lines != 1_000_000)
        body = "\n".join(
            [
                "## Profiling a manifest",
                "",
                f"Command: `{command} --out docs/benchmarks.md`",
                "",
                f"`DatasetProfile.from_manifest` on a {args.lines:,}-line JSONL manifest "
                f"({mib:.0f} MiB, every line with a duration; the header sample reads 10 short "
                f"WAV files), wall seconds, {os.cpu_count()} CPUs. The pyarrow reader is used "
                "whenever pyarrow is importable; the line-by-line reader is the fallback.",
                "",
                "| reader | seconds | utterances |",
                "|---|---:|---:|",
                *rows,
            ]
        )
        write_section(args.out, SECTION, body)


if __name__ == "__main__":
    main()
