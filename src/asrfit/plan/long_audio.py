"""The long-audio rule: a bucket edge that a few outliers cannot stretch.

A single 5-minute file among 2-second ones would make a 300 s bucket (every batch of it one
slow utterance, and gigabytes of activations); a bogus ``duration`` of 1e9 s would make the
planner try a 200 GB step. Audio above ``max(30 s, 3 x the 90th percentile)`` is chunked at
quiet points (or filtered, when asked) instead; the planner and ``asrfit train`` apply it
when no ``max_seconds`` is given, and log the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Audio above ``max(LONG_AUDIO_FLOOR_SECONDS, LONG_AUDIO_P90_FACTOR x p90)`` is chunked.
LONG_AUDIO_FLOOR_SECONDS = 30.0
LONG_AUDIO_P90_FACTOR = 3.0


def long_audio_cap_seconds(durations_seconds: Sequence[float]) -> tuple[float | None, str]:
    """The long-audio rule: a bucket edge that a few outliers cannot stretch.

    Audio longer than ``max(30 s, 3 x the 90th percentile)`` is chunked at quiet points (a
    single 5-minute file among 2-second ones would otherwise make a 300 s bucket, and
    every batch of it a single slow utterance).

    Returns:
        ``(cap, reason)``; ``cap`` is None when no utterance is above it.
    """
    d = np.asarray([x for x in durations_seconds if math.isfinite(x)], dtype=float)
    if d.size == 0:
        return None, "no durations"
    p90 = float(np.percentile(d, 90))
    cap = max(LONG_AUDIO_FLOOR_SECONDS, LONG_AUDIO_P90_FACTOR * p90)
    above = int((d > cap).sum())
    if not above:
        return None, f"no utterance above max({LONG_AUDIO_FLOOR_SECONDS:g} s, 3 x p90 {p90:.1f} s)"
    return cap, (
        f"{above} utterance(s) up to {d.max():.1f} s are above max({LONG_AUDIO_FLOOR_SECONDS:g} s, "
        f"3 x p90 {p90:.1f} s) = {cap:.1f} s: chunked at quiet points (--max-seconds changes it)"
    )


def long_audio_cap_from_profile(
    p90_seconds: float, longest_seconds: float
) -> tuple[float | None, str]:
    """The same rule from a dataset profile's 90th percentile and longest utterance."""
    cap = max(LONG_AUDIO_FLOOR_SECONDS, LONG_AUDIO_P90_FACTOR * float(p90_seconds))
    if not longest_seconds > cap:
        return (
            None,
            f"no utterance above max({LONG_AUDIO_FLOOR_SECONDS:g} s, 3 x p90 {p90_seconds:.1f} s)",
        )
    return cap, (
        f"utterances up to {longest_seconds:.1f} s are above max({LONG_AUDIO_FLOOR_SECONDS:g} s, "
        f"3 x p90 {p90_seconds:.1f} s) = {cap:.1f} s: they are chunked (or filtered) to {cap:.1f} s"
    )


# asrfit.data.audio.chunk_bounds moves each cut up to half the slack (at most 0.5 s) to the
# quietest 20 ms; with less than that slack it makes one piece more
_CUT_SEARCH_SECONDS, _CUT_WINDOW_SECONDS = 0.5, 0.02


MAX_CHUNKED_SAMPLE = 100_000
"""About how many pieces a chunked dataset sample lists at most (a sample is a few thousand
utterances, so only absurd durations reach it: one bogus 1e9 s line is 33 million pieces)."""


def chunk_pieces(seconds: float, max_seconds: float) -> tuple[float, int]:
    """``(length, count)`` of the pieces training cuts ``seconds`` of audio into at a
    ``max_seconds`` limit, each as long as it can come out: :func:`asrfit.data.audio.chunk_bounds`
    cuts equal pieces, then moves each cut up to ``search`` seconds to a quiet point, so a piece
    may grow by twice that (never past the limit). A bucket that holds these holds every real
    piece."""
    if seconds <= max_seconds:
        return seconds, 1
    pieces = math.ceil(seconds / max_seconds)
    search = min(_CUT_SEARCH_SECONDS, (max_seconds - seconds / pieces) / 2)
    if search < _CUT_WINDOW_SECONDS:
        pieces += 1
        search = min(_CUT_SEARCH_SECONDS, (max_seconds - seconds / pieces) / 2)
    return min(max_seconds, seconds / pieces + 2 * search), pieces


def chunk_seconds(seconds: float, max_seconds: float) -> list[float]:
    """The pieces of :func:`chunk_pieces`, one length per piece."""
    length, count = chunk_pieces(seconds, max_seconds)
    return [length] * count


def chunked_sample(
    durations: np.ndarray, labels: np.ndarray | None, max_seconds: float
) -> tuple[np.ndarray, np.ndarray | None]:
    """A dataset sample as training sees it when long audio is chunked: each duration above
    ``max_seconds`` replaced by its pieces (:func:`chunk_pieces`), and its label count, when
    given (paired with the durations), shared out among them in proportion.

    Above :data:`MAX_CHUNKED_SAMPLE` pieces in all, every utterance's piece count is scaled by
    the same factor and rounded, so that the sample keeps its shares of piece lengths (within
    half a piece per utterance) without listing millions of copies of one absurd duration."""
    parts = [chunk_pieces(float(d), max_seconds) for d in durations]
    counts = np.asarray([count for _, count in parts], dtype=np.int64)
    kept = counts
    total = int(counts.sum())
    if total > MAX_CHUNKED_SAMPLE:
        kept = np.rint(counts * (MAX_CHUNKED_SAMPLE / total)).astype(np.int64)
    out_d = np.repeat(np.asarray([length for length, _ in parts], dtype=float), kept)
    out_l = None
    if labels is not None:
        shares = [math.ceil(float(labels[i]) / counts[i]) for i in range(len(parts))]
        out_l = np.repeat(np.asarray(shares, dtype=float), kept)
    return out_d, out_l
