"""The demo corpus's sounds: a fixed acoustic signature per character, or espeak-ng words.

See :mod:`asrfit.recipes.demo` for the corpus itself. ``"synthetic"`` speech is pure numpy
(vowel-, sonorant-, fricative- and stop-like segments per character); ``"espeak"`` renders
real English words with ``espeak-ng`` and a few voices and speeds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import scipy.fft
import soundfile as sf

from asrfit.errors import AudioError, ConfigError

logger = logging.getLogger(__name__)

SPEECH_KINDS = ("synthetic", "espeak")
ESPEAK_HINT = "install it with `apt-get install espeak-ng`, or pass speech='synthetic'"


# --- the acoustic mapping -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _CharSound:
    """One character's sound; every frequency stays under 7.8 kHz (16 kHz audio)."""

    kind: str  # "vowel" | "sonorant" | "fricative" | "stop"
    formants: tuple[tuple[float, float, float], ...]  # voiced: (centre Hz, width Hz, gain)
    bands: tuple[tuple[float, float, float], ...]  # noise: (centre Hz, width Hz, gain)
    noise_mix: float  # share of the noise part in the segment's level, 0..1
    base_ms: float


_CHAR_SOUNDS: dict[str, _CharSound] = {
    "a": _CharSound("vowel", ((750, 110, 1.0), (1200, 130, 0.8), (2500, 200, 0.3)), (), 0.3, 110),
    "e": _CharSound("vowel", ((430, 80, 1.0), (2000, 130, 0.7), (2800, 180, 0.4)), (), 0.3, 110),
    "i": _CharSound("vowel", ((280, 90, 0.8), (2400, 150, 0.9), (3200, 200, 0.7)), (), 0.3, 110),
    "o": _CharSound("vowel", ((520, 90, 1.0), (850, 100, 0.9), (2400, 200, 0.15)), (), 0.3, 110),
    "u": _CharSound("vowel", ((330, 130, 1.0), (680, 120, 0.5), (2200, 200, 0.1)), (), 0.3, 110),
    "m": _CharSound("sonorant", ((250, 140, 1.0), (1100, 120, 0.3), (2200, 200, 0.1)), (), 0.3, 80),
    "n": _CharSound("sonorant", ((260, 100, 0.7), (1600, 120, 0.6), (2600, 200, 0.2)), (), 0.3, 80),
    "l": _CharSound("sonorant", ((380, 100, 1.0), (1000, 100, 0.3), (3000, 200, 0.5)), (), 0.3, 80),
    "r": _CharSound("sonorant", ((420, 100, 0.6), (1300, 100, 1.0), (1650, 120, 0.7)), (), 0.3, 80),
    "f": _CharSound("fricative", (), ((3300, 400, 1.0),), 1.0, 90),
    "s": _CharSound("fricative", (), ((6500, 700, 1.0),), 1.0, 90),
    "p": _CharSound("stop", (), ((800, 100, 1.0),), 1.0, 80),
    "k": _CharSound("stop", (), ((1800, 220, 1.0),), 1.0, 80),
    "t": _CharSound("stop", (), ((5000, 550, 1.0),), 1.0, 80),
    "b": _CharSound("stop", ((200, 90, 1.0),), ((1250, 150, 1.0),), 0.7, 80),
    "g": _CharSound("stop", ((200, 90, 1.0),), ((2500, 300, 1.0),), 0.7, 80),
    "d": _CharSound("stop", ((200, 90, 1.0),), ((4100, 450, 1.0),), 0.7, 80),
}
_ALPHABET = "".join(sorted(_CHAR_SOUNDS))
_CHAR_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
_BASE_F0_HZ = 110.0
_MAX_HZ = 7800.0

# --- vocabularies ---------------------------------------------------------------------------
_VOCAB_SEED = 20_240_601  # fixed: every corpus, whatever its seed, shares one vocabulary
_VOCAB_SIZE = 200
_ENGLISH_TEXT = """
    the of and to in is it you that he was for on are with as his they be at one have this
    from or had by word but what some we can out other were all there when up use your how
    said an each she which do their time if will way about many then them write would like
    so these her long make thing see him two has look more day could go come did number
    sound no most people my over know water than call first who may down side been now find
    any new work part take get place made live where after back little only round man year
    came show every good me give our under name very through just form sentence great think
    say help low line differ turn cause much mean before move right boy old too same tell
    does set three want air well also play small end put home read hand port large spell add
    even land here must big high such follow act why ask men change went light kind off need
    house picture try us again animal point mother world near build self earth father head
    stand own page should country found answer school grow study still learn plant cover food
    sun four between state keep eye never last let thought city tree cross farm hard start
    """
_ENGLISH_WORDS = tuple(_ENGLISH_TEXT.split())


def demo_vocabulary(speech: str = "synthetic") -> tuple[str, ...]:
    """Return the fixed word list a demo corpus draws its transcripts from.

    Args:
        speech: ``"synthetic"`` (200 pronounceable pseudo-words over 17 letters) or
            ``"espeak"`` (common English words).

    Returns:
        The words, lowercase, in a fixed order.

    Raises:
        ConfigError: When ``speech`` is not one of the two kinds.
    """
    check_speech(speech)
    return _pseudo_words() if speech == "synthetic" else _ENGLISH_WORDS


@lru_cache(maxsize=1)
def _pseudo_words() -> tuple[str, ...]:
    rng = np.random.default_rng(_VOCAB_SEED)
    vowels = [c for c in _ALPHABET if _CHAR_SOUNDS[c].kind == "vowel"]
    consonants = [c for c in _ALPHABET if _CHAR_SOUNDS[c].kind != "vowel"]
    codas = ["n", "s", "l", "r", "m", "t", "k"]
    words: dict[str, None] = {}
    while len(words) < _VOCAB_SIZE:
        word = ""
        for k in range(int(rng.choice([1, 2, 3], p=[0.3, 0.5, 0.2]))):
            onset = str(rng.choice(consonants))
            double = k > 0 and rng.random() < 0.2  # "bella": doubled letters for CTC to split
            word += onset * (2 if double else 1) + str(rng.choice(vowels))
        if rng.random() < 0.3:
            word += str(rng.choice(codas))
        words.setdefault(word, None)
    return tuple(words)


# --- synthetic rendering --------------------------------------------------------------------
@lru_cache(maxsize=16)
def _spectral_shapes(nfft: int, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-character voiced and noise magnitude responses on an ``nfft`` rfft grid."""
    freqs_hz = np.fft.rfftfreq(nfft, 1.0 / sample_rate)
    voiced = np.zeros((len(_ALPHABET), freqs_hz.size))
    noise = np.zeros_like(voiced)
    for i, char in enumerate(_ALPHABET):
        sound = _CHAR_SOUNDS[char]
        for centre, width, gain in sound.formants:
            voiced[i] += gain * np.exp(-0.5 * ((freqs_hz - centre) / width) ** 2)
        for centre, width, gain in sound.bands:
            noise[i] += gain * np.exp(-0.5 * ((freqs_hz - centre) / width) ** 2)
        if sound.kind in ("vowel", "sonorant"):  # breathy voicing: formant-shaped aspiration noise
            noise[i] = voiced[i]
    cut = freqs_hz > _MAX_HZ
    voiced[:, cut] = 0.0
    noise[:, cut] = 0.0
    return voiced.astype(np.float32), noise.astype(np.float32)


def _segment_lengths(
    text: str, rng: np.random.Generator, tempo: float, sample_rate: int
) -> np.ndarray:
    """Sample the length of each character segment of one word."""
    base_seconds = np.array([_CHAR_SOUNDS[c].base_ms / 1000.0 for c in text])
    jitter = rng.uniform(0.92, 1.08, size=len(text))
    return np.round(base_seconds * tempo * jitter * sample_rate).astype(np.int64)


def _white_noise(rng: np.random.Generator, num_samples: int) -> np.ndarray:
    """Unit-variance white noise (uniform, which is much faster to draw than Gaussian)."""
    return (rng.random(num_samples, dtype=np.float32) - np.float32(0.5)) * np.float32(
        math.sqrt(12.0)
    )


def _excitations(
    total_samples: int, pad: int, rng: np.random.Generator, rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """A glottal pulse train (``rate`` cycles per sample, falling by 8%) and white noise.

    Pulse k sits where the integrated pitch, ``phase0 + rate * n - fall * n**2``, first
    reaches k. Both are zero-padded by ``pad`` samples so every segment can take a full frame.
    """
    fall = 0.04 * rate / total_samples
    phase0 = rng.random()
    cycles = np.arange(1, int(phase0 + rate * total_samples - fall * total_samples**2) + 1) - phase0
    at = np.ceil(2 * cycles / (rate + np.sqrt(rate**2 - 4 * fall * cycles))).astype(np.int64)
    pulses = np.zeros(total_samples + pad, dtype=np.float32)
    pulses[at[at < total_samples]] = 1.0
    noise = np.zeros(total_samples + pad, dtype=np.float32)
    noise[:total_samples] = _white_noise(rng, total_samples)
    return pulses, noise


def _render_words(
    words: list[str],
    seg_lengths: list[np.ndarray],
    gaps: list[int],
    total_samples: int,
    rng: np.random.Generator,
    pitch_hz: float,
    sample_rate: int,
) -> np.ndarray:
    """Render ``words`` into a signal of ``total_samples``.

    Each letter is a segment of the given length, and ``gaps[k]`` silent samples come before
    word ``k``. Each segment filters its own slice of the utterance's excitations through its
    character's spectral shapes, then gets its time envelope and level.
    """
    out = np.zeros(total_samples, dtype=np.float32)
    if not "".join(words):
        return out
    char_ids = np.array([_CHAR_INDEX[c] for c in "".join(words)], dtype=np.int64)
    lengths = np.concatenate(seg_lengths)
    silence = np.zeros_like(lengths)
    silence[np.cumsum([0] + [len(w) for w in words[:-1]])] = gaps
    starts = np.cumsum(silence + lengths) - lengths
    nfft = scipy.fft.next_fast_len(int(lengths.max()) + 64, real=True)
    pulses, noise = _excitations(total_samples, nfft, rng, pitch_hz / sample_rate)
    voiced_shape, noise_shape = _spectral_shapes(nfft, sample_rate)
    sounds = [_CHAR_SOUNDS[_ALPHABET[i]] for i in char_ids]
    has_voice = np.array([bool(s.formants) for s in sounds])
    is_stop = np.array([s.kind == "stop" for s in sounds])
    mix = np.array([s.noise_mix for s in sounds], dtype=np.float32)

    def filtered(excitation: np.ndarray, rows: np.ndarray, shapes: np.ndarray) -> np.ndarray:
        frames = np.lib.stride_tricks.sliding_window_view(excitation, nfft)[starts[rows]]
        spectrum = scipy.fft.rfft(frames, axis=1) * shapes[char_ids[rows]]
        return scipy.fft.irfft(spectrum, nfft, axis=1)

    voiced = np.zeros((char_ids.size, nfft), dtype=np.float32)
    voiced[has_voice] = filtered(pulses, has_voice, voiced_shape)
    hiss = filtered(noise, np.ones_like(has_voice), noise_shape)

    # Time envelopes: raised-cosine fades (the dip between segments) and, for stops, a closure
    # (silent noise part) then a decaying burst. Past a segment's length everything is zero.
    pos = np.arange(nfft, dtype=np.float32)
    stop_len = lengths[is_stop, None].astype(np.float32)
    after = pos - np.round(0.35 * stop_len)
    burst = np.clip(after / (0.003 * sample_rate), 0.0, 1.0)
    hiss[is_stop] *= burst * np.exp(-np.maximum(after, 0.0) / (0.25 * stop_len))
    ramp = max(1, min(int(0.015 * sample_rate), int(lengths.min()) // 4))
    rise = (0.5 - 0.5 * np.cos(np.pi * (np.arange(ramp) + 1.0) / ramp)).astype(np.float32)
    rows = np.arange(char_ids.size)[:, None]
    tail = (lengths[:, None] - ramp) + np.arange(ramp)
    inside = pos < lengths[:, None]
    for part in (voiced, hiss):
        part[:, :ramp] *= rise
        part[rows, tail] *= rise[::-1]
        part *= inside

    level = rng.uniform(0.8, 1.2, size=char_ids.size).astype(np.float32)
    voiced_rms = np.sqrt(np.einsum("ij,ij->i", voiced, voiced) / lengths) + 1e-12
    hiss_rms = np.sqrt(np.einsum("ij,ij->i", hiss, hiss) / lengths) + 1e-12
    voiced *= (level * (1.0 - mix) / voiced_rms)[:, None]
    voiced += (level * mix / hiss_rms)[:, None] * hiss
    for row, start, seg_len in zip(voiced, starts, lengths, strict=True):
        out[start : start + seg_len] = row[:seg_len]
    return out


def synthesize_text(
    text: str,
    *,
    seed: int = 0,
    sample_rate: int = 16000,
    pitch_factor: float = 1.0,
    tempo_factor: float = 1.0,
) -> np.ndarray:
    """Render ``text`` with the synthetic character sounds (no lead or trail silence, no noise).

    This is the sound of the ``"synthetic"`` demo corpus, for checking that its characters
    are told apart (the corpus adds per-utterance pitch and tempo and background noise).

    Args:
        text: Lowercase letters of the synthetic alphabet and spaces (a word gap).
        seed: Seeds segment-length, level and noise jitter.
        sample_rate: Samples per second, at least 16000.
        pitch_factor: Scales the base pitch of 110 Hz.
        tempo_factor: Scales every segment's length (above 1 is slower).

    Returns:
        A float32 signal with peak 0.5.

    Raises:
        ConfigError: On a character outside :func:`demo_characters` or a bad rate.
    """
    check_sample_rate(sample_rate)
    bad = sorted({c for c in text if c != " " and c not in _CHAR_SOUNDS})
    if bad:
        raise ConfigError(
            f"synthesize_text: characters {bad!r} have no sound; use only {_ALPHABET!r} and spaces."
        )
    rng = np.random.default_rng(seed)
    words = text.split()
    seg_lengths = [_segment_lengths(w, rng, tempo_factor, sample_rate) for w in words]
    gaps = [0] + [int(round(0.1 * tempo_factor * sample_rate))] * (len(words) - 1)
    total = sum(gaps) + int(sum(x.sum() for x in seg_lengths))
    audio = _render_words(
        words, seg_lengths, gaps, total, rng, _BASE_F0_HZ * pitch_factor, sample_rate
    )
    return audio / (np.abs(audio).max(initial=0.0) + 1e-12) * 0.5


def demo_characters(speech: str = "synthetic") -> str:
    """Return the sorted characters that can occur in a demo transcript, space included."""
    return "".join(sorted({" ", *"".join(demo_vocabulary(speech))}))


# --- utterances -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class UtteranceLimits:
    min_samples: int
    max_samples: int
    sample_rate: int


def _target_samples(rng: np.random.Generator, limits: UtteranceLimits) -> int:
    """A skewed target length: log-normal around 3 s, clipped to the limits."""
    seconds = rng.lognormal(mean=math.log(3.0), sigma=0.75)
    return int(np.clip(round(seconds * limits.sample_rate), limits.min_samples, limits.max_samples))


def synthetic_utterance(
    rng: np.random.Generator, limits: UtteranceLimits
) -> tuple[str, np.ndarray]:
    """Draw words until the next one would pass a drawn target length; render them."""
    sr = limits.sample_rate
    vocab = _pseudo_words()
    target = _target_samples(rng, limits)
    tempo = rng.uniform(0.9, 1.1)
    pitch_hz = _BASE_F0_HZ * rng.uniform(0.9, 1.1)
    trail = int(round(rng.uniform(0.1, 0.2) * sr))
    gaps = [int(round(rng.uniform(0.1, 0.2) * sr))]  # the first gap is the leading silence
    words: list[str] = []
    seg_lengths: list[np.ndarray] = []
    cursor = gaps[0]
    for _ in range(10_000):
        word = vocab[int(rng.integers(len(vocab)))]
        seg = _segment_lengths(word, rng, tempo, sr)
        gap = int(round(rng.uniform(0.06, 0.16) * tempo * sr)) if words else 0
        end = cursor + gap + int(seg.sum())
        if words and end + trail > target:
            break
        if end + trail > limits.max_samples:
            continue  # only a first word can get here: draw a shorter one
        if words:
            gaps.append(gap)
        words.append(word)
        seg_lengths.append(seg)
        cursor = end
    if not words:
        raise ConfigError(
            f"max_seconds={limits.max_samples / sr}: too short for one word; use 1.0 or more."
        )
    total = max(cursor + trail, limits.min_samples)
    audio = _render_words(words, seg_lengths, gaps, total, rng, pitch_hz, sr)
    return " ".join(words), audio


_ESPEAK_VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb-x-rp+m3", "en-gb-scotland")


def _espeak_render(
    text: str, rng: np.random.Generator, sample_rate: int, workdir: Path
) -> np.ndarray:
    """Render ``text`` with espeak-ng (a drawn voice, speed and pitch) at ``sample_rate``."""
    from scipy.signal import resample_poly

    voice = _ESPEAK_VOICES[int(rng.integers(len(_ESPEAK_VOICES)))]
    speed_wpm = int(rng.integers(140, 191))
    pitch = int(rng.integers(35, 66))
    wav = workdir / "utterance.wav"
    cmd = ["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-p", str(pitch), "-w", str(wav), text]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise AudioError(
            f"espeak-ng failed on {text!r} with voice {voice!r} ({exc}; {detail.decode(errors='replace').strip()}); "
            f"check that `espeak-ng -v {voice} 'hello'` works, or pass speech='synthetic'."
        ) from exc
    audio, file_rate = sf.read(wav, dtype="float64", always_2d=True)
    audio = audio.mean(axis=1)
    if file_rate != sample_rate:
        div = math.gcd(int(file_rate), sample_rate)
        audio = resample_poly(audio, sample_rate // div, int(file_rate) // div)
    return audio


def espeak_utterance(
    rng: np.random.Generator, limits: UtteranceLimits, workdir: Path
) -> tuple[str, np.ndarray]:
    """Draw about as many English words as fit a drawn target length; render; trim or pad."""
    sr = limits.sample_rate
    target_seconds = _target_samples(rng, limits) / sr
    num_words = max(1, int(round(target_seconds * 3.0)))  # espeak speaks ~3 words a second
    words = [_ENGLISH_WORDS[int(i)] for i in rng.integers(len(_ENGLISH_WORDS), size=num_words)]
    sub_seed = int(rng.integers(2**63))
    while True:
        audio = _espeak_render(" ".join(words), np.random.default_rng(sub_seed), sr, workdir)
        if audio.size <= limits.max_samples or len(words) == 1:
            break
        words = words[
            : max(1, min(len(words) - 1, int(len(words) * limits.max_samples / audio.size)))
        ]
    if audio.size > limits.max_samples:
        raise ConfigError(
            f"max_seconds={limits.max_samples / sr}: too short for the word {words[0]!r}; use at least 1.0."
        )
    if audio.size < limits.min_samples:
        audio = np.pad(audio, (0, limits.min_samples - audio.size))
    return " ".join(words), audio


def finish_audio(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Set a drawn level, add light background noise (about 30 dB down), quantise to int16."""
    audio = audio * (rng.uniform(0.3, 0.7) / (np.abs(audio).max() + 1e-12))
    rms = math.sqrt(float(np.mean(audio**2)))
    audio = audio + _white_noise(rng, audio.size) * np.float32(
        rms * 10 ** (-30 / 20) * rng.uniform(0.5, 2.0)
    )
    return np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)


def check_sample_rate(sample_rate: int) -> None:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 16000:
        raise ConfigError(
            f"sample_rate={sample_rate!r}: the demo corpus needs an integer rate of at least 16000 Hz "
            "(its character sounds reach 7.8 kHz); pass sample_rate=16000."
        )


def check_speech(speech: str) -> None:
    if speech not in SPEECH_KINDS:
        raise ConfigError(f"speech={speech!r}: choose one of {', '.join(map(repr, SPEECH_KINDS))}.")
