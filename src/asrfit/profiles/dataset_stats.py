"""The statistics behind a ``DatasetProfile``: reading sources and reducing durations.

:class:`~asrfit.profiles.dataset.DatasetProfile`'s builders read a source (a manifest scan,
audio headers, a Hugging Face dataset's columns) and pass the observed durations and
transcript lengths to :func:`from_partial_durations` or :func:`build_fields`, which return
the profile's fields.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asrfit.errors import AudioError, ManifestError
from asrfit.profiles.audio_files import AudioHeader, read_audio_header
from asrfit.profiles.manifest import SampledUtterance, sample_indices
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATE_HZ = 16000
PAIRED_SAMPLE_SIZE = 2000
HISTOGRAM_BINS = 20
TEXT_COLUMNS = ("text", "sentence", "transcription", "normalized_text")
_BYTES_PER_FLOAT32 = 4
MIN_TRAIN_SECONDS = 0.1
"""Shorter audio is skipped by training (``too_short``): 10 ms has no frame after subsampling."""
DURATION_TOLERANCE_SECONDS = 0.1
DURATION_TOLERANCE_RATIO = 0.02
"""A declared duration may differ from its audio header's by the larger of these (seconds, and
the share of the header's duration); beyond, training skips it (``duration_mismatch``,
:class:`asrfit.data.validate.ValidationPolicy`) and profiling warns."""


def duration_tolerance(
    header_seconds: float,
    seconds: float = DURATION_TOLERANCE_SECONDS,
    ratio: float = DURATION_TOLERANCE_RATIO,
) -> float:
    """The allowed declared-vs-header difference for audio of ``header_seconds``: the larger
    of ``seconds`` and ``ratio`` of the header's duration."""
    return max(seconds, ratio * header_seconds)


_SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class DurationHistogram(JsonDataclass):
    """Utterance counts per duration bin (estimated counts when the profile is an estimate).

    Attributes:
        edges_seconds: ``len(counts) + 1`` increasing bin edges.
        counts: Utterances per bin.
    """

    edges_seconds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.counts and len(self.edges_seconds) != len(self.counts) + 1:
            raise ValueError(
                f"histogram has {len(self.counts)} counts but {len(self.edges_seconds)} edges; "
                "it needs one more edge than counts"
            )

    def sparkline(self) -> str:
        """One character per bin, height proportional to its count (blank for zero)."""
        top = max(self.counts, default=0)
        if top <= 0:
            return ""
        return "".join(
            " " if c <= 0 else _SPARK[min(len(_SPARK) - 1, int(c / top * len(_SPARK)))]
            for c in self.counts
        )


def hf_dataset_inputs(
    ds: Any, audio_column: str, text_column: str | None, sample_size: int, seed: int
) -> dict[str, Any]:
    """Read a ``datasets.Dataset``'s transcript lengths, durations and an audio sample."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(ds, datasets.DatasetDict):
        raise ManifestError(
            f"got a DatasetDict with splits {sorted(ds)}; profile one split, e.g. ds['train']."
        )
    if not isinstance(ds, datasets.Dataset):
        raise ManifestError(
            f"expected a datasets.Dataset, got {type(ds).__name__}; for an IterableDataset, write a "
            "JSONL manifest or materialise it with Dataset.from_generator."
        )
    name = f"datasets.Dataset ({ds.info.dataset_name or 'unnamed'}, {ds.num_rows} rows)"
    columns = ds.column_names
    if audio_column not in columns:
        raise ManifestError(
            f"{name}: no audio column {audio_column!r}; columns are {columns}. Pass audio_column=."
        )
    text_column = text_column_of(columns, text_column, name)
    if ds.num_rows == 0:
        raise ManifestError(f"{name}: the dataset is empty; profile a split with at least one row.")
    wanted = [text_column] + (["duration"] if "duration" in columns else [])
    chars_parts, duration_parts = [], []
    offset = 0
    for batch in ds.select_columns(wanted).with_format("arrow").iter(batch_size=65536):
        text = batch.column(text_column)
        if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):
            raise ManifestError(
                f"{name}: column {text_column!r} holds {text.type}, not text; pass text_column=."
            )
        if text.null_count:
            row = offset + int(np.flatnonzero(text.is_null().to_numpy(zero_copy_only=False))[0])
            raise ManifestError(
                f"{name}, row {row}: field {text_column!r} is null; give every row a transcript."
            )
        chars_parts.append(pc.utf8_length(text).to_numpy(zero_copy_only=False).astype(np.int64))
        if "duration" in wanted:
            dur = batch.column("duration")
            if not (pa.types.is_integer(dur.type) or pa.types.is_floating(dur.type)):
                raise ManifestError(
                    f"{name}: column 'duration' holds {dur.type}; it must be seconds as numbers."
                )
            values = dur.to_numpy(zero_copy_only=False).astype(np.float64)
            bad = np.flatnonzero(~(np.isfinite(values) & (values > 0)))
            if len(bad):
                raise ManifestError(
                    f"{name}, row {offset + int(bad[0])}: field 'duration' is {float(values[bad[0]])!r}; durations "
                    "must be positive, finite seconds. Fix or filter that row."
                )
            duration_parts.append(values)
        offset += len(batch)
    text_chars = np.concatenate(chars_parts)
    durations = np.concatenate(duration_parts) if duration_parts else np.full(ds.num_rows, np.nan)
    picked = sample_indices(ds.num_rows, sample_size, seed)
    audio_ds = ds.select_columns([audio_column]).select(picked)
    if isinstance(ds.features[audio_column], datasets.Audio):
        audio_ds = audio_ds.cast_column(audio_column, datasets.Audio(decode=False))
    sample: list[SampledUtterance] = []
    for i, row in zip(picked, audio_ds, strict=True):
        value = row[audio_column]
        if isinstance(value, dict):
            audio = value.get("bytes") or (Path(value["path"]) if value.get("path") else None)
        else:
            audio = Path(value) if isinstance(value, str) and value else None
        if audio is None:
            raise ManifestError(
                f"{name}, row {int(i)}: column {audio_column!r} holds neither a path nor bytes; "
                "cast it with datasets.Audio() over file paths."
            )
        sample.append(SampledUtterance(int(i), audio, float(durations[i]), int(text_chars[i])))
    missing = [u for u in sample if math.isnan(u.duration_seconds)]
    return {
        "source": name,
        "source_kind": "hf_dataset",
        "durations_seconds": durations,
        "text_chars": text_chars,
        "sample_missing": missing,
        "sample_all": sample,
        "missing_text_count": 0,
    }


def warn_missing(missing: int, looked_up: int, where: str) -> None:
    if missing:
        warnings.warn(
            f"{where}: {missing} of {looked_up} sampled audio files do not exist (see the log for "
            "paths); they are left out of the header sample. Fix the paths to profile them.",
            stacklevel=3,
        )


def read_headers(sample: list[SampledUtterance], where: str) -> tuple[dict[int, AudioHeader], int]:
    """Read the header of each sampled utterance; count (not raise on) missing or unreadable files."""
    headers: dict[int, AudioHeader] = {}
    missing = 0
    unreadable: list[str] = []
    seen: set[int] = set()
    for utt in sample:
        if utt.index in seen:
            continue
        seen.add(utt.index)
        if isinstance(utt.audio, Path) and not utt.audio.exists():
            missing += 1
            log = logger.warning if missing <= 5 else logger.debug  # a few examples, not hundreds
            log("%s: utterance #%d: audio file %s does not exist", where, utt.index, utt.audio)
            continue
        try:
            headers[utt.index] = read_audio_header(
                utt.audio, where=f"{where}, utterance #{utt.index}"
            )
        except AudioError as err:  # one corrupt file does not stop a profile: counted, named
            unreadable.append(str(err))
    warn_missing(missing, len(seen), where)
    if unreadable:
        warnings.warn(
            f"{where}: {len(unreadable)} of {len(seen)} sampled audio files cannot be read and are "
            f"left out of the header sample (e.g. {unreadable[0]}); `asrfit train` skips and counts "
            "them. Re-encode or drop them.",
            stacklevel=3,
        )
    return headers, missing + len(unreadable)


def text_column_of(columns: list[str], given: str | None, name: str) -> str:
    """The transcript column: ``given``, or the first of :data:`TEXT_COLUMNS` present.

    Raises:
        ManifestError: ``given`` is not a column, or none of the usual names is (named).
    """
    if given is None:
        found = next((c for c in TEXT_COLUMNS if c in columns), None)
        if found is None:
            raise ManifestError(
                f"{name}: no transcript column among {list(TEXT_COLUMNS)}; columns are {columns}. "
                "Pass text_column=."
            )
        return found
    if given not in columns:
        raise ManifestError(f"{name}: no text column {given!r}; columns are {columns}.")
    return given


def warn_declared_durations(
    sample: list[SampledUtterance], headers: dict[int, AudioHeader], where: str
) -> None:
    """Warn when sampled files' headers contradict the durations the source declares.

    The profile (and so the plan's buckets) takes declared durations as given; a manifest
    whose ``duration`` is wrong sizes buckets for audio that is not there (or misses audio
    that is), and training later skips those utterances (``duration_mismatch``).
    """
    wrong, checked = [], 0
    for u in sample:
        header = headers.get(u.index)
        if header is None or math.isnan(u.duration_seconds):
            continue
        checked += 1
        gap = abs(u.duration_seconds - header.duration_seconds)
        if gap > duration_tolerance(header.duration_seconds):
            wrong.append(u)
    if wrong:
        u = wrong[0]
        audio = u.audio if isinstance(u.audio, Path) else "its audio"  # or encoded bytes
        warnings.warn(
            f"{where}: {len(wrong)} of {checked} sampled utterances declare a duration their audio "
            f"does not have (e.g. utterance #{u.index}: {u.duration_seconds:g} s declared, "
            f"{headers[u.index].duration_seconds:.2f} s in {audio}); the profile and the plan's "
            "buckets use the declared durations, and `asrfit train` skips such utterances "
            "(duration_mismatch). Fix the declared durations.",
            stacklevel=3,
        )


def from_partial_durations(
    *,
    source: str,
    source_kind: str,
    durations_seconds: np.ndarray,
    text_chars: np.ndarray,
    sample_missing: list[SampledUtterance],
    sample_all: list[SampledUtterance],
    missing_text_count: int,
    seed: int,
) -> dict[str, Any]:
    """Fill durations that are NaN from sampled headers, extrapolating, and build the profile."""
    n = len(durations_seconds)
    missing_mask = np.isnan(durations_seconds)
    num_missing = int(missing_mask.sum())
    to_read = list(sample_all)
    if num_missing:
        to_read = sample_missing if num_missing == n else sample_missing + sample_all
    headers, missing_audio = read_headers(to_read, source)
    warn_declared_durations(to_read, headers, source)
    known = ~missing_mask
    obs_durations = durations_seconds[known]
    obs_chars = text_chars[known]
    weights = None
    if num_missing:
        found = [u for u in sample_missing if u.index in headers]
        if not found:
            raise ManifestError(
                f"{source}: {num_missing} utterances have no duration and none of the "
                f"{len(sample_missing)} sampled audio files exist (e.g. {sample_missing[0].audio}); "
                "fix the audio paths (relative paths resolve against the manifest's folder) or add "
                "a 'duration' to every line."
            )
        obs_durations = np.concatenate(
            [obs_durations, np.array([headers[u.index].duration_seconds for u in found])]
        )
        obs_chars = np.concatenate(
            [obs_chars, np.array([u.text_chars for u in found], dtype=np.int64)]
        )
        if len(found) < num_missing:
            weights = np.concatenate(
                [np.ones(int(known.sum())), np.full(len(found), num_missing / len(found))]
            )
    disk_bytes = sum(h.file_bytes for h in headers.values())
    disk_seconds = sum(h.duration_seconds for h in headers.values())
    return outlier_fields(durations_seconds, text_chars) | build_fields(
        source=source,
        source_kind=source_kind,
        durations_seconds=obs_durations,
        paired_text_chars=obs_chars,
        weights=weights,
        all_text_chars=text_chars,
        is_estimate=weights is not None,
        sampled_utterances=len({u.index for u in to_read}),
        missing_audio_count=missing_audio,
        missing_text_count=missing_text_count,
        sample_rates=[h.sample_rate_hz for h in headers.values()],
        disk_bytes_seen=float(disk_bytes),
        disk_seconds_seen=float(disk_seconds),
        seed=seed,
    )


def quantiles(values: np.ndarray, weights: np.ndarray | None, qs: list[float]) -> list[float]:
    """Linear-interpolated quantiles; weighted (inverted CDF) when weights differ."""
    if weights is None or np.all(weights == weights[0]):
        return [float(v) for v in np.quantile(values, qs)]
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order]) / weights.sum()
    idx = np.minimum(np.searchsorted(cdf, qs, side="left"), len(values) - 1)
    return [float(values[order][i]) for i in idx]


def round_keeping_sum(values: np.ndarray) -> list[int]:
    """Round to integers whose sum is the rounded sum (largest remainders round up)."""
    floors = np.floor(values).astype(np.int64)
    short = round(float(values.sum())) - int(floors.sum())
    if short > 0:
        floors[np.argsort(-(values - floors), kind="stable")[:short]] += 1
    return [int(x) for x in floors]


def build_fields(
    *,
    source: str,
    source_kind: str,
    durations_seconds: np.ndarray,
    paired_text_chars: np.ndarray,
    weights: np.ndarray | None,
    all_text_chars: np.ndarray,
    is_estimate: bool,
    sampled_utterances: int,
    missing_audio_count: int,
    missing_text_count: int,
    sample_rates: list[int],
    disk_bytes_seen: float,
    disk_seconds_seen: float,
    seed: int,
) -> dict[str, Any]:
    """Reduce observed durations (each standing for ``weight`` utterances) to a profile."""
    num_utterances = len(all_text_chars)
    d = np.asarray(durations_seconds, dtype=np.float64)
    c = np.asarray(paired_text_chars, dtype=np.float64)
    if weights is None:
        total_seconds = float(d.sum())
        hist_scale = None
    else:
        total_seconds = float(np.dot(d, weights))
        hist_scale = weights
    p50, p90, p95, p99 = quantiles(d, weights, [0.5, 0.9, 0.95, 0.99])
    counts, edges = np.histogram(
        d, bins=HISTOGRAM_BINS, range=(float(d.min()), float(d.max())), weights=hist_scale
    )
    rate = c / d
    cps_mean = (
        float(rate.mean()) if weights is None else float(np.dot(rate, weights) / weights.sum())
    )
    (cps_p95,) = quantiles(rate, weights, [0.95])
    if sample_rates:
        tally = Counter(sample_rates)
        sample_rate = max(tally, key=lambda sr: (tally[sr], sr))
        if len(tally) > 1:  # one field holds one rate: say what else the sample found
            mix = ", ".join(f"{sr:,} Hz ({n})" for sr, n in tally.most_common())
            warnings.warn(
                f"{source}: the sampled audio files mix sample rates: {mix} files; the profile "
                f"reports the most common ({sample_rate:,} Hz) and estimates decoded bytes at it. "
                "Training resamples every file to the model's rate.",
                stacklevel=4,
            )
    else:
        sample_rate = DEFAULT_SAMPLE_RATE_HZ
    disk = (
        round(disk_bytes_seen / disk_seconds_seen * total_seconds)
        if disk_seconds_seen > 0
        else None
    )
    rng = np.random.default_rng(seed)
    k = min(PAIRED_SAMPLE_SIZE, len(d))
    if weights is None or np.all(weights == weights[0]):
        pick = np.sort(rng.choice(len(d), size=k, replace=False))
    else:
        pick = np.sort(rng.choice(len(d), size=k, replace=False, p=weights / weights.sum()))
    return dict(
        source=source,
        source_kind=source_kind,
        num_utterances=num_utterances,
        total_seconds=total_seconds,
        duration_min_seconds=float(d.min()),
        duration_mean_seconds=total_seconds / num_utterances,
        duration_p50_seconds=p50,
        duration_p90_seconds=p90,
        duration_p95_seconds=p95,
        duration_p99_seconds=p99,
        duration_max_seconds=float(d.max()),
        histogram=DurationHistogram(
            edges_seconds=[float(e) for e in edges], counts=round_keeping_sum(counts)
        ),
        chars_per_second_mean=cps_mean,
        chars_per_second_p95=cps_p95,
        text_chars_mean=float(np.mean(all_text_chars)),
        text_chars_max=int(np.max(all_text_chars)),
        sample_rate_hz=int(sample_rate),
        estimated_disk_bytes=disk,
        estimated_decoded_bytes=round(total_seconds * sample_rate * _BYTES_PER_FLOAT32),
        is_estimate=is_estimate,
        sampled_utterances=sampled_utterances,
        missing_audio_count=missing_audio_count,
        missing_text_count=missing_text_count,
        duration_sample_seconds=[float(x) for x in d[pick]],
        text_chars_sample=[int(x) for x in paired_text_chars[pick]],
        seed=seed,
    )


def outlier_fields(durations_seconds: np.ndarray, text_chars: np.ndarray) -> dict[str, Any]:
    """The utterances training will reject that a plan should name, from per-line arrays.

    Args:
        durations_seconds: One declared duration per utterance (NaN where none is declared).
        text_chars: Transcript characters of the same utterances.

    Returns:
        ``short_utterance_count`` / ``short_utterance_first`` (declared shorter than
        :data:`MIN_TRAIN_SECONDS`; the first as a 1-based utterance number) and
        ``chars_per_second_max`` / ``chars_per_second_max_utterance`` (the densest transcript).
    """
    d = np.asarray(durations_seconds, dtype=np.float64)
    c = np.asarray(text_chars, dtype=np.float64)
    known = np.isfinite(d)
    short = np.flatnonzero(known & (d < MIN_TRAIN_SECONDS))
    timed = known & (d > 0)
    rate = np.zeros_like(d)
    rate[timed] = c[timed] / d[timed]
    densest = int(np.argmax(rate)) if timed.any() else None
    return {
        "short_utterance_count": int(short.size),
        "short_utterance_first": int(short[0]) + 1 if short.size else None,
        "chars_per_second_max": float(rate[densest]) if densest is not None else 0.0,
        "chars_per_second_max_utterance": densest + 1 if densest is not None else None,
    }
