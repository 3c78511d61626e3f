"""Tests for the resynthesis of training speech (asrfit.recipes.speech.vocoder).

References are closed forms: a known all-pole process, a known pitch, the response of a
resonance whose pole radius is scaled, and the input itself where the analysis is inverted.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import signal

from asrfit.recipes.speech.vocoder import (
    EVAL_VOCODER,
    TRAIN_VOCODER,
    VocoderPolicy,
    Vocoding,
    draw_vocoding,
    lpc,
    resynthesise,
)

SR = 16000
F0_HZ = 125.0
#: (centre Hz, bandwidth Hz) of the test vowel's resonances.
FORMANTS = ((700.0, 80.0), (1200.0, 90.0), (2600.0, 120.0))


def _resonators() -> np.ndarray:
    a = np.array([1.0])
    for centre, bandwidth in FORMANTS:
        r = np.exp(-np.pi * bandwidth / SR)
        a = np.convolve(a, [1.0, -2 * r * np.cos(2 * np.pi * centre / SR), r * r])
    return a


def _vowel(seconds: float = 1.0) -> np.ndarray:
    """Impulses at :data:`F0_HZ` through :data:`FORMANTS`: a vowel whose every part is known."""
    pulses = np.zeros(int(seconds * SR))
    pulses[:: int(SR / F0_HZ)] = 1.0
    out = signal.lfilter([1.0], _resonators(), pulses)
    return (0.5 * out / np.max(np.abs(out))).astype(np.float32)


def _resonance(centre: float, bandwidth: float) -> np.ndarray:
    r = np.exp(-np.pi * bandwidth / SR)
    return np.array([1.0, -2 * r * np.cos(2 * np.pi * centre / SR), r * r])


def _contrast_db(spectrum_at: Callable[[float], float], centre: float, offset: float) -> float:
    """How many dB the power at ``centre`` stands above the power ``offset`` Hz below it."""
    return 10 * np.log10(spectrum_at(centre) / spectrum_at(centre - offset))


def test_lpc_recovers_a_known_all_pole_process() -> None:
    truth = np.array([1.0, -1.3, 0.8])  # poles at radius sqrt(0.8)
    x = signal.lfilter([1.0], truth, np.random.default_rng(0).standard_normal(200_000))
    a, error = lpc(x, 2)
    np.testing.assert_allclose(a, truth, atol=0.01)
    # the prediction error's power is the driving noise's: 1 a sample
    assert error / x.size == pytest.approx(1.0, rel=0.02)


def test_lpc_of_silence_is_the_identity() -> None:
    a, error = lpc(np.zeros(400), 12)
    assert a.tolist() == [1.0] + [0.0] * 12 and error == 0.0


def test_residual_resynthesis_at_full_bandwidth_gives_back_the_input() -> None:
    vowel = _vowel()
    out = resynthesise(vowel, Vocoding("residual", 16, 1.0), np.random.default_rng(0), SR)
    assert out.shape == vowel.shape and out.dtype == np.float32
    middle = slice(SR // 10, -SR // 10)
    assert np.corrcoef(out[middle], vowel[middle])[0, 1] > 0.99


@pytest.mark.parametrize("gamma", [1.0, 0.97, 0.95])
def test_bandwidth_factor_broadens_a_formant_by_its_closed_form(gamma: float) -> None:
    """Both modes filter through the same scaled envelope; the residual shows it alone (a
    narrow resonance looks periodic to the pitch finder, so ``"pulse"`` would add harmonics)."""
    centre, bandwidth, offset = 1000.0, 80.0, 200.0
    noise = np.random.default_rng(0).standard_normal(3 * SR)
    speech = signal.lfilter([1.0], _resonance(centre, bandwidth), noise)
    speech = (0.5 * speech / np.max(np.abs(speech))).astype(np.float32)
    out = resynthesise(speech, Vocoding("residual", 16, gamma), np.random.default_rng(0), SR)
    hz, power = signal.welch(out, SR, nperseg=4096)
    measured = _contrast_db(lambda f: float(power[np.argmin(np.abs(hz - f))]), centre, offset)
    # every pole's radius times gamma widens the resonance by -ln(gamma) * rate / pi Hz
    widened = _resonance(centre, bandwidth - np.log(gamma) * SR / np.pi)
    expected = _contrast_db(
        lambda f: float(np.abs(signal.freqz([1.0], widened, [f], fs=SR)[1][0]) ** 2),
        centre,
        offset,
    )
    assert measured == pytest.approx(expected, abs=1.5)


def test_pulse_excitation_keeps_the_pitch() -> None:
    out = resynthesise(_vowel(), Vocoding("pulse", 16, 1.0), np.random.default_rng(0), SR)
    x = out[SR // 4 : 3 * SR // 4].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size), 8 * x.size))
    hz = np.fft.rfftfreq(8 * x.size, 1 / SR)
    # the harmonics sit at multiples of F0: the strongest below 1 kHz is one of them
    low = hz < 1000
    peak = hz[low][np.argmax(spectrum[low])]
    assert peak / F0_HZ == pytest.approx(round(peak / F0_HZ), abs=0.05)
    # the excitation is new: not a copy of the input's pulses
    assert np.corrcoef(x, _vowel()[SR // 4 : 3 * SR // 4])[0, 1] < 0.99


def test_pulse_excitation_is_noise_where_nothing_is_voiced() -> None:
    noise = (0.1 * np.random.default_rng(1).standard_normal(SR)).astype(np.float32)
    out = resynthesise(noise, Vocoding("pulse", 16, 1.0), np.random.default_rng(0), SR)
    # white noise in, noise out: no periodicity, the same power, a flat spectrum
    assert np.mean(out.astype(np.float64) ** 2) == pytest.approx(0.01, rel=0.05)
    _, power = signal.welch(out, SR, nperseg=512)
    assert np.max(power[5:-5]) / np.min(power[5:-5]) < 20


def test_none_returns_the_input_and_unknown_mode_is_named() -> None:
    vowel = _vowel(0.2)
    np.testing.assert_array_equal(
        resynthesise(vowel, Vocoding(), np.random.default_rng(0), SR), vowel
    )
    with pytest.raises(ValueError, match="vocoder='lpc10'"):
        resynthesise(vowel, Vocoding("lpc10", 10, 1.0), np.random.default_rng(0), SR)


def test_resynthesis_is_deterministic_for_its_generator() -> None:
    vowel = _vowel(0.3)
    runs = [
        resynthesise(vowel, Vocoding("pulse", 14, 0.97), np.random.default_rng(5), SR)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(*runs)


def test_draws_follow_the_policy_and_no_draw_leaves_the_stream_alone() -> None:
    rng = np.random.default_rng(3)
    assert draw_vocoding(rng, EVAL_VOCODER) == Vocoding()
    assert rng.random() == np.random.default_rng(3).random()  # nothing was drawn
    draws = [draw_vocoding(np.random.default_rng([9, i]), TRAIN_VOCODER) for i in range(2000)]
    share = sum(d.vocoder != "none" for d in draws) / len(draws)
    sd = (0.4 * 0.6 / len(draws)) ** 0.5  # binomial
    assert abs(share - TRAIN_VOCODER.probability) < 4 * sd
    used = [d for d in draws if d.vocoder != "none"]
    assert {d.vocoder for d in used} == {"pulse", "residual"}
    assert {d.lpc_order for d in used} == set(range(12, 21))
    assert all(0.96 <= d.bandwidth_gamma <= 1.0 for d in used)
    always = VocoderPolicy(probability=1.0, order_range=(10, 10), gamma_range=(0.9, 0.9))
    assert draw_vocoding(np.random.default_rng(0), always).lpc_order == 10
