"""Tests for the speech corpus (asrfit.recipes.speech): espeak-ng binding, grammar, voices, splits.

espeakng-loader is a declared test dependency (the ``speech`` extra, installed by the Makefile),
so these tests fail rather than skip when it is missing. flite and Festival are Debian programs
the Makefile installs with apt-get; where that was not possible the corpus tests are skipped
(``-rs`` lists them with the reason).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrfit.errors import AsrfitError, ConfigError
from asrfit.recipes.speech import espeak as espeak_module
from asrfit.recipes.speech.corpus import LM_TEXT, SPEECH_SPLITS, write_lm_text, write_speech_corpus
from asrfit.recipes.speech.engines import (
    ESPEAK,
    FESTIVAL,
    FESTIVAL_VOICES,
    FLITE,
    VOICE_SPEAKER,
)
from asrfit.recipes.speech.espeak import Espeak
from asrfit.recipes.speech.grammar import Grammar, adverb, gerund, past, plural, spell_number
from asrfit.recipes.speech.voices import FLITE_SHARE, pick_speaker, split_voices

needs_engines = pytest.mark.skipif(
    shutil.which("flite") is None or shutil.which("text2wave") is None,
    reason="flite or Festival's text2wave not installed (make test installs them with apt-get)",
)

SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank"  # 13 words


# --- the ctypes binding ---------------------------------------------------------------------
def test_espeak_renders_a_sentence_at_the_asked_rate() -> None:
    engine = Espeak.get()
    words = len(SENTENCE.split())
    for rate_wpm in (120, 240):
        audio = engine.render(SENTENCE, "en-US", rate_wpm=rate_wpm)
        seconds = audio.size / engine.sample_rate
        expected = 60.0 * words / rate_wpm  # words at the asked words-per-minute
        assert 0.6 * expected < seconds < 1.5 * expected, (rate_wpm, seconds, expected)
        assert audio.dtype == np.float32 and 0.05 < np.abs(audio).max() <= 1.0


def test_espeak_unknown_voice_is_named() -> None:
    with pytest.raises(AsrfitError, match="no voice 'xx-nowhere'"):
        Espeak.get().render("hello", "xx-nowhere")


def test_missing_wheel_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_loader(name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if name == "espeakng_loader":
            raise ImportError("no module")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_loader)
    with pytest.raises(AsrfitError, match=r"pip install 'asrfit\[speech\]'"):
        espeak_module.data_path()


# --- the grammar ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("word", "form", "expected"),
    [
        ("box", plural, "boxes"),
        ("city", plural, "cities"),
        ("day", plural, "days"),
        ("knife", plural, "knives"),
        ("child", plural, "children"),
        ("stop", past, "stopped"),
        ("carry", past, "carried"),
        ("bake", past, "baked"),
        ("play", past, "played"),
        ("buy", past, "bought"),
        ("visit", past, "visited"),
        ("make", gerund, "making"),
        ("run", gerund, "running"),
        ("swim", gerund, "swimming"),
        ("open", gerund, "opening"),
        ("quick", adverb, "quickly"),
        ("happy", adverb, "happily"),
        ("gentle", adverb, "gently"),
    ],
)
def test_inflections_are_english(word: str, form, expected: str) -> None:  # noqa: ANN001
    assert form(word) == expected


def test_numbers_spelled_out() -> None:
    assert spell_number(7) == "seven"
    assert spell_number(13) == "thirteen"
    assert spell_number(40) == "forty"
    assert spell_number(241) == "two hundred and forty one"
    assert spell_number(900) == "nine hundred"
    with pytest.raises(ValueError):
        spell_number(1000)


def test_grammar_has_thousands_of_words_and_sentences() -> None:
    grammar = Grammar()
    sentences = grammar.sentences(5000, seed=1)
    assert len(set(sentences)) == 5000
    used = {w for s in sentences for w in s.split()}
    assert len(used) >= 1800 and used <= grammar.vocabulary()
    assert len(grammar.vocabulary()) >= 2000
    assert all(set(s) <= set("abcdefghijklmnopqrstuvwxyz ") and "  " not in s for s in sentences)
    assert grammar.sentences(50, seed=1) == sentences[:50]
    assert grammar.sentences(50, seed=2) != sentences[:50]


# --- voices ---------------------------------------------------------------------------------
def test_voice_split_holds_out_variants_and_an_engine() -> None:
    split = split_voices(0)
    groups = [set(split.train), set(split.dev), set(split.test), set(split.heldout)]
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            assert not a & b
    assert len(split.train) >= 50 and len(split.dev) == len(split.test) == 8
    assert split.heldout == FESTIVAL_VOICES
    # no flite voice of a person Festival's held-out voices were recorded from
    assert not {VOICE_SPEAKER[v] for v in split.flite} & {VOICE_SPEAKER[v] for v in split.heldout}
    assert {"kal", "awb", "rms"} <= set(split.flite) and "slt" not in split.flite
    for name in ("train", "dev", "test"):
        speakers = split.speakers(name, 0)
        assert set(speakers) == {ESPEAK, FLITE}
        assert len(speakers[ESPEAK]) == 8 * len(getattr(split, name))
    assert set(split.speakers("heldout", 0)) == {FESTIVAL}
    with pytest.raises(ConfigError, match="voice variants"):
        split_voices(0, num_dev=100)


# --- the corpus -----------------------------------------------------------------------------
COUNTS = {"num_train": 24, "num_dev": 6, "num_test": 6, "num_heldout": 6, "lm_sentences": 300}


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("speech") / "c"
    write_speech_corpus(out, seed=3, **COUNTS)
    return out


@needs_engines
def test_corpus_is_deterministic_for_a_seed_whatever_the_workers(
    corpus_dir: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    write_speech_corpus(again, seed=3, workers=2, **COUNTS)
    assert _files(corpus_dir) == _files(again)
    other = tmp_path / "other"
    write_speech_corpus(other, seed=4, **COUNTS)
    assert _read(other / "train.jsonl") != _read(corpus_dir / "train.jsonl")


@needs_engines
def test_splits_share_no_speaker_no_espeak_variant_and_no_sentence(corpus_dir: Path) -> None:
    rows = {s: _read(corpus_dir / f"{s}.jsonl") for s in SPEECH_SPLITS}
    assert {s: len(r) for s, r in rows.items()} == {"train": 24, "dev": 6, "test": 6, "heldout": 6}
    for i, a in enumerate(SPEECH_SPLITS):
        for b in SPEECH_SPLITS[i + 1 :]:
            for key in ("speaker", "sentence_id", "text"):
                assert not {r[key] for r in rows[a]} & {r[key] for r in rows[b]}, (a, b, key)
            variants_a = {r["voice"].split("+")[1] for r in rows[a] if r["engine"] == ESPEAK}
            assert not variants_a & {
                r["voice"].split("+")[1] for r in rows[b] if r["engine"] == ESPEAK
            }
    assert {r["engine"] for r in rows["heldout"]} == {FESTIVAL}
    assert all(r["engine"] in (ESPEAK, FLITE) for s in SPEECH_SPLITS[:3] for r in rows[s])


def test_flite_speaks_its_share_of_train_dev_and_test() -> None:
    split = split_voices(0)
    rng = np.random.default_rng(0)
    for name in ("train", "test"):
        speakers = split.speakers(name, 0)
        picked = [pick_speaker(rng, speakers) for _ in range(4000)]
        share = sum(p.engine == FLITE for p in picked) / len(picked)
        sd = (FLITE_SHARE * (1 - FLITE_SHARE) / len(picked)) ** 0.5  # binomial
        assert abs(share - FLITE_SHARE) < 4 * sd, share
        assert {p.voice for p in picked if p.engine == FLITE} == set(split.flite)
    festival = split.speakers("heldout", 0)
    assert {pick_speaker(rng, festival).engine for _ in range(50)} == {FESTIVAL}


@needs_engines
def test_lm_text_is_train_transcripts_plus_unseen_sentences(corpus_dir: Path) -> None:
    rows = {s: _read(corpus_dir / f"{s}.jsonl") for s in SPEECH_SPLITS}
    lines = (corpus_dir / LM_TEXT).read_text(encoding="utf-8").splitlines()
    train = [r["text"] for r in rows["train"]]
    assert lines[: len(train)] == train and len(lines) == len(train) + 300
    assert len(set(lines)) == len(lines)
    held_out = {r["text"] for s in SPEECH_SPLITS[1:] for r in rows[s]}
    assert not held_out & set(lines)
    # the grammar's sentences, drawn after the corpus's own (not a filter over them)
    drawn = Grammar().sentences(42 + 300, 3)
    assert lines[len(train) :] == drawn[42:]


@needs_engines
def test_lm_text_refuses_a_corpus_of_another_seed(corpus_dir: Path) -> None:
    with pytest.raises(ConfigError, match="seed 4"):
        write_lm_text(corpus_dir, seed=4, extra=10)


@needs_engines
def test_manifest_durations_match_the_audio(corpus_dir: Path) -> None:
    for split in SPEECH_SPLITS:
        for row in _read(corpus_dir / f"{split}.jsonl"):
            info = sf.info(corpus_dir / row["audio_filepath"])
            assert info.samplerate == 16000 and info.frames / 16000 == row["duration"]
            words = len(row["text"].split())
            # the voice speaks at rate_wpm (or its own rate, about 175); speed perturbation
            # scales it; lead/tail silence adds <= 0.6 s
            spoken = 60.0 * words / (row["rate_wpm"] or 175) / row["speed"]
            assert 0.5 * spoken < row["duration"] < 1.6 * spoken + 0.6, row


@needs_engines
def test_non_empty_folder_is_refused(corpus_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not empty.*pass --overwrite"):  # the CLI's flag
        write_speech_corpus(corpus_dir, **COUNTS)


@needs_engines
def test_cli_demo_data_speech_writes_four_splits(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from asrfit.cli.main import cli

    out = tmp_path / "cli"
    result = CliRunner().invoke(
        cli,
        [
            "demo-data",
            "--speech",
            str(out),
            "--num-train",
            "4",
            "--num-dev",
            "2",
            "--num-test",
            "2",
            "--num-heldout",
            "2",
            "--seed",
            "5",
            "--lm-sentences",
            "20",
        ],
    )
    assert result.exit_code == 0, result.output
    assert {s: len(_read(out / f"{s}.jsonl")) for s in SPEECH_SPLITS} == {
        "train": 4,
        "dev": 2,
        "test": 2,
        "heldout": 2,
    }
    assert "heldout split" in result.output


def test_cli_lm_sentences_default_is_the_library_default() -> None:
    from asrfit.cli.demo import command
    from asrfit.recipes.speech.corpus import LM_SENTENCES

    option = next(p for p in command.params if p.name == "lm_sentences")
    assert option.default == LM_SENTENCES
