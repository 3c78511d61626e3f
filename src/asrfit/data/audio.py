"""Audio for training: decoding (soundfile), mono downmix, resampling (scipy), long-utterance
chunking and SpecAugment. No torchaudio."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from scipy.signal import resample_poly

from asrfit.errors import AudioError, ConfigError
from asrfit.utils.serialization import JsonDataclass


def to_mono(audio: np.ndarray) -> np.ndarray:
    """Average the channels of ``[samples, channels]`` audio (1-D audio is returned as is)."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim == 1:
        return audio
    if audio.ndim != 2:
        raise AudioError(
            f"audio with shape {audio.shape}: expected [samples] or [samples, channels]."
        )
    return audio.mean(axis=1, dtype=np.float32)


def resample(audio: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Resample 1-D audio with a polyphase filter (``scipy.signal.resample_poly``).

    Raises:
        AudioError: For a sampling rate that is not a positive whole number.
    """
    for name, rate in (("from_hz", from_hz), ("to_hz", to_hz)):
        if int(rate) != rate or rate <= 0:
            raise AudioError(
                f"{name}={rate!r}: sampling rates must be positive whole numbers of Hz."
            )
    from_hz, to_hz = int(from_hz), int(to_hz)
    if from_hz == to_hz:
        return np.asarray(audio, dtype=np.float32)
    g = math.gcd(from_hz, to_hz)
    return resample_poly(audio, to_hz // g, from_hz // g).astype(np.float32)


def load_audio(
    path: str | Path,
    sample_rate: int,
    *,
    offset_seconds: float = 0.0,
    duration_seconds: float | None = None,
) -> np.ndarray:
    """Decode an audio file (or a span of it) to mono float32 at ``sample_rate``.

    Args:
        path: Any file soundfile reads (WAV, FLAC, OGG, MP3 with libsndfile >= 1.1).
        sample_rate: Target rate; the file is resampled when it differs.
        offset_seconds: Start of the span.
        duration_seconds: Length of the span. (Default: to the end)

    Raises:
        AudioError: When the file is missing or cannot be decoded (naming it).
    """
    p = Path(path)
    try:
        with sf.SoundFile(str(p)) as f:
            native = f.samplerate
            start = int(round(offset_seconds * native))
            frames = -1 if duration_seconds is None else int(round(duration_seconds * native))
            if start:
                f.seek(start)
            data = f.read(frames=frames, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioError(
            f"{p}: cannot decode audio ({err}); re-encode it or drop it from the manifest."
        ) from err
    if data.size == 0:
        raise AudioError(f"{p}: the audio is empty; drop it from the manifest.")
    return resample(to_mono(data), native, sample_rate)


def chunk_bounds(audio: np.ndarray, sample_rate: int, max_seconds: float) -> list[tuple[int, int]]:
    """Split points for audio longer than ``max_seconds``: equal-length pieces, each cut moved
    to the quietest 20 ms within ±0.5 s so that cuts fall between words where possible.

    Returns:
        ``(start, end)`` sample spans covering the audio; one span when it is short enough.
    """
    n = len(audio)
    limit = int(max_seconds * sample_rate)
    if n <= limit:
        return [(0, n)]
    win = max(1, sample_rate // 50)
    pieces = math.ceil(n / limit)
    # a cut moves at most half the slack, so no piece is cut again into a sliver; with no
    # slack (300 s at a 30 s limit), one more piece makes room
    search = int(min(sample_rate // 2, (limit - n / pieces) / 2))
    if search < win:
        pieces += 1
        search = int(min(sample_rate // 2, (limit - n / pieces) / 2))
    cuts = [0]
    for k in range(1, pieces):
        ideal = k * n // pieces
        lo, hi = max(cuts[-1] + win, ideal - search), min(n - win, ideal + search)
        if hi <= lo:
            cuts.append(ideal)
            continue
        seg = audio[lo:hi].astype(np.float64) ** 2
        energy = np.convolve(seg, np.ones(win), mode="valid")
        cuts.append(lo + int(np.argmin(energy)) + win // 2)
    cuts.append(n)
    # a moved cut must not leave a piece over the limit
    fixed = [0]
    for cut in cuts[1:]:
        while cut - fixed[-1] > limit:
            fixed.append(fixed[-1] + limit)
        fixed.append(cut)
    return list(zip(fixed[:-1], fixed[1:], strict=True))


def split_transcript(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """Share a transcript's words among audio spans in proportion to their lengths.

    An approximation for training on chunked long utterances when no alignment is known:
    words are assigned by the position of their middle character along the transcript.
    """
    words = text.split()
    total = spans[-1][1] - spans[0][0]
    if len(spans) == 1 or not words:
        return [text] + [""] * (len(spans) - 1)
    chars = sum(len(w) for w in words) + len(words) - 1
    out: list[list[str]] = [[] for _ in spans]
    position = 0
    for word in words:
        middle = (position + len(word) / 2) / max(chars, 1) * total
        index = next(
            (i for i, (_, e) in enumerate(spans) if middle < e - spans[0][0]), len(spans) - 1
        )
        out[index].append(word)
        position += len(word) + 1
    return [" ".join(ws) for ws in out]


@dataclass(frozen=True)
class SpecAugment(JsonDataclass):
    """SpecAugment (Park et al. 2019) on ``[frames, bins]`` features: frequency and time masks.

    Attributes:
        freq_masks: Frequency masks per utterance.
        freq_width: Largest frequency mask, in bins.
        time_masks: Time masks per utterance.
        time_width_ratio: Largest time mask as a share of the utterance's frames.
    """

    freq_masks: int = 2
    freq_width: int = 15
    time_masks: int = 2
    time_width_ratio: float = 0.05

    def __post_init__(self) -> None:
        if (
            min(self.freq_masks, self.freq_width, self.time_masks) < 0
            or not 0 <= self.time_width_ratio < 1
        ):
            raise ConfigError(
                f"{self}: mask counts and widths must be >= 0, time_width_ratio in [0, 1)."
            )

    def __call__(
        self, features: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Return masked features (a copy); masked values are set to the utterance's mean."""
        out = features.clone()
        frames, bins = out.shape
        fill = out.mean()

        def draw(high: int) -> int:
            return int(torch.randint(0, max(high, 0) + 1, (1,), generator=generator))

        for _ in range(self.freq_masks):
            width = draw(min(self.freq_width, bins))
            start = draw(bins - width)
            out[:, start : start + width] = fill
        max_time = int(self.time_width_ratio * frames)
        for _ in range(self.time_masks):
            width = draw(max_time)
            start = draw(frames - width)
            out[start : start + width, :] = fill
        return out
