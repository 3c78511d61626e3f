"""Time ``DatasetProfile.from_manifest`` on a synthetic 10^6-line manifest.

Run: ``PYTHONPATH=src .venv/bin/python -m bench profile_speed [--lines 1000000]``

The manifest points at 10 real WAV files (so the header sample finds its audio) and every
line has a ``duration``. Both readers are timed: the pyarrow fast path (used whenever
pyarrow is importable) and the pure-Python line-by-line reader it falls back to.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from asrfit.profiles.dataset import DatasetProfile
from asrfit.testing.dummies import write_dummy_audio


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
    """Write the manifest, profile it with each reader and print the timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = write_big_manifest(Path(tmp), args.lines)
        print(
            f"wrote {args.lines:,} lines ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - start:.1f} s"
        )
        for label in ("pyarrow", "python"):
            # the pure-Python reader is the one asrfit falls back to when pyarrow is not
            # importable: hide pyarrow from the import system for that run
            hidden = {"pyarrow": None, "pyarrow.json": None} if label == "python" else {}
            with mock.patch.dict(sys.modules, hidden):
                start = time.perf_counter()
                profile = DatasetProfile.from_manifest(path)
                elapsed = time.perf_counter() - start
            print(
                f"{label:8s} reader: {elapsed:.2f} s for {profile.num_utterances:,} utterances "
                f"({profile.total_hours:,.1f} h, p95 {profile.duration_p95_seconds:.2f} s)"
            )


if __name__ == "__main__":
    main()
