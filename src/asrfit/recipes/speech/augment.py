"""Acoustic conditions for synthetic speech: speed and vocal-tract-length perturbation, room
reverberation, noise and a band-limited channel (telephone, or a codec's bandwidth).

All draws come from the ``numpy.random.Generator`` passed in, so a corpus is deterministic
for its seed. Nothing here depends on the synthesizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy import signal

SPEED_FACTORS = (Fraction(9, 10), Fraction(19, 20), Fraction(1), Fraction(21, 20), Fraction(11, 10))


@dataclass(frozen=True)
class Conditions:
    """How one utterance is degraded; the draw is recorded in the manifest.

    Attributes:
        speed: Speed factor (tempo and pitch together, as Kaldi's speed perturbation).
        rt60_seconds: Reverberation time of the synthetic room, 0 for none.
        snr_db: Signal-to-noise ratio of the added noise, ``None`` for none.
        noise_colour: ``"white"``, ``"pink"`` or ``"brown"``.
        vtlp_alpha: Vocal-tract-length warp factor (formants move by it; 1 for none).
        channel: ``"none"``, ``"telephone"`` (300-3,400 Hz, 8 kHz, 8-bit mu-law) or
            ``"lowpass"`` (a compressed-audio codec's bandwidth, ``cutoff_hz``).
        cutoff_hz: The low-pass channel's cutoff.
    """

    speed: float
    rt60_seconds: float
    snr_db: float | None
    noise_colour: str
    vtlp_alpha: float = 1.0
    channel: str = "none"
    cutoff_hz: float | None = None


@dataclass(frozen=True)
class AugmentPolicy:
    """The distribution :func:`draw_conditions` samples from.

    Attributes:
        speed_perturb: Draw a speed factor from :data:`SPEED_FACTORS` (else 1).
        reverb_probability: Chance of a room.
        rt60_range_seconds: Reverberation times of the rooms.
        noise_probability: Chance of background noise.
        snr_range_db: Signal-to-noise ratios of the noise.
        vtlp_range: Vocal-tract-length warp factors, ``None`` for no warp.
        telephone_probability: Chance of a telephone channel.
        lowpass_probability: Chance of a low-pass channel (when not a telephone).
        lowpass_range_hz: Its cutoffs.
    """

    speed_perturb: bool = True
    reverb_probability: float = 0.5
    rt60_range_seconds: tuple[float, float] = (0.15, 0.6)
    noise_probability: float = 0.8
    snr_range_db: tuple[float, float] = (10.0, 35.0)
    vtlp_range: tuple[float, float] | None = (0.9, 1.1)
    telephone_probability: float = 0.1
    lowpass_probability: float = 0.15
    lowpass_range_hz: tuple[float, float] = (3500.0, 7000.0)


TRAIN_POLICY = AugmentPolicy()
EVAL_POLICY = AugmentPolicy(
    speed_perturb=False,
    reverb_probability=0.3,
    rt60_range_seconds=(0.15, 0.4),
    noise_probability=0.5,
    snr_range_db=(20.0, 40.0),
    vtlp_range=None,
    telephone_probability=0.05,
    lowpass_probability=0.1,
)


def draw_conditions(rng: np.random.Generator, policy: AugmentPolicy) -> Conditions:
    """One utterance's conditions under ``policy``."""
    speed = (
        SPEED_FACTORS[int(rng.integers(len(SPEED_FACTORS)))]
        if policy.speed_perturb
        else Fraction(1)
    )
    rt60 = (
        float(rng.uniform(*policy.rt60_range_seconds))
        if rng.random() < policy.reverb_probability
        else 0.0
    )
    noisy = rng.random() < policy.noise_probability
    snr = round(float(rng.uniform(*policy.snr_range_db)), 1) if noisy else None
    colour = ("white", "pink", "brown")[int(rng.integers(3))]
    alpha = round(float(rng.uniform(*policy.vtlp_range)), 3) if policy.vtlp_range else 1.0
    draw = rng.random()
    channel, cutoff = "none", None
    if draw < policy.telephone_probability:
        channel = "telephone"
    elif draw < policy.telephone_probability + policy.lowpass_probability:
        channel, cutoff = "lowpass", float(round(rng.uniform(*policy.lowpass_range_hz)))
    return Conditions(float(speed), round(rt60, 3), snr, colour, alpha, channel, cutoff)


def resample(audio: np.ndarray, from_rate: int, to_rate: int, speed: float = 1.0) -> np.ndarray:
    """Resample ``audio`` and speed it up by ``speed`` (played ``speed`` times faster).

    A factor ``s`` resamples to ``to_rate / s`` and plays at ``to_rate``: duration / s, pitch x s.
    """
    ratio = (
        Fraction(to_rate, from_rate) / Fraction(speed).limit_denominator(100)
    ).limit_denominator(2000)
    return signal.resample_poly(audio, ratio.numerator, ratio.denominator).astype(np.float32)


def room_impulse_response(
    rng: np.random.Generator, rt60_seconds: float, sample_rate: int
) -> np.ndarray:
    """A synthetic room: direct path, a few early reflections, then exponentially decaying noise.

    The tail's energy falls by 60 dB over ``rt60_seconds``; the response is normalised to a
    unit direct path.
    """
    length = max(1, int(rt60_seconds * sample_rate))
    t = np.arange(length) / sample_rate
    tail = rng.standard_normal(length) * np.exp(-6.9078 * t / rt60_seconds)  # ln(1000) = 6.9078
    tail[: int(0.005 * sample_rate)] = 0.0  # the tail starts after 5 ms
    ir = 0.25 * tail / (np.sqrt(np.sum(tail**2)) + 1e-12)
    for _ in range(4):  # early reflections 2-20 ms after the direct path
        ir[min(length - 1, int(rng.uniform(0.002, 0.02) * sample_rate))] += rng.uniform(0.1, 0.4)
    ir[0] = 1.0
    return ir.astype(np.float32)


def coloured_noise(rng: np.random.Generator, num_samples: int, colour: str) -> np.ndarray:
    """Unit-power white, pink (1/f) or brown (1/f^2) noise."""
    white = rng.standard_normal(num_samples)
    if colour != "white":
        spectrum = np.fft.rfft(white)
        f = np.arange(spectrum.size, dtype=np.float64)
        f[0] = 1.0
        spectrum /= f ** (0.5 if colour == "pink" else 1.0)
        white = np.fft.irfft(spectrum, n=num_samples)
    return (white / (np.sqrt(np.mean(white**2)) + 1e-12)).astype(np.float32)


_VTLP_WINDOW = 512


def _to_length(audio: np.ndarray, size: int) -> np.ndarray:
    """``audio`` cut or zero-padded to ``size`` samples, as float32 (filters and resampling
    round the length)."""
    out = audio[:size]
    if out.size < size:
        out = np.pad(out, (0, size - out.size))
    return out.astype(np.float32)


def _warp(freqs: np.ndarray, alpha: float, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """Jaitly and Hinton's piecewise-linear warp: ``(warp(f), inverse_warp(f))`` for ``freqs``."""
    nyquist = sample_rate / 2
    f_hi = 0.6 * nyquist * min(alpha, 1.0) / alpha  # 4.8 kHz at 16 kHz
    g_hi = alpha * f_hi
    forward = np.where(
        freqs <= f_hi, alpha * freqs, g_hi + (freqs - f_hi) * (nyquist - g_hi) / (nyquist - f_hi)
    )
    inverse = np.where(
        freqs <= g_hi, freqs / alpha, f_hi + (freqs - g_hi) * (nyquist - f_hi) / (nyquist - g_hi)
    )
    return forward, inverse


def vtlp(audio: np.ndarray, alpha: float, sample_rate: int) -> np.ndarray:
    """Vocal-tract-length perturbation: warp the frequency axis of the speech by ``alpha``.

    The piecewise-linear warp of Jaitly and Hinton (2013): frequencies up to a boundary
    (0.6 of the Nyquist frequency, times ``min(alpha, 1) / alpha``) move to ``alpha * f``; above
    it a straight line takes the boundary to the Nyquist frequency, which stays put. A phase
    vocoder does the warp: each output bin takes the magnitude the input has at its inverse-warped
    frequency, and a phase that advances at the warped instantaneous frequency there, so that
    a partial at ``f`` is resynthesised at ``warp(f)`` (copying complex bins would keep each
    partial's phase advancing at ``f``). The output has the input's length.
    """
    if alpha == 1.0:
        return audio.astype(np.float32)
    n, hop = _VTLP_WINDOW, _VTLP_WINDOW // 4
    _, _, spec = signal.stft(audio, sample_rate, nperseg=n, noverlap=n - hop)
    bins = np.arange(spec.shape[0])
    omega = 2 * np.pi * bins / n  # radians per sample at each bin's centre
    phase = np.angle(spec)
    advance = np.diff(phase, axis=1, prepend=phase[:, :1]) - omega[:, None] * hop
    advance = (advance + np.pi) % (2 * np.pi) - np.pi
    inst_hz = (omega[:, None] + advance / hop) * sample_rate / (2 * np.pi)
    _, source_hz = _warp(bins * sample_rate / n, alpha, sample_rate)
    position = source_hz * n / sample_rate
    low = np.clip(np.floor(position).astype(int), 0, spec.shape[0] - 1)
    high = np.clip(low + 1, 0, spec.shape[0] - 1)
    frac = (position - low)[:, None]
    magnitude = np.abs(spec[low]) * (1 - frac) + np.abs(spec[high]) * frac
    source_inst = np.where(frac < 0.5, inst_hz[low], inst_hz[high])
    warped_hz, _ = _warp(np.clip(source_inst, 0, sample_rate / 2), alpha, sample_rate)
    step = 2 * np.pi * warped_hz / sample_rate * hop
    new_phase = phase[:, :1] + np.cumsum(
        np.concatenate([np.zeros_like(step[:, :1]), step[:, 1:]], 1), 1
    )
    _, out = signal.istft(
        magnitude * np.exp(1j * new_phase), sample_rate, nperseg=n, noverlap=n - hop
    )
    return _to_length(out, audio.size)


def mu_law(audio: np.ndarray, mu: int = 255) -> np.ndarray:
    """G.711 mu-law companding to 8 bits and back (the quantisation of a telephone line)."""
    x = np.clip(audio, -1.0, 1.0)
    encoded = np.sign(x) * np.log1p(mu * np.abs(x)) / np.log1p(mu)
    codes = np.round((encoded + 1) / 2 * mu)  # 256 levels
    decoded = codes / mu * 2 - 1
    return (np.sign(decoded) * np.expm1(np.abs(decoded) * np.log1p(mu)) / mu).astype(np.float32)


def band_limit(
    audio: np.ndarray, channel: str, cutoff_hz: float | None, sample_rate: int
) -> np.ndarray:
    """Pass ``audio`` through a band-limited channel; the length is kept.

    ``"telephone"``: a 300-3,400 Hz band-pass, down to 8 kHz, 8-bit mu-law, back up.
    ``"lowpass"``: an 8th-order Butterworth low-pass at ``cutoff_hz``, as a compressed-audio
    codec's bandwidth limit (these imitate the channels' bandwidth and quantisation; they are not
    real codecs). ``"none"`` returns the input.
    """
    if channel == "none":
        return audio.astype(np.float32)
    if channel == "telephone":
        sos = signal.butter(6, [300.0, 3400.0], "bandpass", fs=sample_rate, output="sos")
        narrow = resample(signal.sosfiltfilt(sos, audio), sample_rate, 8000)
        peak = float(np.max(np.abs(narrow))) + 1e-9
        out = resample(mu_law(narrow / peak) * peak, 8000, sample_rate)
    elif channel == "lowpass":
        if cutoff_hz is None or not 0 < cutoff_hz < sample_rate / 2:
            raise ValueError(f"cutoff_hz={cutoff_hz!r}: give a cutoff below {sample_rate / 2} Hz.")
        sos = signal.butter(8, cutoff_hz, "lowpass", fs=sample_rate, output="sos")
        out = signal.sosfiltfilt(sos, audio)
    else:
        raise ValueError(f"channel={channel!r}: choose 'none', 'telephone' or 'lowpass'.")
    return _to_length(out, audio.size)


def apply_conditions(
    audio: np.ndarray, cond: Conditions, rng: np.random.Generator, sample_rate: int
) -> np.ndarray:
    """Warp the vocal tract, reverberate, add noise at the drawn SNR, then pass the channel.

    The speech keeps its length.
    """
    out = vtlp(audio, cond.vtlp_alpha, sample_rate)
    if cond.rt60_seconds > 0:
        room = room_impulse_response(rng, cond.rt60_seconds, sample_rate)
        out = signal.fftconvolve(out, room)[: audio.size]
    if cond.snr_db is not None:
        speech_power = float(np.mean(out**2)) + 1e-12
        noise = coloured_noise(rng, out.size, cond.noise_colour)
        out = out + noise * np.sqrt(speech_power / 10 ** (cond.snr_db / 10))
    return band_limit(out, cond.channel, cond.cutoff_hz, sample_rate)
