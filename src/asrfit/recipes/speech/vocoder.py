"""Resynthesis through a linear-prediction vocoder: the same words under another signal model.

Synthesizers differ less in what they say than in how they make the sound: espeak-ng filters
its own glottal pulses through formant resonators, flite's and Festival's diphone voices
concatenate recorded waveforms or re-excite LPC filters with recorded residuals, and the
statistical-parametric voices (CLUSTERGEN, HTS) drive smoothed spectral envelopes with pulse
trains and noise. A model that hears two engines can learn their excitation and their formant
sharpness along with the phones. Resynthesis takes a training utterance apart into a spectral
envelope per frame (linear prediction) and an excitation, then puts it back with either

* ``"pulse"``: a mixed excitation, a pulse train at the frame's pitch and noise in the
  proportion of the frame's voicing, as a statistical-parametric vocoder makes it; or
* ``"residual"``: the utterance's own prediction residual, as a residual-excited LPC diphone
  voice does;

through an envelope of drawn order whose formants are broadened by a drawn factor (the
over-smoothing of parametric voices). Words, timing and pitch stay; the signal model changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import linalg, signal

MODES = ("none", "pulse", "residual")
#: Frames of the analysis: 25 ms Hann windows every 12.5 ms at 16 kHz (the windows sum to one).
FRAME_SECONDS = 0.025
_PRE_EMPHASIS = 0.97
#: Samples filtered before a frame's start so that its synthesis filter starts warm.
_WARM_UP = 64
_MIN_F0_HZ, _MAX_F0_HZ = 70.0, 400.0


@dataclass(frozen=True)
class Vocoding:
    """How one utterance is resynthesised (recorded in the manifest).

    Attributes:
        vocoder: ``"none"``, ``"pulse"`` or ``"residual"`` (:data:`MODES`).
        lpc_order: Prediction order of the envelope (0 with ``"none"``).
        bandwidth_gamma: Each pole's radius is scaled by it; below 1 broadens every formant
            by ``-ln(gamma) * rate / pi`` Hz (1 keeps them).
    """

    vocoder: str = "none"
    lpc_order: int = 0
    bandwidth_gamma: float = 1.0


@dataclass(frozen=True)
class VocoderPolicy:
    """The distribution :func:`draw_vocoding` samples from.

    Attributes:
        probability: Chance that an utterance is resynthesised; the two modes are equally likely.
        order_range: Prediction orders, inclusive.
        gamma_range: Bandwidth factors.
    """

    probability: float = 0.0
    order_range: tuple[int, int] = (12, 20)
    gamma_range: tuple[float, float] = (0.96, 1.0)


#: Training: two utterances in five resynthesised. Evaluation splits are left as rendered.
TRAIN_VOCODER = VocoderPolicy(probability=0.4)
EVAL_VOCODER = VocoderPolicy()


def draw_vocoding(rng: np.random.Generator, policy: VocoderPolicy) -> Vocoding:
    """One utterance's resynthesis under ``policy`` (no draw at all when it never resynthesises,
    so a policy of probability 0 leaves ``rng`` untouched)."""
    if policy.probability <= 0 or rng.random() >= policy.probability:
        return Vocoding()
    mode = MODES[1 + int(rng.integers(2))]
    order = int(rng.integers(policy.order_range[0], policy.order_range[1] + 1))
    gamma = round(float(rng.uniform(*policy.gamma_range)), 3)
    return Vocoding(mode, order, gamma)


def lpc(frame: np.ndarray, order: int) -> tuple[np.ndarray, float]:
    """Prediction polynomial ``[1, a_1, ..., a_p]`` of a windowed frame (the autocorrelation
    method) and the prediction error's power; ``([1, 0, ...], 0)`` for a silent frame."""
    r = np.correlate(frame, frame, "full")[frame.size - 1 : frame.size + order]
    if r[0] <= 1e-10:
        return np.concatenate([[1.0], np.zeros(order)]), 0.0
    r = r.astype(np.float64)
    r[0] *= 1.0 + 1e-6  # a -60 dB noise floor keeps the Toeplitz system well conditioned
    a = linalg.solve_toeplitz(r[:order], -r[1 : order + 1])
    error = float(r[0] + np.dot(a, r[1 : order + 1]))
    return np.concatenate([[1.0], a]), max(error, 0.0)


def _frames(num_samples: int, size: int) -> range:
    hop = size // 2
    return range(-hop, num_samples, hop)


def _segment(x: np.ndarray, start: int, size: int) -> np.ndarray:
    """``x[start:start+size]``, zero outside ``x``."""
    out = np.zeros(size, dtype=np.float64)
    lo, hi = max(start, 0), min(start + size, x.size)
    if hi > lo:
        out[lo - start : hi - start] = x[lo:hi]
    return out


def _pitch(frame: np.ndarray, sample_rate: int) -> tuple[float, float]:
    """``(f0_hz, voicing)`` of a frame: its normalised autocorrelation's highest peak
    between the lags of :data:`_MAX_F0_HZ` and :data:`_MIN_F0_HZ` (the shortest lag within 10 %
    of it); voicing is that peak's height mapped from 0.3-0.8 onto 0-1."""
    lo, hi = int(sample_rate / _MAX_F0_HZ), int(sample_rate / _MIN_F0_HZ)
    if frame.size <= hi:
        return 0.0, 0.0
    spectrum = np.fft.rfft(frame, 2 * frame.size)
    ac = np.fft.irfft(np.abs(spectrum) ** 2)[: hi + 1]
    if ac[0] <= 1e-12:
        return 0.0, 0.0
    # unbiased: each lag's products over the overlap it has
    ac = ac / ac[0] * frame.size / (frame.size - np.arange(hi + 1))
    peak = float(np.max(ac[lo : hi + 1]))
    if not peak > 0:  # no positive correlation at any period: unvoiced
        return 0.0, 0.0
    # the first lag near the highest peak: a period's multiples peak almost as high
    lag = lo + int(np.flatnonzero(ac[lo : hi + 1] >= 0.9 * peak)[0])
    return sample_rate / lag, float(np.clip((ac[lag] - 0.3) / 0.5, 0.0, 1.0))


def _pulse_train(f0_per_sample: np.ndarray, sample_rate: int) -> np.ndarray:
    """Unit impulses one period apart, the period following ``f0_per_sample``."""
    phase = np.cumsum(f0_per_sample / sample_rate)
    out = np.zeros(f0_per_sample.size)
    out[np.flatnonzero(np.diff(np.floor(phase), prepend=0.0) > 0)] = 1.0
    return out


def resynthesise(
    audio: np.ndarray,
    vocoding: Vocoding,
    rng: np.random.Generator,
    sample_rate: int,
) -> np.ndarray:
    """``audio`` rebuilt from its frames' envelopes and a new (or its own) excitation.

    The signal is pre-emphasised, cut into Hann frames that sum to one, and each frame's
    envelope found by :func:`lpc` at ``vocoding.lpc_order``. The residual comes from
    inverse-filtering each frame; ``"pulse"`` replaces it, frame by frame at the residual's
    power, with pulses at the frame's pitch (found below 1 kHz) mixed with noise by the frame's voicing (unvoiced
    frames keep the last pitch). Each frame's excitation is filtered through its envelope with
    the poles scaled by ``bandwidth_gamma``, the frames overlap-added and de-emphasised, and the
    result scaled to the input's power. The output has the input's length.
    """
    if vocoding.vocoder == "none":
        return audio.astype(np.float32)
    if vocoding.vocoder not in MODES:
        raise ValueError(f"vocoder={vocoding.vocoder!r}: choose one of {MODES}.")
    x = signal.lfilter([1.0, -_PRE_EMPHASIS], [1.0], audio.astype(np.float64))
    size = 2 * (int(FRAME_SECONDS * sample_rate) // 2)
    window = signal.windows.hann(size, sym=False)
    starts = list(_frames(x.size, size))
    order = vocoding.lpc_order
    polys, residuals = [], []
    for start in starts:
        a, _ = lpc(_segment(x, start, size) * window, order)
        polys.append(a)
        # inverse-filtered from _WARM_UP samples before the frame, the filter's memory filled
        warm = _segment(x, start - _WARM_UP - order, _WARM_UP + size + order)
        residuals.append(signal.lfilter(a, [1.0], warm)[order:])
    if vocoding.vocoder == "pulse":
        # pitch from the speech below 1 kHz: a residual is too nearly white to show its period
        sos = signal.butter(4, 1000.0, "lowpass", fs=sample_rate, output="sos")
        low = signal.sosfiltfilt(sos, audio.astype(np.float64))
        pitches = [_pitch(_segment(low, start, size), sample_rate) for start in starts]
        f0, last = np.zeros(len(starts)), 120.0
        for i, (hz, voicing) in enumerate(pitches):
            last = hz if voicing > 0 else last
            f0[i] = last
        centres = np.array(starts) + size // 2
        pulses = _pulse_train(np.interp(np.arange(x.size), centres, f0), sample_rate)
        noise = rng.standard_normal(x.size)
        excitations = []
        for start, res, (_, voicing) in zip(starts, residuals, pitches, strict=True):
            power = float(np.mean(res[_WARM_UP:] ** 2))
            p, n = _segment(pulses, start, size), _segment(noise, start, size)
            mixed = np.sqrt(voicing) * p / (np.sqrt(np.mean(p**2)) + 1e-12)
            mixed += np.sqrt(1.0 - voicing) * n / (np.sqrt(np.mean(n**2)) + 1e-12)
            # no excitation before the frame: the window hides the filter's cold start
            excitations.append(np.concatenate([np.zeros(_WARM_UP), mixed * np.sqrt(power)]))
    else:
        excitations = residuals
    scale = vocoding.bandwidth_gamma ** np.arange(order + 1)
    out = np.zeros(x.size + 2 * size)  # index 0 is sample -size/2
    for start, a, e in zip(starts, polys, excitations, strict=True):
        y = signal.lfilter([1.0], a * scale, e)[_WARM_UP:]
        lo = start + size // 2
        out[lo : lo + size] += y * window
    y = signal.lfilter([1.0], [1.0, -_PRE_EMPHASIS], out[size // 2 : size // 2 + x.size])
    gain = np.sqrt(np.mean(audio.astype(np.float64) ** 2) / (np.mean(y**2) + 1e-20))
    return (y * gain).astype(np.float32)
