"""Bad inputs become logged, counted skips (or replacements), never a crash mid-epoch."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import soundfile as sf
import torch

from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.features import Frontend, LogMel
from asrfit.data.text import CharVocabulary
from asrfit.errors import ConfigError
from asrfit.models.conformer import ctc_greedy


def _wav(path, seconds: float) -> None:
    rng = np.random.default_rng(0)
    sf.write(path, (0.1 * rng.standard_normal(int(16_000 * seconds))).astype(np.float32), 16_000)


def _frames(n: int) -> int:  # a 4x subsampling model: ceil(n / 4)
    return -(-n // 4)


@pytest.fixture
def manifest(tmp_path):
    rows = []
    for name, seconds, text in [
        ("good1", 1.0, "abc ab"),
        ("good2", 2.0, "cab"),
        ("empty", 1.0, "  !? "),
        ("long_text", 0.1, "abcabcabcabcabc"),  # 15 labels, 11 mel frames -> 3 CTC frames
        ("unknown", 1.0, "abz"),
        ("too_long", 6.0, "abc"),
    ]:
        _wav(tmp_path / f"{name}.wav", seconds)
        rows.append({"audio_filepath": f"{name}.wav", "duration": seconds, "text": text})
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio at all")
    rows.append({"audio_filepath": "corrupt.wav", "duration": 1.5, "text": "ba"})
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bad_utterances_are_skipped_and_counted(manifest, caplog) -> None:
    vocab = CharVocabulary(list("abc"))
    caplog.set_level(logging.INFO)
    ds = SpeechDataset(
        utterances_from(manifest),
        vocab,
        Frontend("asrfit_conformer", LogMel()),
        output_frames=_frames,
        max_seconds=5.0,
        long_utterances="filter",
    )
    assert dict(ds.skipped) == {
        "empty_transcript": 1,
        "too_long_for_ctc": 1,
        "unknown_characters": 1,
        "too_long": 1,
    }
    assert len(ds) == 3  # good1, good2 and the corrupt file (its manifest duration looks fine)
    assert "unknown.wav" in caplog.text and "long_text.wav" in caplog.text
    # the corrupt file fails at load time: logged, counted, replaced by a shorter good one
    corrupt = next(i for i, u in enumerate(ds.utterances) if str(u.source).endswith("corrupt.wav"))
    sample = ds[corrupt]
    assert ds.replaced["unreadable_audio"] == 1 and "corrupt.wav" in caplog.text
    good1 = next(i for i, u in enumerate(ds.utterances) if str(u.source).endswith("good1.wav"))
    assert torch.equal(sample["labels"], torch.tensor(ds.labels[good1]))
    assert ds.skip_summary()["replaced_unreadable_audio"] == 1


def test_long_utterances_are_chunked_with_their_words(manifest) -> None:
    vocab = CharVocabulary(list("abc"))
    ds = SpeechDataset(
        utterances_from(manifest),
        vocab,
        Frontend("asrfit_conformer", LogMel()),
        output_frames=_frames,
        max_seconds=2.5,
        long_utterances="chunk",
    )
    chunks = [u for u in ds.utterances if "too_long" in str(u.source)]
    assert len(chunks) == 1  # "abc" is one word: one chunk keeps it, the others are empty (skipped)
    assert ds.skipped["empty_transcript"] == 1 + 2
    assert all(u.duration_seconds <= 2.5 for u in ds.utterances)


def test_nothing_usable_is_a_clear_error(tmp_path) -> None:
    _wav(tmp_path / "a.wav", 1.0)
    (tmp_path / "m.jsonl").write_text(
        json.dumps({"audio_filepath": "a.wav", "duration": 1.0, "text": ""}) + "\n"
    )
    with pytest.raises(ConfigError, match="no usable utterances"):
        SpeechDataset(
            utterances_from(tmp_path / "m.jsonl"),
            CharVocabulary(["a"]),
            Frontend("asrfit_conformer", LogMel()),
        )


def test_audio_folders_and_hf_datasets_give_the_same_utterances(tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    _wav(tmp_path / "x.wav", 1.0)
    (tmp_path / "x.txt").write_text("ab")
    folder = utterances_from(tmp_path)
    assert [(u.text, u.duration_seconds) for u in folder] == [("ab", 1.0)]
    ds = datasets.Dataset.from_dict({"audio": [str(tmp_path / "x.wav")], "text": ["ab"]})
    ds = ds.cast_column("audio", datasets.Audio(sampling_rate=16_000))
    hf = utterances_from(ds)
    assert hf[0].text == "ab" and hf[0].duration_seconds == 1.0
    np.testing.assert_allclose(hf[0].load(16_000), folder[0].load(16_000), atol=1e-6)


def test_greedy_ctc_collapses_repeats_and_drops_blanks() -> None:
    path = [1, 1, 0, 1, 2, 2, 0, 0, 3]
    logits = torch.nn.functional.one_hot(torch.tensor([path, path]), 4).float()
    assert ctc_greedy(logits, torch.tensor([9, 4])) == [[1, 1, 2, 3], [1, 1]]
