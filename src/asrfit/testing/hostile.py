"""Hostile data for fault-injection tests: manifests and audio that break in one known way.

:func:`hostile_corpus` writes a small good corpus (``num_good`` utterances of 1-2 s) plus one
hostile item of the named kind, and returns what a user should get from it
(:class:`HostileCase`): the skip reason that must be counted, or the error type and the
words the message must hold. The good part is always the same, so a test can compare a
hostile run against a clean one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asrfit.testing.dummies import write_dummy_audio, write_manifest
from asrfit.utils.io import Pathlike

GOOD_TEXTS = ("the quick fox", "a lazy dog", "speech model", "over the dog", "brown fox jumps")


@dataclass
class HostileCase:
    """One hostile corpus and what the user must see.

    Attributes:
        kind: The hostile input class.
        manifest: The manifest path.
        skip_reason: The reason the hostile utterance is skipped and counted under, if it is.
        replaced_reason: The reason it is replaced during training and counted under, if it is.
        error: The error type name raised instead, if any.
        message_words: Words the error (or the skip detail) must contain.
        hostile_line: The manifest line of the hostile utterance (1-based), if any.
    """

    kind: str
    manifest: Path
    skip_reason: str | None = None
    replaced_reason: str | None = None
    error: str | None = None
    message_words: list[str] = field(default_factory=list)
    hostile_line: int | None = None


def write_nonfinite_wav(path: Pathlike, seconds: float = 1.0, sample_rate_hz: int = 16000) -> Path:
    """A float WAV whose samples include NaN and +inf (its header is fine)."""
    import soundfile

    x = (
        np.random.default_rng(0)
        .uniform(-0.1, 0.1, int(seconds * sample_rate_hz))
        .astype(np.float32)
    )
    x[100], x[200], x[300] = np.nan, np.inf, -np.inf
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(dest), x, sample_rate_hz, subtype="FLOAT")
    return dest


def _good_rows(root: Path, num_good: int) -> list[dict[str, object]]:
    rows = []
    for i in range(num_good):
        seconds = 1.0 + 0.05 * (i % 20)
        audio = write_dummy_audio(
            root / "audio" / f"good_{i:04d}.wav", duration_seconds=seconds, seed=i
        )
        rows.append(
            {
                "audio_filepath": str(audio.relative_to(root)),
                "text": GOOD_TEXTS[i % len(GOOD_TEXTS)],
                "duration": seconds,
            }
        )
    return rows


def _bad_audio(root: Path, name: str) -> Path:
    return root / "audio" / name


def _case(kind: str, root: Path, rows: list[dict[str, object]]) -> dict[str, object]:  # noqa: C901
    """Add the hostile item to ``rows`` (in place); return HostileCase fields."""
    line = len(rows) + 1
    bad: dict[str, object] = {"text": "a lazy dog", "duration": 1.0}

    def add(audio: Path | str, **fields: object) -> None:
        entry = {
            **bad,
            "audio_filepath": str(Path(audio).relative_to(root))
            if isinstance(audio, Path)
            else audio,
        }
        entry.update(fields)
        rows.append(entry)

    if kind == "nonfinite_audio":
        add(write_nonfinite_wav(_bad_audio(root, "nan.wav")))
        return {"replaced_reason": "non_finite_audio", "hostile_line": line}
    if kind == "huge_duration":
        add(write_dummy_audio(_bad_audio(root, "huge.wav"), duration_seconds=1.0), duration=1e9)
        return {
            "skip_reason": "duration_mismatch",
            "message_words": ["1e+09", "header"],
            "hostile_line": line,
        }
    if kind == "declared_too_short":  # a 20 s file declared 2 s
        add(write_dummy_audio(_bad_audio(root, "long.wav"), duration_seconds=20.0), duration=2.0)
        return {
            "skip_reason": "duration_mismatch",
            "message_words": ["2 s", "20.000"],
            "hostile_line": line,
        }
    if kind == "declared_too_long":  # a 1 s file declared 20 s with 181 labels
        add(
            write_dummy_audio(_bad_audio(root, "short.wav"), duration_seconds=1.0),
            duration=20.0,
            text="ab " * 60 + "a",
        )
        return {
            "skip_reason": "duration_mismatch",
            "message_words": ["20 s", "1.000"],
            "hostile_line": line,
        }
    if kind == "empty_file":
        path = _bad_audio(root, "empty.wav")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        add(path)
        return {
            "skip_reason": "unreadable_audio",
            "message_words": ["empty", "0 bytes"],
            "hostile_line": line,
        }
    if kind == "bad_header":
        path = _bad_audio(root, "bad.wav")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 20)
        add(path)
        return {
            "skip_reason": "unreadable_audio",
            "message_words": ["header"],
            "hostile_line": line,
        }
    if kind == "missing_file":
        add("audio/not_there.wav")
        return {
            "skip_reason": "unreadable_audio",
            "message_words": ["no such audio file"],
            "hostile_line": line,
        }
    if kind == "tiny_clip":  # 10 ms
        add(write_dummy_audio(_bad_audio(root, "clip.wav"), duration_seconds=0.01), duration=0.01)
        return {"skip_reason": "too_short", "message_words": ["0.010 s"], "hostile_line": line}
    if kind == "huge_transcript":  # 93,000 characters on 1 s
        add(
            write_dummy_audio(_bad_audio(root, "talk.wav"), duration_seconds=1.0),
            text="abc " * 23250,
        )
        return {
            "skip_reason": "too_long_for_ctc",
            "message_words": ["labels"],
            "hostile_line": line,
        }
    if kind == "empty_transcript":
        add(write_dummy_audio(_bad_audio(root, "quiet.wav"), duration_seconds=1.0), text="")
        return {"skip_reason": "empty_transcript", "hostile_line": line}
    if kind == "no_duration_field":  # fine: read from the header
        path = write_dummy_audio(_bad_audio(root, "nodur.wav"), duration_seconds=1.5)
        rows.append({"audio_filepath": str(path.relative_to(root)), "text": "a lazy dog"})
        return {"hostile_line": line}
    raise ValueError(f"unknown hostile kind {kind!r}; see HOSTILE_KINDS")


HOSTILE_KINDS = (
    "nonfinite_audio",
    "huge_duration",
    "declared_too_short",
    "declared_too_long",
    "empty_file",
    "bad_header",
    "missing_file",
    "tiny_clip",
    "huge_transcript",
    "empty_transcript",
    "no_duration_field",
)


def hostile_corpus(folder: Pathlike, kind: str, num_good: int = 30) -> HostileCase:
    """Write ``num_good`` good utterances and one hostile item of ``kind`` (see :data:`HOSTILE_KINDS`).

    Args:
        folder: Where ``manifest.jsonl`` and ``audio/`` go.
        kind: One of :data:`HOSTILE_KINDS`.
        num_good: Good utterances (1-2 s, learnable transcripts).

    Returns:
        The :class:`HostileCase`.
    """
    root = Path(folder)
    rows = _good_rows(root, num_good)
    fields = _case(kind, root, rows)
    manifest = write_manifest(root / "manifest.jsonl", rows)
    return HostileCase(kind=kind, manifest=manifest, **fields)  # type: ignore[arg-type]


def write_non_utf8_manifest(folder: Pathlike, num_good: int = 5) -> tuple[Path, int]:
    """A manifest whose last line holds a Latin-1 transcript ("café" as ``caf\\xe9``).

    Returns:
        The manifest path and the bad line's number.
    """
    root = Path(folder)
    rows = _good_rows(root, num_good)
    audio = write_dummy_audio(root / "audio" / "latin.wav", duration_seconds=1.0)
    lines = [json.dumps(r).encode("utf-8") for r in rows]
    lines.append(
        b'{"audio_filepath": "' + str(audio.relative_to(root)).encode() + b'", "text": "caf\xe9", '
        b'"duration": 1.0}'
    )
    path = root / "manifest.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, len(lines)


def write_hostile(kind: str) -> Callable[[Pathlike], HostileCase]:
    """A one-argument factory for ``kind`` (for parametrised fixtures)."""
    return lambda folder: hostile_corpus(folder, kind)
