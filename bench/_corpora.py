"""Synthetic manifests with realistic duration distributions, for benchmarks (no audio).

``librispeech_like``: durations shaped like LibriSpeech train-clean-100 (most utterances
11-17 s, a tail down to ~1.3 s and up to ~24.5 s): a mixture of a normal around 14 s
(sd 2.2) for 80% and a uniform 1.3-24.5 s for 20%, clipped to [1.3, 24.5] s. With 28,539
utterances (train-clean-100's count) it gives 109.5 h, mean 13.8 s (the real corpus:
100.6 h, mean 12.7 s). Transcripts at 15.5 characters per second; with ``cps_sd`` each
utterance's speaking rate is drawn from a normal around 15.5 with that spread (clipped to
6-25 characters per second): an assumption, not LibriSpeech's measured spread, so
benchmarks that depend on it report several values.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CHARS_PER_SECOND = 15.5


def librispeech_like_durations(count: int, seed: int = 0) -> np.ndarray:
    """``count`` durations in seconds shaped like LibriSpeech train-clean-100."""
    rng = np.random.default_rng(seed)
    main = rng.normal(14.0, 2.2, size=count)
    tail = rng.uniform(1.3, 24.5, size=count)
    pick = rng.random(count) < 0.8
    return np.clip(np.where(pick, main, tail), 1.3, 24.5).round(3)


def write_librispeech_like(path: Path, count: int, seed: int = 0, cps_sd: float = 0.0) -> Path:
    """Write a NeMo-style JSONL manifest (no audio files) with LibriSpeech-like durations.

    Transcripts are ``duration x rate`` characters, the rate 15.5 per second, or drawn per
    utterance with spread ``cps_sd`` (see the module doc).
    """
    durations = librispeech_like_durations(count, seed)
    rates = np.full(count, CHARS_PER_SECOND)
    if cps_sd > 0:
        rates = np.clip(
            np.random.default_rng(seed + 1).normal(CHARS_PER_SECOND, cps_sd, count), 6, 25
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i, (d, rate) in enumerate(zip(durations, rates, strict=True)):
            text = "a" * max(1, int(d * rate))
            handle.write(
                json.dumps(
                    {"audio_filepath": f"audio/{i}.flac", "duration": float(d), "text": text}
                )
                + "\n"
            )
    return path
