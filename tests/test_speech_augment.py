"""Tests for the acoustic conditions of the speech corpus (asrfit.recipes.speech.augment)."""

from __future__ import annotations

import numpy as np
import pytest

from asrfit.recipes.speech.augment import (
    EVAL_POLICY,
    TRAIN_POLICY,
    Conditions,
    apply_conditions,
    band_limit,
    coloured_noise,
    draw_conditions,
    mu_law,
    resample,
    room_impulse_response,
    vtlp,
)

SR = 16000


@pytest.mark.parametrize("rt60", [0.2, 0.5])
def test_room_decays_60_db_in_rt60(rt60: float) -> None:
    ir = room_impulse_response(np.random.default_rng(0), rt60, SR).astype(np.float64)
    tail = ir[int(0.025 * SR) :]  # after the direct path and early reflections
    # Schroeder backward integration: the energy decay curve in dB
    edc = 10 * np.log10(np.cumsum(tail[::-1] ** 2)[::-1] / np.sum(tail**2))
    t = np.arange(edc.size) / SR
    fit = (edc > -25) & (edc < -5)  # T20, extrapolated to 60 dB as ISO 3382 does
    slope = np.polyfit(t[fit], edc[fit], 1)[0]
    assert -60 / slope == pytest.approx(rt60, rel=0.15)
    assert ir[0] == 1.0


def test_noise_is_added_at_the_drawn_snr() -> None:
    rng = np.random.default_rng(1)
    speech = np.sin(2 * np.pi * 200 * np.arange(SR) / SR).astype(np.float32)
    for snr_db in (10.0, 30.0):
        noisy = apply_conditions(speech, Conditions(1.0, 0.0, snr_db, "pink"), rng, SR)
        noise = noisy - speech
        measured = 10 * np.log10(
            np.mean(speech.astype(np.float64) ** 2) / np.mean(noise.astype(np.float64) ** 2)
        )
        assert measured == pytest.approx(snr_db, abs=0.05)


@pytest.mark.parametrize(
    ("colour", "slope_db_per_octave"), [("white", 0.0), ("pink", -3.0), ("brown", -6.0)]
)
def test_noise_colour_has_its_spectral_slope(colour: str, slope_db_per_octave: float) -> None:
    noise = coloured_noise(np.random.default_rng(2), 2**18, colour).astype(np.float64)
    assert np.mean(noise**2) == pytest.approx(1.0, rel=1e-6)
    power = np.abs(np.fft.rfft(noise)) ** 2
    freqs = np.fft.rfftfreq(noise.size, 1 / SR)
    bands = [(f, 2 * f) for f in (250, 500, 1000, 2000)]
    levels = [10 * np.log10(power[(freqs >= lo) & (freqs < hi)].mean()) for lo, hi in bands]
    assert np.mean(np.diff(levels)) == pytest.approx(slope_db_per_octave, abs=0.5)


@pytest.mark.parametrize("speed", [0.9, 1.0, 1.1])
def test_speed_perturbation_scales_duration_and_pitch(speed: float) -> None:
    tone = np.sin(2 * np.pi * 300 * np.arange(22050) / 22050).astype(np.float32)  # 1 s at 22.05 kHz
    out = resample(tone, 22050, SR, speed)
    assert out.size / SR == pytest.approx(1.0 / speed, rel=1e-3)
    spectrum = np.abs(np.fft.rfft(out * np.hanning(out.size)))
    peak_hz = np.argmax(spectrum) * SR / out.size
    assert peak_hz == pytest.approx(300 * speed, abs=3)


def test_train_policy_draws_are_seeded_and_cover_the_ranges() -> None:
    draws = [draw_conditions(np.random.default_rng([7, i]), TRAIN_POLICY) for i in range(400)]
    again = [draw_conditions(np.random.default_rng([7, i]), TRAIN_POLICY) for i in range(400)]
    assert draws == again
    assert {d.speed for d in draws} == {0.9, 0.95, 1.0, 1.05, 1.1}
    assert 0.35 < np.mean([d.rt60_seconds > 0 for d in draws]) < 0.65
    snrs = [d.snr_db for d in draws if d.snr_db is not None]
    assert min(snrs) >= 10 and max(snrs) <= 35 and 0.7 < len(snrs) / 400 < 0.9


# --- vocal-tract-length perturbation and channels ---------------------------------------------
def _tone(freqs: list[float], seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return sum(0.3 * np.sin(2 * np.pi * f * t) for f in freqs).astype(np.float32)


def _level_db(audio: np.ndarray, f: float) -> float:
    """Power (dB) of ``audio`` within 30 Hz of ``f``, from a Hann-windowed FFT."""
    x = audio[SR // 10 : -SR // 10].astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size))) ** 2
    freqs = np.fft.rfftfreq(x.size, 1 / SR)
    return 10 * np.log10(spec[np.abs(freqs - f) < 30].sum() + 1e-20)


@pytest.mark.parametrize("alpha", [0.9, 1.1])
def test_vtlp_moves_low_frequencies_by_alpha(alpha: float) -> None:
    audio = _tone([500.0, 1500.0])
    out = vtlp(audio, alpha, SR)
    assert out.size == audio.size and out.dtype == np.float32
    x = out[SR // 10 : -SR // 10].astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    freqs = np.fft.rfftfreq(x.size, 1 / SR)
    for f in (500.0, 1500.0):  # below the warp's boundary (about 4.4-4.8 kHz here)
        near = np.abs(freqs - alpha * f) < 0.05 * f
        peak = freqs[near][np.argmax(spec[near])]
        assert peak == pytest.approx(alpha * f, abs=20), (f, peak)
    energy = 10 * np.log10(np.mean(out.astype(np.float64) ** 2) / np.mean(audio**2))
    assert abs(energy) < 3


def test_vtlp_of_one_is_the_input() -> None:
    audio = _tone([700.0])
    assert np.array_equal(vtlp(audio, 1.0, SR), audio)


def test_mu_law_round_trip_error_is_within_half_a_step_of_the_companded_scale() -> None:
    x = np.linspace(-1, 1, 20001)
    out = mu_law(x).astype(np.float64)
    # closed form: y = sign(x) ln(1 + 255|x|) / ln 256 is quantised to 256 levels over [-1, 1],
    # a step of 2/255 in y; dx/dy = ln(256) (1 + 255|x|) / 255 grows with |x|, so |error| <=
    # step/2 * dx/dy at the larger of |x| and |decoded x|
    bound = (1 / 255) * np.log(256) * (1 + 255 * np.maximum(np.abs(x), np.abs(out))) / 255
    assert np.all(np.abs(out - x) <= bound + 1e-6)
    assert np.abs(out - x).max() > 1e-3  # it does quantise


def test_telephone_channel_passes_speech_band_only() -> None:
    for f, passes in ((1000.0, True), (5000.0, False), (150.0, False)):
        audio = _tone([f])
        out = band_limit(audio, "telephone", None, SR)
        assert out.size == audio.size
        loss = _level_db(audio, f) - _level_db(out, f)
        assert (abs(loss) < 1.0) if passes else (loss > 20), (f, loss)


def test_lowpass_channel_cuts_above_its_cutoff() -> None:
    for f, passes in ((1000.0, True), (6000.0, False)):
        audio = _tone([f])
        loss = _level_db(audio, f) - _level_db(band_limit(audio, "lowpass", 4000.0, SR), f)
        assert (abs(loss) < 1.0) if passes else (loss > 30), (f, loss)
    with pytest.raises(ValueError, match="cutoff_hz=9000.0"):
        band_limit(_tone([1000.0]), "lowpass", 9000.0, SR)
    with pytest.raises(ValueError, match="channel='fax'"):
        band_limit(_tone([1000.0]), "fax", None, SR)


def test_draws_follow_the_policy() -> None:
    rng = np.random.default_rng(7)
    draws = [draw_conditions(rng, TRAIN_POLICY) for _ in range(4000)]
    n = len(draws)
    for channel, p in (
        ("telephone", TRAIN_POLICY.telephone_probability),
        ("lowpass", TRAIN_POLICY.lowpass_probability),
    ):
        share = sum(d.channel == channel for d in draws) / n
        assert abs(share - p) < 4 * (p * (1 - p) / n) ** 0.5, (channel, share)
    alphas = [d.vtlp_alpha for d in draws]
    assert 0.9 <= min(alphas) < 0.91 and 1.09 < max(alphas) <= 1.1
    cutoffs = [d.cutoff_hz for d in draws if d.channel == "lowpass"]
    assert min(cutoffs) >= 3500 and max(cutoffs) <= 7000
    assert all(d.cutoff_hz is None for d in draws if d.channel != "lowpass")
    assert {d.vtlp_alpha for d in (draw_conditions(rng, EVAL_POLICY) for _ in range(50))} == {1.0}
