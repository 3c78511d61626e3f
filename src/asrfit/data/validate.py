"""One validation pass over the training data before any heavy work.

Every utterance's audio header is read (in threads; no audio is decoded) and checked
against what the manifest declares. What a user would want dropped is skipped and counted
by reason; what points at a broken data set (an empty manifest, or more skipped than
``max_skipped_fraction``) stops the run with an error that names the file, the counts and
what to do. Every skip is logged with its manifest line, and :meth:`SkipLog.write` lists
them all in a JSONL file.

Reasons (keys of :data:`VALIDATION_REASONS`):

* ``unreadable_audio``: the file is missing, empty, or its header cannot be read;
* ``duration_mismatch``: the declared ``duration`` differs from the header's by more than
  ``max(duration_tolerance_seconds, duration_tolerance_ratio x header duration)`` (within
  it, the header's duration is used)
  (a 20 s file declared 2 s would blow the batch's memory bound; a 1 s file declared 20 s
  would be admitted with far too many labels);
* ``too_short``: shorter than ``min_seconds`` (a 10 ms clip has no encoder frame).

Audio samples that are NaN or infinite are only seen when decoded: the dataset replaces
such an utterance in its batch and counts it (:class:`~asrfit.data.dataset.SpeechDataset`).
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf

from asrfit.errors import AudioError, ConfigError, ManifestError
from asrfit.profiles.dataset_stats import (
    DURATION_TOLERANCE_RATIO,
    DURATION_TOLERANCE_SECONDS,
    MIN_TRAIN_SECONDS,
    duration_tolerance,
)
from asrfit.utils.io import Pathlike, atomic_write_text

logger = logging.getLogger(__name__)

VALIDATION_REASONS = {
    "unreadable_audio": "audio that is missing, empty or has no readable header",
    "duration_mismatch": "declared duration differs from the audio header",
    "too_short": "audio shorter than min_seconds",
}


@dataclass(frozen=True)
class ValidationPolicy:
    """What the validation pass accepts.

    Attributes:
        max_skipped_fraction: Above this share of skipped utterances the run stops.
            (Default: 0.05)
        duration_tolerance_seconds: Allowed difference between a declared duration and the
            audio header's. (Default: 0.1)
        duration_tolerance_ratio: The same as a share of the header's duration; the larger
            of the two applies. (Default: 0.02)
        min_seconds: Shorter audio is skipped. (Default: 0.1)
        header_threads: Threads reading audio headers. (Default: 8)
    """

    max_skipped_fraction: float = 0.05
    duration_tolerance_seconds: float = DURATION_TOLERANCE_SECONDS
    duration_tolerance_ratio: float = DURATION_TOLERANCE_RATIO
    min_seconds: float = MIN_TRAIN_SECONDS
    header_threads: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_skipped_fraction <= 1.0:
            raise ConfigError(
                f"max_skipped_fraction={self.max_skipped_fraction}: give a share in [0, 1], e.g. 0.05."
            )
        if self.duration_tolerance_seconds < 0 or self.duration_tolerance_ratio < 0:
            raise ConfigError(
                f"duration tolerance {self.duration_tolerance_seconds} s / "
                f"{self.duration_tolerance_ratio}: must be >= 0."
            )
        if self.min_seconds < 0 or self.header_threads < 1:
            raise ConfigError(
                f"min_seconds={self.min_seconds}, header_threads={self.header_threads}: invalid."
            )

    def tolerance_seconds(self, header_seconds: float) -> float:
        """The allowed declared-vs-header difference for audio of ``header_seconds``."""
        return duration_tolerance(
            header_seconds, self.duration_tolerance_seconds, self.duration_tolerance_ratio
        )


@dataclass
class SkipLog:
    """Skipped utterances: counts by reason and one entry per utterance.

    Attributes:
        counts: Skips by reason.
        entries: ``{"where", "reason", "detail"}`` per skipped utterance.
        total: Utterances looked at (the denominator of the skipped share).
    """

    counts: Counter[str] = field(default_factory=Counter)
    entries: list[dict[str, str]] = field(default_factory=list)
    total: int = 0

    def add(self, reason: str, where: str, detail: str = "") -> None:
        """Count one skip and log it."""
        self.counts[reason] += 1
        self.entries.append({"where": where, "reason": reason, "detail": detail})
        logger.info(
            "skip %s: %s%s", where, reason.replace("_", " "), f" ({detail})" if detail else ""
        )

    def merge(self, counts: dict[str, int]) -> None:
        """Add counts kept elsewhere (the dataset's own skips)."""
        self.counts.update({k: v for k, v in counts.items() if v})

    @property
    def skipped(self) -> int:
        """Utterances skipped, all reasons."""
        return sum(self.counts.values())

    def write(self, path: Pathlike) -> Path:
        """Write the entries as JSONL (atomically)."""
        return atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in self.entries))

    def check(self, policy: ValidationPolicy, what: str, listing: str | None = None) -> None:
        """Stop when more than ``policy.max_skipped_fraction`` was skipped.

        Raises:
            ConfigError: Naming the counts by reason, the share, and what to do.
        """
        if self.total == 0 or self.skipped / self.total <= policy.max_skipped_fraction:
            return
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        where = f" (each listed in {listing})" if listing else ""
        raise ConfigError(
            f"{what}: {self.skipped} of {self.total} utterances ({self.skipped / self.total:.1%}) "
            f"would be skipped ({reasons}){where}, above the allowed "
            f"{policy.max_skipped_fraction:.1%}. Fix or drop those lines, or raise the threshold "
            "(--max-skipped 0.2)."
        )


def _header_seconds(source: Any) -> float:
    """Duration from the audio header of a path or encoded bytes.

    Raises:
        AudioError: Missing, empty or unreadable.
    """
    try:
        if isinstance(source, (bytes, bytearray)):
            info = sf.info(io.BytesIO(source))
        else:
            path = Path(source)
            if not path.is_file():
                raise AudioError(f"{path}: no such audio file")
            if path.stat().st_size == 0:
                raise AudioError(f"{path}: the file is empty (0 bytes)")
            info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as err:
        raise AudioError(f"cannot read the audio header ({str(err).splitlines()[0]})") from err
    if info.samplerate <= 0 or info.frames <= 0:
        raise AudioError(f"the header says {info.frames} samples at {info.samplerate} Hz")
    return float(info.frames) / float(info.samplerate)


def validate_utterances(
    utterances: Sequence[Any],
    policy: ValidationPolicy | None = None,
    *,
    what: str = "training data",
    header_seconds: Callable[[Any], float] = _header_seconds,
) -> tuple[list[Any], SkipLog]:
    """Check every utterance's audio header against its declared duration.

    Args:
        utterances: :class:`~asrfit.data.dataset.Utterance` objects (``source``,
            ``duration_seconds``, ``offset_seconds``, ``where``); a lhotse cut as source is
            trusted (lhotse validated it).
        policy: Tolerances and the threshold. (Default: :class:`ValidationPolicy()`)
        what: Names the data in messages ("training data", "dev data").
        header_seconds: Reads a source's duration (tests pass a fake).

    Returns:
        The usable utterances (their durations set from the header where the manifest gave
        none) and the :class:`SkipLog`.

    Raises:
        ManifestError: When there are no utterances at all.
    """
    policy = policy or ValidationPolicy()
    if not utterances:
        raise ManifestError(
            f"{what}: the manifest holds no utterances (no non-blank lines); give a JSONL file "
            'with one {"audio_filepath": ..., "text": ..., "duration": ...} object per line.'
        )
    log = SkipLog(total=len(utterances))

    def read(utt: Any) -> float | str:
        if not isinstance(utt.source, (str, Path, bytes, bytearray)):
            return float(utt.duration_seconds)
        try:
            return header_seconds(utt.source)
        except AudioError as err:
            return str(err)

    with ThreadPoolExecutor(max_workers=policy.header_threads) as pool:
        headers = list(pool.map(read, utterances))
    kept = []
    for utt, header in zip(utterances, headers, strict=True):
        if isinstance(header, str):
            log.add("unreadable_audio", utt.where, f"{header}; re-encode it or drop the line")
            continue
        available = header - float(utt.offset_seconds or 0.0)
        declared = float(utt.duration_seconds)
        if not math.isfinite(declared):
            utt.duration_seconds = declared = available
        elif abs(declared - available) > policy.tolerance_seconds(header) and not (
            utt.offset_seconds and declared <= available
        ):
            log.add(
                "duration_mismatch",
                utt.where,
                f"field 'duration' is {declared:g} s, the audio header says {available:.3f} s; "
                "fix the field (or remove it to use the header)",
            )
            continue
        if not utt.offset_seconds:  # the header is the truth for the batch budget
            utt.duration_seconds = declared = available
        if declared < policy.min_seconds:
            log.add(
                "too_short", utt.where, f"{declared:.3f} s < min_seconds {policy.min_seconds:g} s"
            )
            continue
        kept.append(utt)
    if log.counts:
        logger.warning(
            "%s: validation skipped %d of %d utterances (%s)",
            what,
            log.skipped,
            log.total,
            ", ".join(f"{k}: {v}" for k, v in sorted(log.counts.items())),
        )
    return kept, log
