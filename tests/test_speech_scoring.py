"""Tests for the speech demo's scoring helpers (bench/speech_demo.py), against hand counts."""

from __future__ import annotations

import pytest

from bench.speech_demo import _by_engine, ngram_coverage


def test_ngram_coverage_counts_each_splits_word_ngrams_seen_in_the_lm_text() -> None:
    lm = ["a b c d", "b c e"]
    cover = ngram_coverage(lm, {"t": ["a b c e", "x b c"], "u": ["d e"]}, 3)
    # t: unigrams a b c e x b c -> 6 of 7 seen; bigrams ab bc ce xb bc -> 4 of 5 ("c e" is in
    # "b c e"); trigrams abc bce xbc -> 2 of 3. u: d, e seen; "d e" never adjacent in the LM.
    assert cover["t"] == pytest.approx({1: 6 / 7, 2: 4 / 5, 3: 2 / 3})
    assert cover["u"] == pytest.approx({1: 1.0, 2: 0.0, 3: 0.0})  # no trigram in "d e": 0


def test_by_engine_splits_error_rates_by_the_manifests_engine() -> None:
    refs, hyps = ["ab cd", "ef gh", "ij kl"], ["ab cd", "ef gx", "ij kl"]
    by = _by_engine(refs, hyps, {"ab cd": "espeak-ng", "ef gh": "flite", "ij kl": "flite"})
    assert by["espeak-ng"] == {"utterances": 1, "wer": 0.0, "cer": 0.0}
    # flite: 1 wrong word of 4; 1 wrong character of 10 (spaces count, as in CER)
    assert by["flite"]["utterances"] == 2 and by["flite"]["wer"] == pytest.approx(1 / 4)
    assert by["flite"]["cer"] == pytest.approx(1 / 10)
