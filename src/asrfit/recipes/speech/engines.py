"""Three speech synthesizers with different signal models, behind one ``render`` call.

* ``espeak-ng``: formant synthesis (and its Klatt voices), loaded in-process from the
  ``espeakng-loader`` wheel (:mod:`asrfit.recipes.speech.espeak`);
* ``flite``: CMU's Flite, diphone concatenation (``kal``, ``kal16``) and statistical-parametric
  CLUSTERGEN voices (``awb``, ``rms``, ``slt``); Debian's ``flite`` package, run as a program;
* ``festival``: the Festival Speech Synthesis System with a residual-excited LPC diphone voice
  (``ked_diphone``) and an HTS (hidden Markov model) voice (``cmu_us_slt_arctic_hts``); Debian's
  ``festival``, ``festvox-kdlpc16k`` and ``festvox-us-slt-hts`` packages, run as ``text2wave``.

flite and Festival are programs: asrfit ships none of them (`make demo-speech` installs them
with apt-get). Each call renders one sentence into a temporary WAV file and reads it back. Both
are deterministic for their arguments.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from asrfit.errors import AsrfitError, AudioError

ESPEAK, FLITE, FESTIVAL = "espeak-ng", "flite", "festival"
ENGINES = (ESPEAK, FLITE, FESTIVAL)

#: flite's English voices for general text. ``awb_time`` is left out: a limited-domain voice
#: that only speaks clock times.
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
#: The Festival voices :data:`DEBIAN_PACKAGES` installs, by signal model.
FESTIVAL_VOICES = ("ked_diphone", "cmu_us_slt_arctic_hts")
#: The speaker (recorded person) behind each flite and Festival voice: ``kal`` and ``kal16`` are
#: one diphone database at two sample rates; flite's ``slt`` and Festival's HTS voice are both
#: built from the CMU ARCTIC recordings of one speaker.
VOICE_SPEAKER = {
    "kal": "kal",
    "kal16": "kal",
    "awb": "awb",
    "rms": "rms",
    "slt": "slt",
    "ked_diphone": "ked",
    "cmu_us_slt_arctic_hts": "slt",
}
#: The signal model of each flite and Festival voice (its ``voice_family`` in the manifests).
VOICE_MODEL = {
    "kal": "diphone",
    "kal16": "diphone",
    "awb": "clustergen",
    "rms": "clustergen",
    "slt": "clustergen",
    "ked_diphone": "diphone",
    "cmu_us_slt_arctic_hts": "hts",
}
#: Voices that keep their own speaking rate whatever the duration stretch (Festival's HTS voice)
#: and their own pitch whatever the F0 target (flite's ``rms``; Festival's voices are never
#: asked for a pitch).
OWN_RATE_VOICES = frozenset({"cmu_us_slt_arctic_hts"})
OWN_PITCH_VOICES = frozenset({"rms", *FESTIVAL_VOICES})
DEBIAN_PACKAGES = ("flite", "festival", "festvox-kdlpc16k", "festvox-us-slt-hts")
_PROGRAMS = {FLITE: "flite", FESTIVAL: "text2wave"}
#: Speaking rate that a duration stretch of 1 stands for, words per minute.
NATIVE_WPM = 175
_TIMEOUT_S = 120


def install_hint() -> str:
    """How to install the programs (what ``make demo-speech`` does)."""
    return (
        f"install them with `apt-get install {' '.join(DEBIAN_PACKAGES)}` (make demo-speech does)"
    )


def require(engines: tuple[str, ...] | list[str]) -> None:
    """Fail early, naming the missing program, when an engine cannot run here.

    Raises:
        AsrfitError: When flite's or Festival's program or one of their voices is missing, or
            espeak-ng's wheel is not installed.
    """
    missing = [e for e in engines if e in _PROGRAMS and shutil.which(_PROGRAMS[e]) is None]
    if missing:
        programs = ", ".join(f"{_PROGRAMS[e]} ({e})" for e in missing)
        raise AsrfitError(
            f"speech synthesis needs {programs}, not found on PATH; {install_hint()}."
        )
    if ESPEAK in engines:
        from asrfit.recipes.speech.espeak import data_path

        data_path()
    if FLITE in engines:
        listed = _run(["flite", "-lv"], "flite -lv").decode(errors="replace")
        absent = [v for v in FLITE_VOICES if v not in listed.split()]
        if absent:
            raise AsrfitError(f"flite has no voice {absent}: it lists {listed.strip()!r}.")
    if FESTIVAL in engines:
        roots = [Path("/usr/share/festival/voices"), Path("/usr/local/share/festival/voices")]
        found = {p.name for root in roots if root.is_dir() for p in root.glob("*/*")}
        absent = [v for v in FESTIVAL_VOICES if v not in found]
        if absent:
            raise AsrfitError(f"Festival has no voice {absent}; {install_hint()}.")


def _run(args: list[str], what: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(
            args, input=stdin, capture_output=True, timeout=_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise AsrfitError(f"{args[0]}: not found; {install_hint()}.") from exc
    except subprocess.TimeoutExpired as exc:
        raise AudioError(f"{what}: no result after {_TIMEOUT_S} s.") from exc
    if done.returncode != 0:
        raise AudioError(
            f"{what}: exit status {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}"
        )
    return done.stdout


def _read_wav(path: Path, what: str) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(path, dtype="float32", always_2d=False)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    if audio.size == 0:
        raise AudioError(f"{what}: rendered no audio.")
    return audio.astype(np.float32), int(rate)


def flite_f0_hz(pitch: int) -> float:
    """Target mean F0 for espeak-ng's 0-100 pitch scale: 70 Hz at 0, 140 at 50, 280 at 100."""
    return 70.0 * 2.0 ** (pitch / 50.0)


def render(
    engine: str, voice: str, text: str, *, rate_wpm: int, pitch: int, pitch_range: int, seed: int
) -> tuple[np.ndarray, int]:
    """Speak ``text`` with ``engine``'s ``voice``: float32 mono samples and their sample rate.

    Args:
        engine: One of :data:`ENGINES`.
        voice: The engine's voice name (``en-US+m3``, ``awb``, ``ked_diphone``).
        text: Lower-case words.
        rate_wpm: Speaking rate, words per minute; flite and Festival stretch their durations by
            ``NATIVE_WPM / rate_wpm``.
        pitch: Base pitch 0-100 (espeak-ng's scale); flite takes it as a target mean F0
            (:func:`flite_f0_hz`; its ``rms`` voice ignores the target). Festival speaks at its
            voices' own pitch.
        pitch_range: Pitch range 0-100 (espeak-ng only).
        seed: espeak-ng's noise seed; flite and Festival draw no random numbers.

    Raises:
        AudioError: When the engine fails or renders nothing.
        AsrfitError: When the engine is not installed.
    """
    if engine == ESPEAK:
        from asrfit.recipes.speech.espeak import Espeak

        espeak = Espeak.get()
        audio = espeak.render(
            text, voice, rate_wpm=rate_wpm, pitch=pitch, pitch_range=pitch_range, seed=seed
        )
        return audio, espeak.sample_rate
    known = {FLITE: FLITE_VOICES, FESTIVAL: FESTIVAL_VOICES}.get(engine)
    if known is not None and voice not in known:
        # flite speaks an unknown voice name with its default voice instead of failing
        raise AudioError(f"{engine} voice {voice!r}: not one of asrfit's {engine} voices {known}.")
    stretch = f"{NATIVE_WPM / rate_wpm:.4f}"
    with tempfile.TemporaryDirectory(prefix="asrfit-tts-") as tmp:
        wav = Path(tmp) / "out.wav"
        what = f"{engine} voice {voice!r} on {text!r}"
        if engine == FLITE:
            args = ["flite", "-voice", voice, "-t", text, "-o", str(wav)]
            args += ["--setf", f"duration_stretch={stretch}"]
            args += ["--setf", f"int_f0_target_mean={flite_f0_hz(pitch):.1f}"]
            _run(args, what)
        elif engine == FESTIVAL:
            args = ["text2wave", "-o", str(wav), "-eval", f"(voice_{voice})"]
            args += ["-eval", f"(Parameter.set 'Duration_Stretch {stretch})"]
            # text2wave exits 0 even when Festival fails: the missing file tells
            out = _run(args, what, stdin=text.encode())
            if not wav.is_file():
                raise AudioError(
                    f"{what}: text2wave wrote no file ({out.decode(errors='replace')})."
                )
        else:
            raise AudioError(f"engine={engine!r}: not a synthesizer; choose one of {ENGINES}.")
        return _read_wav(wav, what)
