"""Factories for tiny test data made on disk, never downloaded (in the spirit of lhotse's
``lhotse/testing/dummies.py``).

Every factory writes real audio files of an exact number of samples with ``soundfile``, so
a test knows every duration (``num_samples / sample_rate_hz``) independently of the code
under test. Durations should be multiples of ``1 / sample_rate_hz`` to be exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asrfit.utils.io import Pathlike

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "speech", "model")


def write_dummy_audio(
    path: Pathlike,
    duration_seconds: float | None = None,
    num_samples: int | None = None,
    sample_rate_hz: int = 16000,
    seed: int = 0,
) -> Path:
    """Write a mono file of quiet seeded noise; the format follows the suffix (wav/flac/ogg).

    Args:
        path: Destination; parent folders are created.
        duration_seconds: Length in seconds (rounded to whole samples). Give this or
            ``num_samples``.
        num_samples: Length in samples.
        sample_rate_hz: Sample rate. (Default: 16000)
        seed: Noise seed.

    Returns:
        The path written.

    Raises:
        ValueError: Unless exactly one of ``duration_seconds`` and ``num_samples`` is given.
    """
    import soundfile

    if (duration_seconds is None) == (num_samples is None):
        raise ValueError("give exactly one of duration_seconds and num_samples")
    if num_samples is None:
        num_samples = round(float(duration_seconds) * sample_rate_hz)
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    signal = np.random.default_rng(seed).uniform(-0.1, 0.1, size=num_samples).astype(np.float32)
    soundfile.write(str(dest), signal, sample_rate_hz)
    return dest


def dummy_texts(count: int, seed: int = 0) -> list[str]:
    """Deterministic transcripts of 1-8 words each.

    Args:
        count: How many.
        seed: Seed of the word choice.

    Returns:
        ``count`` lower-case strings.
    """
    rng = np.random.default_rng(seed)
    return [
        " ".join(_WORDS[j] for j in rng.integers(0, len(_WORDS), size=int(rng.integers(1, 9))))
        for _ in range(count)
    ]


def write_manifest(path: Pathlike, rows: Iterable[dict[str, Any] | str]) -> Path:
    """Write a JSONL file: dicts as JSON, strings verbatim (for malformed-line tests).

    Args:
        path: Destination; parent folders are created.
        rows: One entry per line.

    Returns:
        The path written.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return dest


def _texts_for(durations_seconds: Sequence[float], texts: Sequence[str] | None) -> list[str]:
    if texts is None:
        return dummy_texts(len(durations_seconds))
    if len(texts) != len(durations_seconds):
        raise ValueError(f"got {len(texts)} texts for {len(durations_seconds)} durations")
    return list(texts)


def dummy_manifest(
    folder: Pathlike,
    durations_seconds: Sequence[float],
    texts: Sequence[str] | None = None,
    sample_rate_hz: int = 16000,
    with_durations: bool = True,
    write_audio: bool = True,
    absolute_paths: bool = False,
    name: str = "manifest.jsonl",
) -> Path:
    """Write ``folder/audio/utt_NNNN.wav`` files and a NeMo-style manifest listing them.

    Args:
        folder: Where the manifest and the ``audio`` folder go.
        durations_seconds: One entry per utterance.
        texts: Transcripts; :func:`dummy_texts` when ``None``.
        sample_rate_hz: Sample rate of the audio. (Default: 16000)
        with_durations: Write the ``duration`` field.
        write_audio: Write the audio files (``False`` makes every audio file missing).
        absolute_paths: Write absolute ``audio_filepath`` values instead of relative ones.
        name: Manifest file name.

    Returns:
        The manifest path.
    """
    root = Path(folder)
    rows = []
    for i, (duration, text) in enumerate(
        zip(durations_seconds, _texts_for(durations_seconds, texts), strict=True)
    ):
        audio = root / "audio" / f"utt_{i:04d}.wav"
        if write_audio:
            write_dummy_audio(
                audio, duration_seconds=duration, sample_rate_hz=sample_rate_hz, seed=i
            )
        row: dict[str, Any] = {
            "audio_filepath": str(audio if absolute_paths else audio.relative_to(root)),
            "text": text,
        }
        if with_durations:
            row["duration"] = duration
        rows.append(row)
    return write_manifest(root / name, rows)


def dummy_audio_folder(
    folder: Pathlike,
    durations_seconds: Sequence[float],
    texts: Sequence[str] | None = None,
    layout: str = "sibling",
    extension: str = "wav",
    sample_rate_hz: int = 16000,
) -> Path:
    """Write a folder of audio files with transcripts.

    Args:
        folder: The folder to fill.
        durations_seconds: One entry per file.
        texts: Transcripts; :func:`dummy_texts` when ``None``.
        layout: ``"sibling"`` (``utt_NNNN.wav`` + ``utt_NNNN.txt``) or ``"librispeech"``
            (``19/198/19-198-NNNN.flac`` + ``19/198/19-198.trans.txt``).
        extension: Audio file extension (``wav``, ``flac``, ``ogg``).
        sample_rate_hz: Sample rate. (Default: 16000)

    Returns:
        The folder.

    Raises:
        ValueError: On an unknown layout.
    """
    root = Path(folder)
    all_texts = _texts_for(durations_seconds, texts)
    if layout == "sibling":
        for i, (duration, text) in enumerate(zip(durations_seconds, all_texts, strict=True)):
            audio = write_dummy_audio(
                root / f"utt_{i:04d}.{extension}",
                duration_seconds=duration,
                sample_rate_hz=sample_rate_hz,
                seed=i,
            )
            audio.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    elif layout == "librispeech":
        chapter = root / "19" / "198"
        lines = []
        for i, (duration, text) in enumerate(zip(durations_seconds, all_texts, strict=True)):
            utt_id = f"19-198-{i:04d}"
            write_dummy_audio(
                chapter / f"{utt_id}.{extension}",
                duration_seconds=duration,
                sample_rate_hz=sample_rate_hz,
                seed=i,
            )
            lines.append(f"{utt_id} {text.upper()}")
        (chapter / "19-198.trans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        raise ValueError(f"unknown layout {layout!r}; use 'sibling' or 'librispeech'")
    return root


def dummy_hf_dataset(
    folder: Pathlike,
    durations_seconds: Sequence[float],
    texts: Sequence[str] | None = None,
    sample_rate_hz: int = 16000,
    text_column: str = "text",
    embed_bytes: bool = False,
) -> Any:
    """A ``datasets.Dataset`` with an ``Audio`` column over dummy WAV files in ``folder``.

    The column is cast with ``cast_column`` (an Arrow cast), so neither building nor
    profiling needs ``torchcodec``.

    Args:
        folder: Where the WAV files go.
        durations_seconds: One entry per row.
        texts: Transcripts; :func:`dummy_texts` when ``None``.
        sample_rate_hz: Sample rate. (Default: 16000)
        text_column: Name of the transcript column.
        embed_bytes: Store the encoded bytes in the dataset instead of paths.

    Returns:
        A ``datasets.Dataset`` with columns ``audio`` and ``text_column``.
    """
    import datasets

    root = Path(folder)
    paths = [
        write_dummy_audio(
            root / f"utt_{i:04d}.wav", duration_seconds=d, sample_rate_hz=sample_rate_hz, seed=i
        )
        for i, d in enumerate(durations_seconds)
    ]
    audio: list[Any] = (
        [{"bytes": p.read_bytes(), "path": None} for p in paths]
        if embed_bytes
        else [str(p) for p in paths]
    )
    ds = datasets.Dataset.from_dict(
        {"audio": audio, text_column: _texts_for(durations_seconds, texts)}
    )
    return ds.cast_column("audio", datasets.Audio())


def dummy_cutset(
    folder: Pathlike,
    durations_seconds: Sequence[float],
    texts: Sequence[str] | None = None,
    sample_rate_hz: int = 16000,
) -> Any:
    """A lhotse ``CutSet`` over dummy WAV files, one supervision with the transcript per cut.

    Args:
        folder: Where the WAV files go.
        durations_seconds: One entry per cut.
        texts: Transcripts; :func:`dummy_texts` when ``None``.
        sample_rate_hz: Sample rate. (Default: 16000)

    Returns:
        A ``lhotse.CutSet``.
    """
    from lhotse import CutSet, Recording, SupervisionSegment

    root = Path(folder)
    cuts = []
    for i, (duration, text) in enumerate(
        zip(durations_seconds, _texts_for(durations_seconds, texts), strict=True)
    ):
        path = write_dummy_audio(
            root / f"utt_{i:04d}.wav",
            duration_seconds=duration,
            sample_rate_hz=sample_rate_hz,
            seed=i,
        )
        recording = Recording.from_file(path, recording_id=f"rec_{i:04d}")
        cut = recording.to_cut()
        cut.supervisions = [
            SupervisionSegment(
                id=f"sup_{i:04d}",
                recording_id=recording.id,
                start=0.0,
                duration=recording.duration,
                text=text,
            )
        ]
        cuts.append(cut)
    return CutSet.from_cuts(cuts)


__all__ = [
    "dummy_audio_folder",
    "dummy_cutset",
    "dummy_hf_dataset",
    "dummy_manifest",
    "dummy_texts",
    "write_dummy_audio",
    "write_manifest",
]
