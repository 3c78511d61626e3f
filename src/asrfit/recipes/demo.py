"""A small, seeded, learnable speech corpus written to disk in seconds, for demos and tests.

Two kinds of speech:

* ``"synthetic"`` (pure numpy): every character has a fixed acoustic signature, a ~70-110 ms
  segment shaped like a vowel (pitch pulses through two or three formants), a sonorant
  (voiced, low formants), a fricative (a noise band) or a stop (a closure, then a noise
  burst in a character-specific band). Each utterance gets its own pitch and tempo (±10%),
  each segment its own length and level jitter, the audio a little background noise.
  Segments fade in and out, so a doubled letter ("ll") has a dip a CTC model can split on.
* ``"espeak"``: real English words rendered by ``espeak-ng`` with a few voices and speeds.

The acoustic mapping and the vocabulary are fixed; ``seed`` only draws the utterances, so
corpora made with different seeds share one character inventory and one sound per character.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from asrfit.errors import AsrfitError, ConfigError
from asrfit.recipes.demo_sounds import (
    ESPEAK_HINT,
    UtteranceLimits,
    check_sample_rate,
    check_speech,
    espeak_utterance,
    finish_audio,
    synthetic_utterance,
)
from asrfit.utils.io import Pathlike, atomic_write_text
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


# --- the corpus -----------------------------------------------------------------------------
@dataclasses.dataclass
class DemoSplit(JsonDataclass):
    """One split of a demo corpus."""

    name: str
    manifest_path: str
    num_utterances: int
    total_seconds: float
    min_seconds: float
    max_seconds: float


@dataclasses.dataclass
class DemoCorpus(JsonDataclass):
    """What :func:`write_demo_corpus` wrote: where, how it was made, and how much per split."""

    out_dir: str
    speech: str
    seed: int
    sample_rate: int
    characters: str
    splits: dict[str, DemoSplit]

    @property
    def train_manifest(self) -> Path:
        """Path of ``train.jsonl``."""
        return Path(self.splits["train"].manifest_path)

    @property
    def dev_manifest(self) -> Path:
        """Path of ``dev.jsonl``."""
        return Path(self.splits["dev"].manifest_path)

    @property
    def test_manifest(self) -> Path:
        """Path of ``test.jsonl``."""
        return Path(self.splits["test"].manifest_path)

    def summary_rows(self) -> list[tuple[str, str]]:
        """Rows (label, value) for a table."""
        rows = [
            ("Folder", self.out_dir),
            ("Speech", f"{self.speech} (seed {self.seed}, {self.sample_rate} Hz)"),
            ("Characters", f"{len(self.characters)}: {self.characters!r}"),
        ]
        return rows + [
            (
                f"{s.name} split",
                f"{s.num_utterances} utterances, {s.total_seconds / 60:.1f} min "
                f"({s.min_seconds:.1f}-{s.max_seconds:.1f} s each)",
            )
            for s in self.splits.values()
        ]


def check_counts_and_seed(counts: dict[str, int], seed: int) -> None:
    """Raise a ConfigError naming ``num_<split>`` or ``seed`` when one is not a valid whole number."""
    for split, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"num_{split}={count!r}: give a whole number of utterances, at least 1."
            )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r}: give a whole number of at least 0.")


def _check_arguments(
    counts: dict[str, int], seed: int, seconds: tuple[float, float], sample_rate: int
) -> UtteranceLimits:
    """Validate the arguments of :func:`write_demo_corpus`; return the length limits in samples."""
    check_counts_and_seed(counts, seed)
    check_sample_rate(sample_rate)
    for name, value in zip(("min_seconds", "max_seconds"), seconds, strict=True):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name}={value!r}: give a finite number of seconds above 0.")
    if seconds[1] < 1.0:
        raise ConfigError(
            f"max_seconds={seconds[1]!r}: utterances need room for a word; use 1.0 or more."
        )
    limits = UtteranceLimits(
        math.ceil(seconds[0] * sample_rate), math.floor(seconds[1] * sample_rate), sample_rate
    )
    if limits.min_samples > limits.max_samples:
        raise ConfigError(
            f"min_seconds={seconds[0]!r} is above max_seconds={seconds[1]!r}; swap them."
        )
    return limits


def prepare_corpus_folder(
    out: Path, overwrite: bool, splits: tuple[str, ...] = SPLITS, what: str = "demo corpus"
) -> None:
    """Make ``out`` ready for a corpus: create it, or clear its manifests and audio.

    Args:
        out: The corpus folder.
        overwrite: Replace ``<split>.jsonl`` and ``audio/<split>/*.wav`` of a non-empty folder
            (other files are kept); without it a non-empty folder is an error.
        splits: The splits whose files are replaced.
        what: The corpus's name in error messages.

    Raises:
        ConfigError: ``out`` is a file, or a non-empty folder without ``overwrite``.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder; give a folder path for the {what}.")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(
                f"{out}: folder is not empty; choose a new folder, or pass --overwrite (overwrite=True in Python) to replace "
                f"its manifests and audio/{{{','.join(splits)}}}/*.wav (other files are kept)."
            )
        for split in splits:
            (out / f"{split}.jsonl").unlink(missing_ok=True)
            for wav in (out / "audio" / split).glob("*.wav"):
                wav.unlink()
    out.mkdir(parents=True, exist_ok=True)


def write_demo_corpus(
    out_dir: Pathlike,
    *,
    num_train: int = 600,
    num_dev: int = 60,
    num_test: int = 60,
    seed: int = 0,
    speech: str = "synthetic",
    sample_rate: int = 16000,
    min_seconds: float = 1.0,
    max_seconds: float = 20.0,
    overwrite: bool = False,
) -> DemoCorpus:
    """Write a seeded demo corpus: ``train/dev/test.jsonl`` and 16-bit WAVs under ``audio/``.

    Manifest lines are NeMo-style: ``{"audio_filepath": "audio/train/000001.wav"`` (relative to
    the manifest's folder), ``"duration"`` (exactly frames / sample_rate) and ``"text"``}. The
    same arguments give byte-identical files; the splits are drawn from separate random streams
    and share no transcript. Target lengths follow a log-normal around 3 s clipped to
    ``[min_seconds, max_seconds]``, so utterance lengths spread over the whole range.

    Args:
        out_dir: Folder to write into; created when missing, must be empty unless ``overwrite``.
        num_train: Utterances in the train split. (Default: 600)
        num_dev: Utterances in the dev split. (Default: 60)
        num_test: Utterances in the test split. (Default: 60)
        seed: Seeds the utterances; the vocabulary and the character sounds never change.
        speech: ``"synthetic"`` (pure numpy, pseudo-words, 18 characters with space) or
            ``"espeak"`` (English words spoken by ``espeak-ng``).
        sample_rate: Samples per second of the WAV files. (Default: 16000)
        min_seconds: Shortest utterance; shorter ones are padded with silence. (Default: 1.0)
        max_seconds: Longest utterance, at least 1.0. (Default: 20.0)
        overwrite: Replace the manifests and WAVs of an earlier demo corpus in ``out_dir``.

    Returns:
        A :class:`DemoCorpus` with the manifest paths, counts and seconds per split.

    Raises:
        ConfigError: On a bad count, seed, rate or length limit, or a non-empty ``out_dir``.
        AsrfitError: When ``speech="espeak"`` and ``espeak-ng`` is not on PATH.
        AudioError: When ``espeak-ng`` fails on an utterance.
    """
    check_speech(speech)
    counts = {"train": num_train, "dev": num_dev, "test": num_test}
    limits = _check_arguments(counts, seed, (min_seconds, max_seconds), sample_rate)
    if speech == "espeak" and shutil.which("espeak-ng") is None:
        raise AsrfitError(
            f"speech='espeak' needs the espeak-ng program, which is not on PATH; {ESPEAK_HINT}."
        )
    out = Path(out_dir)
    prepare_corpus_folder(out, overwrite)

    started = time.perf_counter()
    taken: set[str] = set()
    splits: dict[str, DemoSplit] = {}
    with tempfile.TemporaryDirectory(prefix="asrfit-demo-") as tmp:
        for split_id, split in enumerate(SPLITS):
            rng = np.random.default_rng([seed, split_id])
            audio_dir = out / "audio" / split
            audio_dir.mkdir(parents=True, exist_ok=True)
            lines: list[str] = []
            durations: list[float] = []
            texts: set[str] = set()
            for index in range(1, counts[split] + 1):
                for _ in range(1000):  # a transcript another split already holds is drawn again
                    if speech == "synthetic":
                        text, audio = synthetic_utterance(rng, limits)
                    else:
                        text, audio = espeak_utterance(rng, limits, Path(tmp))
                    if text not in taken:
                        break
                pcm = finish_audio(audio, rng)
                rel_path = f"audio/{split}/{index:06d}.wav"
                sf.write(out / rel_path, pcm, sample_rate, subtype="PCM_16", format="WAV")
                durations.append(pcm.size / sample_rate)
                texts.add(text)
                lines.append(
                    json.dumps(
                        {"audio_filepath": rel_path, "duration": durations[-1], "text": text}
                    )
                )
            taken |= texts
            manifest = atomic_write_text(out / f"{split}.jsonl", "\n".join(lines) + "\n")
            splits[split] = DemoSplit(
                split, str(manifest), len(lines), sum(durations), min(durations), max(durations)
            )
    characters = "".join(sorted(set(" ".join(taken)) | {" "}))
    corpus = DemoCorpus(str(out), speech, seed, sample_rate, characters, splits)
    logger.info(
        "wrote a %s demo corpus to %s in %.1f s: %s",
        speech,
        out,
        time.perf_counter() - started,
        ", ".join(
            f"{s.name} {s.num_utterances} utt / {s.total_seconds:.0f} s" for s in splits.values()
        ),
    )
    return corpus
