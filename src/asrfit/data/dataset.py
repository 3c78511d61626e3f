"""Utterances from any source, prepared into model samples with logged, counted skips.

Sources: a NeMo-style JSONL manifest, a folder of audio files with transcripts, a Hugging
Face ``datasets.Dataset`` with an audio column (paths or embedded bytes, any sampling rate)
and a lhotse ``CutSet``. :class:`SpeechDataset` checks every utterance before training, so
bad data never stops an epoch:

* an empty transcript, characters outside the vocabulary, a transcript longer than the
  model's CTC frames allow (CTC models only: transducers such as Parakeet-TDT may emit
  several tokens per frame), labels longer than a decoder's positions (Whisper's
  ``max_target_positions``), or (with ``long_utterances="filter"``) audio above the plan's
  longest bucket are skipped and counted in :attr:`SpeechDataset.skipped`;
* audio above the longest bucket with ``long_utterances="chunk"`` is split at quiet points;
* a file that fails to decode during training, or whose samples or features hold NaN or
  infinity, is logged, counted and replaced by the longest good utterance no longer than it
  (the batch keeps its memory bound); with ``event_log`` the counts survive data-loader
  worker processes (each replacement is appended to that file).

SpecAugment's masks are drawn from a generator seeded by ``(seed, epoch, index)``
(:meth:`SpeechDataset.set_epoch`), so they do not depend on what was drawn before: a
resumed run, a data-loader worker and a re-collated out-of-memory half draw the same masks.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

from asrfit.data.audio import (
    SpecAugment,
    chunk_bounds,
    load_audio,
    resample,
    split_transcript,
    to_mono,
)
from asrfit.data.features import Frontend
from asrfit.data.text import TextCodec
from asrfit.errors import AudioError, ConfigError, ManifestError

logger = logging.getLogger(__name__)

SKIP_REASONS = {
    "empty_transcript": "empty transcript",
    "unknown_characters": "characters outside the vocabulary",
    "too_long_for_ctc": "transcript longer than the CTC frames allow",
    "too_long_for_decoder": "labels longer than the decoder's max_target_positions",
    "too_long": "audio longer than the longest bucket (filtered)",
    "unreadable_audio": "audio that cannot be read",
    "non_finite_audio": "audio or features with NaN or infinite values",
}


@dataclass
class Utterance:
    """One utterance: where its audio is, its transcript and duration.

    Attributes:
        source: A file path, encoded audio bytes, or a lhotse cut.
        text: The transcript (raw; normalised when encoded).
        duration_seconds: Length of the audio (of the span, when ``offset_seconds`` is set).
        offset_seconds: Start of the span within the file.
        where: Where it came from, for messages ("train.jsonl line 12").
    """

    source: Any
    text: str
    duration_seconds: float
    offset_seconds: float = 0.0
    where: str = ""

    def load(self, sample_rate: int) -> np.ndarray:
        """Decode to mono float32 at ``sample_rate``.

        Raises:
            AudioError: When the audio cannot be decoded.
        """
        if isinstance(self.source, (str, Path)):
            span = self.duration_seconds if self.offset_seconds else None
            return load_audio(
                self.source, sample_rate, offset_seconds=self.offset_seconds, duration_seconds=span
            )
        if isinstance(self.source, (bytes, bytearray)):
            try:
                data, rate = sf.read(io.BytesIO(self.source), dtype="float32", always_2d=True)
            except (sf.LibsndfileError, RuntimeError) as err:
                raise AudioError(
                    f"{self.where}: cannot decode the embedded audio ({err})."
                ) from err
            return resample(to_mono(data), rate, sample_rate)
        try:  # a lhotse cut
            data = np.asarray(self.source.load_audio(), dtype=np.float32)
        except Exception as err:  # lhotse raises many types
            raise AudioError(f"{self.where}: lhotse cannot load the cut's audio ({err}).") from err
        mono = data.mean(axis=0) if data.ndim == 2 else data
        return resample(mono, int(self.source.sampling_rate), sample_rate)


def utterances_from(
    source: Any, *, audio_column: str = "audio", text_column: str | None = None
) -> list[Utterance]:
    """Collect the utterances of a manifest path, an audio folder, a ``datasets.Dataset`` or
    a lhotse ``CutSet``. A dataset's transcript column is ``text_column``, or (None) the first
    of the usual names present (``text``, ``sentence``, ...; as the dataset profile finds it).

    Raises:
        ManifestError: For a missing file or column, or a malformed manifest line (named).
    """
    from asrfit.profiles.audio_files import read_audio_header, scan_audio_folder
    from asrfit.profiles.manifest import iter_manifest

    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            out = []
            for audio, text in scan_audio_folder(path):
                try:
                    seconds = read_audio_header(audio).duration_seconds
                except AudioError:
                    seconds = math.nan  # unreadable: skipped, counted, by validation or the dataset
                out.append(Utterance(audio, text or "", seconds, where=str(audio)))
            return out
        out = []
        for entry in iter_manifest(path):
            duration = entry.duration_seconds
            if duration is None:
                try:
                    duration = read_audio_header(entry.audio_filepath).duration_seconds
                except AudioError:
                    duration = math.nan  # unreadable: skipped, counted, by the dataset
            out.append(
                Utterance(
                    entry.audio_filepath,
                    entry.text,
                    duration,
                    where=f"{path} line {entry.line_number} ({entry.audio_filepath.name})",
                )
            )
        return out
    if type(source).__name__ in ("CutSet", "LazyCutSet") or hasattr(source, "subset"):
        return [
            Utterance(
                cut,
                " ".join(s.text for s in cut.supervisions if s.text),
                float(cut.duration),
                where=f"cut {cut.id}",
            )
            for cut in source
        ]
    if hasattr(source, "column_names"):
        return _hf_utterances(source, audio_column, text_column)
    raise ConfigError(
        f"data source of type {type(source).__name__}: pass a JSONL manifest, an audio folder, "
        "a datasets.Dataset or a lhotse CutSet."
    )


def _hf_utterances(ds: Any, audio_column: str, text_column: str | None) -> list[Utterance]:
    import datasets

    from asrfit.profiles.dataset_stats import text_column_of

    if audio_column not in ds.column_names:
        raise ManifestError(
            f"dataset columns {ds.column_names} have no {audio_column!r}; pass its name."
        )
    text_column = text_column_of(ds.column_names, text_column, "datasets.Dataset")
    if isinstance(ds.features.get(audio_column), datasets.Audio):
        ds = ds.cast_column(audio_column, datasets.Audio(decode=False))
    out = []
    for i, row in enumerate(ds):
        audio = row[audio_column]
        where = f"dataset row {i}"
        source = (audio.get("bytes") or audio.get("path")) if isinstance(audio, dict) else audio
        if source is None:
            raise ManifestError(
                f"{where}: the {audio_column!r} value has neither bytes nor a path."
            )
        try:
            info = sf.info(io.BytesIO(source) if isinstance(source, bytes) else str(source))
            duration = float(info.duration)
        except (sf.LibsndfileError, RuntimeError, OSError):
            duration = math.nan
        out.append(Utterance(source, str(row[text_column] or ""), duration, where=where))
    return out


class SpeechDataset(torch.utils.data.Dataset):
    """Model samples (inputs + labels) from utterances, checked before training.

    Args:
        utterances: From :func:`utterances_from`.
        vocab: The character vocabulary (or a pretrained tokenizer, :class:`~asrfit.data.text.PretrainedText`).
        frontend: Audio to model inputs.
        output_frames: Model output frames for a number of input frames (the CTC check);
            ``None`` skips the check (Whisper, Parakeet-TDT).
        label_prefix: Ids put before every transcript's ids (Whisper with its own tokenizer:
            language and task tokens). (Default: none)
        label_suffix: Ids put after them (Whisper: end of text). (Default: none)
        max_labels: The most labels (prefix and suffix included) a sample may have: longer
            ones are skipped as ``too_long_for_decoder``. (Default: no limit)
        max_seconds: The longest audio trained on. (Default: no limit)
        long_utterances: ``"chunk"`` or ``"filter"`` audio above ``max_seconds``.
        spec_augment: Masks applied to ``input_features`` (training only).
        cache: Keep computed inputs in memory (SpecAugment is applied after the cache).
        seed: Seeds SpecAugment.
        keep_unknown: Keep utterances with characters outside the vocabulary (for scoring).
        event_log: A JSONL file each replacement is appended to (counts across worker
            processes). (Default: counts in memory only)
    """

    def __init__(
        self,
        utterances: Sequence[Utterance],
        vocab: TextCodec,
        frontend: Frontend,
        *,
        output_frames: Callable[[int], int] | None = None,
        label_prefix: Sequence[int] = (),
        label_suffix: Sequence[int] = (),
        max_labels: int | None = None,
        max_seconds: float | None = None,
        long_utterances: str = "filter",
        spec_augment: SpecAugment | None = None,
        cache: bool = False,
        seed: int = 0,
        keep_unknown: bool = False,
        event_log: str | Path | None = None,
    ) -> None:
        if long_utterances not in ("chunk", "filter"):
            raise ConfigError(f"long_utterances={long_utterances!r}: use 'chunk' or 'filter'.")
        self.vocab, self.frontend, self.spec_augment = vocab, frontend, spec_augment
        self.label_prefix, self.label_suffix = tuple(label_prefix), tuple(label_suffix)
        self.max_labels = max_labels
        self.skipped: Counter[str] = Counter()
        self.skip_entries: list[dict[str, str]] = []
        self.replaced: Counter[str] = Counter()
        self._cache: dict[int, dict[str, torch.Tensor]] | None = {} if cache else None
        self.seed, self.epoch = int(seed), 0
        self.event_log = None if event_log is None else Path(event_log)
        self.utterances: list[Utterance] = []
        self.labels: list[list[int]] = []
        self.texts: list[str] = []
        for utt in utterances:
            for piece in self._pieces(utt, max_seconds, long_utterances):
                self._admit(piece, output_frames, keep_unknown)
        for reason, count in self.skipped.items():
            logger.warning(
                "skipped %d utterances: %s (see the log above for each)",
                count,
                SKIP_REASONS[reason],
            )
        if not self.utterances:
            raise ConfigError(
                f"no usable utterances remain (skipped: {dict(self.skipped)}); check the data."
            )
        order = np.argsort([u.duration_seconds for u in self.utterances], kind="stable")
        self._by_duration = order
        self._bad: set[int] = set()

    def _skip(self, reason: str, utt: Utterance, detail: str = "") -> None:
        self.skipped[reason] += 1
        self.skip_entries.append({"where": utt.where, "reason": reason, "detail": detail})
        logger.info(
            "skip %s: %s%s", utt.where, SKIP_REASONS[reason], f" ({detail})" if detail else ""
        )

    def _pieces(self, utt: Utterance, max_seconds: float | None, mode: str) -> list[Utterance]:
        if not math.isfinite(utt.duration_seconds) or utt.duration_seconds <= 0:
            self._skip("unreadable_audio", utt, "no readable header")
            return []
        if max_seconds is None or utt.duration_seconds <= max_seconds:
            return [utt]
        if mode == "filter":
            self._skip("too_long", utt, f"{utt.duration_seconds:.1f} s > {max_seconds:.1f} s")
            return []
        try:
            audio = utt.load(self.frontend.sample_rate)
        except AudioError as err:
            self._skip("unreadable_audio", utt, str(err))
            return []
        rate = self.frontend.sample_rate
        spans = chunk_bounds(audio, rate, max_seconds)
        texts = split_transcript(utt.text, spans)
        return [
            Utterance(
                utt.source,
                text,
                (e - s) / rate,
                utt.offset_seconds + s / rate,
                where=f"{utt.where} chunk {k + 1}/{len(spans)}",
            )
            for k, ((s, e), text) in enumerate(zip(spans, texts, strict=True))
        ]

    def _admit(
        self, utt: Utterance, output_frames: Callable[[int], int] | None, keep_unknown: bool
    ) -> None:
        ids, unknown = self.vocab.encode(utt.text)
        if not ids:
            self._skip("empty_transcript", utt)
            return
        if unknown and not keep_unknown:
            self._skip("unknown_characters", utt, f"{unknown} in {utt.text!r}")
            return
        if output_frames is not None:
            repeats = sum(a == b for a, b in zip(ids, ids[1:], strict=False))
            frames = output_frames(
                math.ceil(utt.duration_seconds * self.frontend.frames_per_second)
            )
            if len(ids) + repeats > frames:
                self._skip(
                    "too_long_for_ctc", utt, f"{len(ids) + repeats} labels > {frames} frames"
                )
                return
        labels = [*self.label_prefix, *ids, *self.label_suffix]
        if self.max_labels is not None and len(labels) > self.max_labels:
            self._skip(
                "too_long_for_decoder", utt, f"{len(labels)} labels > {self.max_labels} positions"
            )
            return
        self.utterances.append(utt)
        self.labels.append(labels)
        self.texts.append(self.vocab.normalizer(utt.text))

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def durations(self) -> list[float]:
        """Seconds per sample (for the sampler and the planner)."""
        return [u.duration_seconds for u in self.utterances]

    @property
    def label_lengths(self) -> list[int]:
        """Labels per sample."""
        return [len(ids) for ids in self.labels]

    def set_cache(self, enabled: bool) -> None:
        """Keep computed inputs in memory (from now on) or not."""
        if not enabled:
            self._cache = None
        elif self._cache is None:
            self._cache = {}

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch SpecAugment's masks are drawn for (the trainer calls it)."""
        self.epoch = int(epoch)

    def replacements(self) -> dict[str, int]:
        """Utterances replaced during training, by reason, each counted once (from
        ``event_log`` when set)."""
        if self.event_log is None or not self.event_log.is_file():
            return dict(self.replaced)
        seen: dict[str, str] = {}  # one count per utterance, whichever process saw it
        for line in self.event_log.read_text(encoding="utf-8").splitlines():
            if line.strip():
                event = json.loads(line)
                seen.setdefault(event["where"], event["reason"])
        return dict(Counter(seen.values()))

    def skip_summary(self) -> dict[str, int]:
        """Skipped and replaced utterances by reason."""
        return {
            **dict(self.skipped),
            **{f"replaced_{k}": v for k, v in self.replacements().items()},
        }

    def _record_replacement(self, reason: str, index: int, message: str) -> None:
        self.replaced[reason] += 1
        if self.event_log is not None:  # one short O_APPEND write: whole lines from any process
            line = json.dumps(
                {"reason": reason, "where": self.utterances[index].where, "detail": message}
            )
            fd = os.open(self.event_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            finally:
                os.close(fd)

    def _inputs(self, index: int) -> dict[str, torch.Tensor]:
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        utt = self.utterances[index]
        audio = utt.load(self.frontend.sample_rate)
        if not np.isfinite(audio).all():
            bad = int((~np.isfinite(audio)).sum())
            raise NonFiniteAudioError(
                f"{utt.where}: {bad} audio samples are NaN or infinite; fix or drop the file"
            )
        inputs = self.frontend(audio)
        for key, value in inputs.items():
            if (
                isinstance(value, torch.Tensor)
                and value.is_floating_point()
                and not torch.isfinite(value).all()
            ):
                raise NonFiniteAudioError(
                    f"{utt.where}: the model inputs ({key}) hold NaN or infinity"
                )
        if self._cache is not None:
            self._cache[index] = inputs
        return inputs

    def _substitute(self, index: int) -> int:
        """The longest good utterance no longer than ``index`` (else the shortest good one)."""
        position = int(np.nonzero(self._by_duration == index)[0][0])
        for j in [*self._by_duration[:position][::-1], *self._by_duration[position + 1 :]]:
            if int(j) not in self._bad:
                return int(j)
        raise ConfigError("every utterance failed to decode; check the audio files.")

    def __getitem__(self, index: int) -> dict[str, Any]:
        while index in self._bad:  # known bad here: no second decode, no second count
            index = self._substitute(index)
        while True:
            try:
                inputs = self._inputs(index)
                break
            except AudioError as err:
                self._bad.add(index)
                reason = (
                    "non_finite_audio"
                    if isinstance(err, NonFiniteAudioError)
                    else "unreadable_audio"
                )
                self._record_replacement(reason, index, str(err))
                substitute = self._substitute(index)
                logger.warning(
                    "%s; replaced in this batch by %s", err, self.utterances[substitute].where
                )
                index = substitute
        sample = dict(inputs)
        if self.spec_augment is not None and sample.get("input_features") is not None:
            feats = sample["input_features"]
            if feats.dim() == 2:
                generator = torch.Generator().manual_seed(_mask_seed(self.seed, self.epoch, index))
                sample["input_features"] = self.spec_augment(feats, generator)
        sample["labels"] = torch.tensor(self.labels[index], dtype=torch.long)
        return sample


class NonFiniteAudioError(AudioError):
    """Decoded audio, or the features made from it, hold NaN or infinite values."""


def _mask_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit seed for one utterance's SpecAugment masks in one epoch."""
    return int(
        np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint64)[0] >> np.uint64(1)
    )
