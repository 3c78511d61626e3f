"""The speakers of the speech corpus: three engines' voices, split so that tests hear new ones.

* espeak-ng: each accent with each voice variant (``en-US+m3``) is a speaker. Splits are made by
  variant, so a dev or test voice is a variant training never heard, in any accent.
* flite: its general-purpose voices, each with :data:`PERSONAS` speakers of their own pitch
  and rate per split. flite has four speakers (``kal`` at two sample rates, ``awb``, ``rms``),
  too few to hold any out, so train, dev and test all hear them, with different personas.
* Festival: the held-out engine (:data:`HELD_OUT_ENGINE`). Its voices speak only the
  ``heldout`` split, and no flite voice of the same recorded speaker is in any split (flite's
  ``slt`` is left out, as Festival's HTS voice is built from the same recordings).

Within train, dev and test an utterance is flite's with probability :data:`FLITE_SHARE`.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np

from asrfit.errors import ConfigError
from asrfit.recipes.speech.engines import (
    ESPEAK,
    FESTIVAL,
    FESTIVAL_VOICES,
    FLITE,
    FLITE_VOICES,
    VOICE_MODEL,
    VOICE_SPEAKER,
)
from asrfit.recipes.speech.espeak import data_path

ACCENTS = (
    "en",
    "en-US",
    "en-GB-x-rp",
    "en-GB-scotland",
    "en-GB-x-gbclan",
    "en-GB-x-gbcwmd",
    "en-US-nyc",
    "en-029",
)
HELD_OUT_ENGINE = FESTIVAL
#: Speakers per flite or Festival voice and split (as many as espeak-ng's accents).
PERSONAS = len(ACCENTS)
#: Share of flite utterances in train, dev and test; the rest are espeak-ng's.
FLITE_SHARE = 0.3


@dataclass(frozen=True)
class Speaker:
    """One synthetic speaker: an engine's voice with its own base pitch, pitch range and rate.

    Attributes:
        engine: The synthesizer (:data:`~asrfit.recipes.speech.engines.ENGINES`).
        voice: The engine's voice name: ``en-GB-scotland+f3`` (espeak-ng: accent + variant),
            ``awb`` (flite), ``ked_diphone`` (Festival).
        persona: What tells speakers of one voice apart: espeak-ng's accent, or ``dev3`` (the
            split's name and a number) for flite and Festival, whose voices have no accents.
        pitch: Base pitch 0-100 (espeak-ng's scale).
        pitch_range: Pitch range 0-100.
        rate_wpm: Base speaking rate, words per minute.
    """

    engine: str
    voice: str
    persona: str
    pitch: int
    pitch_range: int
    rate_wpm: int

    @property
    def variant(self) -> str:
        """What splits are made by: espeak-ng's variant (``f3``), else the voice (``awb``)."""
        return self.voice.split("+", 1)[1] if self.engine == ESPEAK else self.voice

    @property
    def speaker_id(self) -> str:
        """A stable id: the espeak-ng voice name, else ``engine:voice/persona``."""
        return self.voice if self.engine == ESPEAK else f"{self.engine}:{self.voice}/{self.persona}"

    @property
    def family(self) -> str:
        """espeak-ng: the variant's family (``klatt``); flite and Festival: the signal model."""
        return family_of(self.variant) if self.engine == ESPEAK else VOICE_MODEL[self.voice]


def family_of(variant: str) -> str:
    """``klatt3`` -> ``klatt``, ``m7`` -> ``m``, ``iven2`` -> ``iven``."""
    return re.sub(r"\d+$", "", variant)


def variants() -> list[str]:
    """The voice variants the installed espeak-ng data holds (sorted; names with spaces left out)."""
    folder = data_path() / "voices" / "!v"
    return sorted(p.name for p in folder.iterdir() if p.is_file() and " " not in p.name)


def make_speaker(engine: str, voice: str, persona: str, seed: int) -> Speaker:
    """The speaker of a voice and persona, its pitch and rate drawn from ``seed`` and its name."""
    rng = np.random.default_rng([seed, zlib.crc32(f"{engine}:{voice}/{persona}".encode())])
    return Speaker(
        engine,
        voice,
        persona,
        int(rng.integers(25, 76)),
        int(rng.integers(20, 81)),
        int(rng.integers(140, 200)),
    )


@dataclass(frozen=True)
class VoiceSplit:
    """Which voices each split speaks with.

    Attributes:
        train, dev, test: espeak-ng variants (disjoint).
        flite: flite voices heard in train, dev and test (personas differ by split).
        heldout: Festival voices, heard only in ``heldout``.
    """

    train: tuple[str, ...]
    dev: tuple[str, ...]
    test: tuple[str, ...]
    flite: tuple[str, ...]
    heldout: tuple[str, ...]

    def speakers(self, split: str, seed: int) -> dict[str, list[Speaker]]:
        """Every speaker of ``split``, by engine."""
        personas = [f"{split}{k}" for k in range(PERSONAS)]
        if split == "heldout":
            return {
                FESTIVAL: [
                    make_speaker(FESTIVAL, v, p, seed) for v in self.heldout for p in personas
                ]
            }
        return {
            ESPEAK: [
                make_speaker(ESPEAK, f"{a}+{v}", a, seed)
                for v in getattr(self, split)
                for a in ACCENTS
            ],
            FLITE: [make_speaker(FLITE, v, p, seed) for v in self.flite for p in personas],
        }


def pick_speaker(rng: np.random.Generator, speakers: dict[str, list[Speaker]]) -> Speaker:
    """One utterance's speaker: flite's with probability :data:`FLITE_SHARE` where it speaks."""
    engine = next(iter(speakers))
    if FLITE in speakers:
        engine = FLITE if rng.random() < FLITE_SHARE else ESPEAK
    pool = speakers[engine]
    return pool[int(rng.integers(len(pool)))]


def split_voices(seed: int, *, num_dev: int = 8, num_test: int = 8) -> VoiceSplit:
    """Split espeak-ng's variants into train, dev and test; flite's voices whose recorded speaker
    Festival does not also speak go everywhere but ``heldout``; Festival's voices to ``heldout``.

    Raises:
        ConfigError: When too few espeak-ng variants remain for training.
    """
    names = variants()
    if len(names) < num_dev + num_test + 4:
        raise ConfigError(
            f"num_dev={num_dev}, num_test={num_test}: only {len(names)} voice variants; use fewer."
        )
    order = np.random.default_rng([seed, 23]).permutation(len(names))
    shuffled = [names[i] for i in order]
    dev = tuple(sorted(shuffled[:num_dev]))
    test = tuple(sorted(shuffled[num_dev : num_dev + num_test]))
    train = tuple(sorted(shuffled[num_dev + num_test :]))
    held_out_people = {VOICE_SPEAKER[v] for v in FESTIVAL_VOICES}
    flite = tuple(v for v in FLITE_VOICES if VOICE_SPEAKER[v] not in held_out_people)
    return VoiceSplit(train, dev, test, flite, FESTIVAL_VOICES)
