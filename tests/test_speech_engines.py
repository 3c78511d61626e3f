"""Tests for the speech engines (asrfit.recipes.speech.engines): flite and Festival as programs.

Both are Debian packages the Makefile installs with apt-get; where that was not possible these
tests are skipped (``-rs`` lists them with the reason). The missing-program error is tested
everywhere.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from asrfit.errors import AsrfitError, AudioError
from asrfit.recipes.speech import engines
from asrfit.recipes.speech.engines import FESTIVAL, FESTIVAL_VOICES, FLITE, flite_f0_hz, render

SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank"  # 13 words
needs_engines = pytest.mark.skipif(
    shutil.which("flite") is None or shutil.which("text2wave") is None,
    reason="flite or Festival's text2wave not installed (make test installs them with apt-get)",
)


def _median_f0(audio: np.ndarray, rate: int) -> float:
    """Median F0 over voiced 40 ms frames, by autocorrelation (an independent pitch estimate)."""
    n, found = int(0.04 * rate), []
    for start in range(0, audio.size - n, n // 2):
        x = audio[start : start + n].astype(np.float64)
        if np.sqrt(np.mean(x**2)) < 0.02:
            continue
        x -= x.mean()
        c = np.correlate(x, x, "full")[n - 1 :]
        lo, hi = rate // 400, rate // 60
        lag = lo + int(np.argmax(c[lo:hi]))
        if c[lag] > 0.4 * c[0]:
            found.append(rate / lag)
    return float(np.median(found))


def _speak(engine: str, voice: str, rate_wpm: int = 175, pitch: int = 50) -> tuple:
    return render(engine, voice, SENTENCE, rate_wpm=rate_wpm, pitch=pitch, pitch_range=50, seed=0)


@needs_engines
@pytest.mark.parametrize(
    ("engine", "voice"), [(FLITE, "kal"), (FLITE, "awb"), (FESTIVAL, "ked_diphone")]
)
def test_duration_follows_the_asked_rate(engine: str, voice: str) -> None:
    slow, rate = _speak(engine, voice, rate_wpm=120)
    fast, _ = _speak(engine, voice, rate_wpm=240)
    # twice the words per minute: about half the duration (pauses and edges stretch less)
    assert 1.6 < slow.size / fast.size < 2.2
    words = len(SENTENCE.split())
    assert 0.6 * 60 * words / 240 < fast.size / rate < 1.5 * 60 * words / 240
    assert slow.dtype == np.float32 and 0.02 < np.abs(slow).max() <= 1.0


@needs_engines
@pytest.mark.parametrize("voice", ["kal16", "awb"])
def test_flite_speaks_at_the_asked_pitch(voice: str) -> None:
    for pitch in (25, 75):
        audio, rate = _speak(FLITE, voice, pitch=pitch)
        assert _median_f0(audio, rate) == pytest.approx(flite_f0_hz(pitch), rel=0.1)


@needs_engines
def test_engines_are_deterministic() -> None:
    for engine, voice in [(FLITE, "rms"), (FESTIVAL, FESTIVAL_VOICES[1])]:
        a, rate_a = _speak(engine, voice)
        b, rate_b = _speak(engine, voice)
        assert rate_a == rate_b and np.array_equal(a, b)


@needs_engines
def test_every_voice_is_installed_and_an_unknown_one_is_named() -> None:
    engines.require(engines.ENGINES)
    with pytest.raises(AudioError, match="festival voice .nobody.: not one"):
        render(FESTIVAL, "nobody", "hello", rate_wpm=175, pitch=50, pitch_range=50, seed=0)
    with pytest.raises(AudioError, match="flite voice 'nobody'"):
        render(FLITE, "nobody", "hello", rate_wpm=175, pitch=50, pitch_range=50, seed=0)


def test_missing_program_names_it_and_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(AsrfitError, match=r"flite \(flite\).*apt-get install flite festival"):
        engines.require([FLITE])
    with pytest.raises(AsrfitError, match=r"text2wave \(festival\)"):
        engines.require([FESTIVAL])


def test_the_makefile_installs_the_packages_the_engines_name() -> None:
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text(encoding="utf-8")
    line = next(x for x in makefile.splitlines() if x.startswith("SPEECH_DEBS :="))
    assert tuple(line.split(":=", 1)[1].split()) == engines.DEBIAN_PACKAGES
