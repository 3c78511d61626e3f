"""Stream, validate and sample NeMo-style JSONL manifests and folders of audio files.

A manifest has one JSON object per line with ``audio_filepath`` (relative paths resolve
against the manifest's folder), ``text`` and, ideally, ``duration`` in seconds. Blank lines
are skipped. :func:`scan_manifest` reads a manifest once, keeping only numeric arrays
(durations and transcript lengths) plus two small seeded reservoir samples of the audio
paths, so a million-line manifest costs about 12 MB. When ``pyarrow`` is importable the
happy path parses in C++; anything it cannot take (a malformed line, a bad value) falls back
to the line-by-line reader, which raises a :class:`~asrfit.errors.ManifestError` naming the
line and field.
"""

from __future__ import annotations

import json
import logging
import math
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from asrfit.errors import ManifestError
from asrfit.profiles.arrow_columns import float64_values, utf8_lengths
from asrfit.utils.io import Pathlike

logger = logging.getLogger(__name__)

T = TypeVar("T")


_EXAMPLE_LINE = '{"audio_filepath": "audio/utt1.wav", "duration": 3.2, "text": "hello world"}'
_PYARROW_BLOCK_BYTES = 1 << 22


@dataclass(frozen=True)
class ManifestEntry:
    """One validated manifest line.

    Attributes:
        line_number: 1-based line number in the manifest file.
        audio_filepath: The audio path, resolved against the manifest's folder when relative.
        text: The transcript.
        duration_seconds: The ``duration`` field, or ``None`` when the line has none.
    """

    line_number: int
    audio_filepath: Path
    text: str
    duration_seconds: float | None


@dataclass(frozen=True)
class SampledUtterance:
    """An utterance picked by a reservoir sample: where its audio is and what is known of it.

    Attributes:
        index: 0-based utterance index (blank lines do not count).
        audio: A path to the audio file, or the encoded file's bytes (Hugging Face datasets).
        duration_seconds: The duration given by the source, or NaN when unknown.
        text_chars: Transcript length in characters.
    """

    index: int
    audio: Path | bytes
    duration_seconds: float
    text_chars: int


@dataclass
class ManifestScan:
    """Everything :func:`scan_manifest` keeps from one pass over a manifest.

    Attributes:
        path: The manifest file.
        durations_seconds: One float64 per utterance; NaN where the line has no ``duration``.
        text_chars: One int64 per utterance: transcript length in characters.
        sample_all: Seeded reservoir sample over all utterances.
        sample_missing_duration: Seeded reservoir sample over utterances lacking ``duration``.
        parser: ``"pyarrow"`` or ``"python"``: which reader produced the scan.
    """

    path: Path
    durations_seconds: np.ndarray
    text_chars: np.ndarray
    sample_all: list[SampledUtterance]
    sample_missing_duration: list[SampledUtterance]
    parser: str

    @property
    def num_utterances(self) -> int:
        """Number of non-blank lines."""
        return int(self.durations_seconds.shape[0])

    @property
    def num_missing_durations(self) -> int:
        """Number of lines without a ``duration`` field."""
        return int(np.isnan(self.durations_seconds).sum())


class Reservoir(Generic[T]):
    """Seeded reservoir sample of a stream (Vitter/Li "Algorithm L").

    The same seed and the same stream give the same sample, whether the stream is offered
    one item at a time or in batches, and the random generator is consulted only
    ``O(capacity * log(n / capacity))`` times.

    Args:
        capacity: Most items kept.
        seed: Seed of the private random generator.
    """

    def __init__(self, capacity: int, seed: int) -> None:
        if capacity < 0:
            raise ValueError(f"reservoir capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self.items: list[T] = []
        self.seen = 0
        self._rng = random.Random(seed)
        self._weight = 1.0
        self._next_index = 0 if capacity > 0 else math.inf

    def _uniform(self) -> float:
        u = self._rng.random()
        while u == 0.0:
            u = self._rng.random()
        return u

    def _schedule_next(self) -> None:
        self._weight *= math.exp(math.log(self._uniform()) / self.capacity)
        skip = math.floor(math.log(self._uniform()) / math.log1p(-self._weight))
        self._next_index = self.seen + skip

    def advance(self, count: int) -> list[tuple[int, int]]:
        """Pass over the next ``count`` stream items and say which ones to keep.

        Args:
            count: How many items of the stream go by.

        Returns:
            ``(offset, slot)`` pairs in order, ``offset`` counted from the first of these
            ``count`` items: store that item with :meth:`put` under ``slot``.
        """
        picks: list[tuple[int, int]] = []
        end = self.seen + count
        while self._next_index < end:
            index = int(self._next_index)
            self.seen = index + 1
            if index < self.capacity:
                slot = index
                if index == self.capacity - 1:
                    self._schedule_next()
                else:
                    self._next_index = index + 1
            else:
                slot = self._rng.randrange(self.capacity)
                self._schedule_next()
            picks.append((index - (end - count), slot))
        self.seen = end
        return picks

    def put(self, slot: int, item: T) -> None:
        """Store ``item`` under ``slot`` (a slot returned by :meth:`advance`)."""
        if slot == len(self.items):
            self.items.append(item)
        else:
            self.items[slot] = item


def _manifest_error(path: Path, line_number: int, message: str) -> ManifestError:
    return ManifestError(f"{path}, line {line_number}: {message}")


def _parse_line(raw: bytes, line_number: int, path: Path) -> tuple[str, str, float]:
    """Validate one non-blank line; return (audio_filepath, text, duration or NaN)."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _manifest_error(
            path,
            line_number,
            f"malformed JSON ({exc.msg} at column {exc.colno}); each line must be one JSON "
            f"object such as {_EXAMPLE_LINE}.",
        ) from None
    except UnicodeDecodeError as exc:
        raise _manifest_error(
            path,
            line_number,
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
            "re-save the manifest as UTF-8 (e.g. iconv -f latin1 -t utf-8).",
        ) from None
    if not isinstance(obj, dict):
        raise _manifest_error(
            path,
            line_number,
            f"expected a JSON object, got {type(obj).__name__}; write {_EXAMPLE_LINE}.",
        )
    for field in ("audio_filepath", "text"):
        if field not in obj:
            raise _manifest_error(
                path,
                line_number,
                f"missing field {field!r}; every line needs 'audio_filepath' and 'text' "
                "(and ideally 'duration' in seconds).",
            )
    audio = obj["audio_filepath"]
    if not isinstance(audio, str) or not audio:
        raise _manifest_error(
            path,
            line_number,
            f"field 'audio_filepath' is {audio!r}; give the audio file's path as a string.",
        )
    text = obj["text"]
    if not isinstance(text, str):
        raise _manifest_error(
            path,
            line_number,
            f"field 'text' is {text!r}; give the transcript as a string ('' if none).",
        )
    duration = obj.get("duration")
    if duration is None:
        return audio, text, math.nan
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise _manifest_error(
            path, line_number, f"field 'duration' is {duration!r}; give it as a number of seconds."
        )
    duration = float(duration)
    if not math.isfinite(duration) or duration <= 0.0:
        raise _manifest_error(
            path,
            line_number,
            f"field 'duration' is {duration!r}; durations must be positive, finite seconds. "
            "Fix or drop this line (or remove the field to have it read from the audio header).",
        )
    return audio, text, duration


def _open_manifest(path: Pathlike) -> Path:
    p = Path(path)
    if not p.exists():
        raise ManifestError(
            f"{p}: no such manifest file; check the path. A manifest is JSONL with one object "
            f"per line, e.g. {_EXAMPLE_LINE}"
        )
    if not p.is_file():
        raise ManifestError(f"{p}: is not a file; pass a JSONL manifest (or use a folder source).")
    return p


def resolve_audio_path(audio_filepath: str, manifest_path: Path) -> Path:
    """Resolve a manifest's ``audio_filepath`` against the manifest's folder when relative.

    Args:
        audio_filepath: The field's value; ``~`` is expanded.
        manifest_path: The manifest file.

    Returns:
        An absolute or manifest-relative path.
    """
    audio = Path(audio_filepath).expanduser()
    return audio if audio.is_absolute() else manifest_path.parent / audio


def iter_manifest(path: Pathlike) -> Iterator[ManifestEntry]:
    """Stream a manifest line by line, validating each line.

    Args:
        path: A NeMo-style JSONL manifest.

    Yields:
        One :class:`ManifestEntry` per non-blank line.

    Raises:
        ManifestError: When the file is missing or a line is malformed (naming the line
            and field).
    """
    p = _open_manifest(path)
    with p.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            audio, text, duration = _parse_line(raw, line_number, p)
            yield ManifestEntry(
                line_number=line_number,
                audio_filepath=resolve_audio_path(audio, p),
                text=text,
                duration_seconds=None if math.isnan(duration) else duration,
            )


def _scan_python(p: Path, sample_size: int, seed: int) -> ManifestScan:
    durations = array("d")
    chars = array("q")
    res_all: Reservoir[SampledUtterance] = Reservoir(sample_size, seed)
    res_missing: Reservoir[SampledUtterance] = Reservoir(sample_size, seed + 1)
    index = 0
    with p.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            audio, text, duration = _parse_line(raw, line_number, p)
            durations.append(duration)
            chars.append(len(text))
            picks = res_all.advance(1)
            if picks:
                res_all.put(picks[0][1], SampledUtterance(index, Path(audio), duration, len(text)))
            if duration != duration:  # NaN: no duration field
                picks = res_missing.advance(1)
                if picks:
                    res_missing.put(
                        picks[0][1], SampledUtterance(index, Path(audio), duration, len(text))
                    )
            index += 1
    return ManifestScan(
        path=p,
        durations_seconds=np.frombuffer(durations, dtype=np.float64).copy(),
        text_chars=np.frombuffer(chars, dtype=np.int64).copy(),
        sample_all=res_all.items,
        sample_missing_duration=res_missing.items,
        parser="python",
    )


def _is_utf8(p: Path, chunk_bytes: int = 1 << 24) -> bool:
    """Whether the whole file decodes as UTF-8 (read in chunks)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with p.open("rb") as handle:
            while chunk := handle.read(chunk_bytes):
                decoder.decode(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _scan_pyarrow(p: Path, sample_size: int, seed: int) -> ManifestScan | None:
    """Fast path. Returns None whenever the slow path must decide (and name the error)."""
    try:
        import pyarrow as pa
        import pyarrow.json as pj
    except ImportError:
        return None
    if not _is_utf8(p):  # pyarrow would accept it: the slow path names the line
        return None
    schema = pa.schema(
        [("audio_filepath", pa.string()), ("text", pa.string()), ("duration", pa.float64())]
    )
    parse_options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pj.ReadOptions(block_size=_PYARROW_BLOCK_BYTES)
    res_all: Reservoir[SampledUtterance] = Reservoir(sample_size, seed)
    res_missing: Reservoir[SampledUtterance] = Reservoir(sample_size, seed + 1)
    duration_parts: list[np.ndarray] = []
    char_parts: list[np.ndarray] = []
    offset = 0
    try:
        for batch in pj.open_json(p, read_options=read_options, parse_options=parse_options):
            audio_col, text_col, dur_col = (batch.column(i) for i in range(3))
            if audio_col.null_count or text_col.null_count:
                return None
            if not utf8_lengths(audio_col).all():
                return None
            chars = utf8_lengths(text_col)
            durations, is_null = float64_values(dur_col)
            present = durations[~is_null]
            if not (np.isfinite(present).all() and (present > 0).all()):
                return None
            durations[is_null] = np.nan
            for row, slot in res_all.advance(len(batch)):
                res_all.put(
                    slot,
                    SampledUtterance(
                        offset + row,
                        Path(audio_col[row].as_py()),
                        float(durations[row]),
                        int(chars[row]),
                    ),
                )
            missing_rows = np.flatnonzero(is_null)
            for k, slot in res_missing.advance(len(missing_rows)):
                row = int(missing_rows[k])
                res_missing.put(
                    slot,
                    SampledUtterance(
                        offset + row, Path(audio_col[row].as_py()), math.nan, int(chars[row])
                    ),
                )
            duration_parts.append(durations)
            char_parts.append(chars)
            offset += len(batch)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    return ManifestScan(
        path=p,
        durations_seconds=np.concatenate(duration_parts) if duration_parts else np.zeros(0),
        text_chars=np.concatenate(char_parts) if char_parts else np.zeros(0, dtype=np.int64),
        sample_all=res_all.items,
        sample_missing_duration=res_missing.items,
        parser="pyarrow",
    )


def scan_manifest(path: Pathlike, sample_size: int = 200, seed: int = 0) -> ManifestScan:
    """Read a manifest once into numeric arrays plus seeded samples of its audio paths.

    Audio paths in the samples are resolved against the manifest's folder.

    Args:
        path: A NeMo-style JSONL manifest.
        sample_size: Size of each reservoir sample (audio headers are read from these).
        seed: Seed of the samples; the same seed gives the same samples.

    Returns:
        The scan. Its arrays hold one entry per non-blank line.

    Raises:
        ManifestError: When the file is missing, empty, or has a malformed line.
    """
    p = _open_manifest(path)
    if sample_size < 1:
        raise ManifestError(f"sample_size must be at least 1, got {sample_size}.")
    scan = _scan_pyarrow(p, sample_size, seed)
    if scan is None:
        scan = _scan_python(p, sample_size, seed)
    if scan.num_utterances == 0:
        raise ManifestError(
            f"{p}: the manifest is empty (no non-blank lines); add one JSON object per utterance, "
            f"e.g. {_EXAMPLE_LINE}"
        )
    for sample in (scan.sample_all, scan.sample_missing_duration):
        sample.sort(key=lambda u: u.index)
        sample[:] = [
            SampledUtterance(
                u.index, resolve_audio_path(str(u.audio), p), u.duration_seconds, u.text_chars
            )
            for u in sample
        ]
    logger.debug(
        "scanned %s with the %s reader: %d utterances", p, scan.parser, scan.num_utterances
    )
    return scan


def sample_indices(num_items: int, sample_size: int, seed: int) -> np.ndarray:
    """A seeded uniform sample of ``min(sample_size, num_items)`` distinct indices, sorted.

    Args:
        num_items: Population size.
        sample_size: Most indices returned.
        seed: Seed; the same seed gives the same indices.

    Returns:
        Sorted int64 indices.

    Raises:
        ManifestError: When ``sample_size`` is below 1.
    """
    if sample_size < 1:
        raise ManifestError(f"sample_size must be at least 1, got {sample_size}.")
    if sample_size >= num_items:
        return np.arange(num_items, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_items, size=sample_size, replace=False)).astype(np.int64)


__all__ = [
    "ManifestEntry",
    "ManifestScan",
    "Reservoir",
    "SampledUtterance",
    "iter_manifest",
    "resolve_audio_path",
    "sample_indices",
    "scan_manifest",
]
