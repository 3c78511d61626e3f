"""Manifest streaming, validation, reservoir sampling and audio headers (asrfit.profiles.manifest)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from asrfit.errors import AudioError, ManifestError
from asrfit.profiles import audio_files as af
from asrfit.profiles import manifest as mf
from asrfit.profiles.arrow_columns import float64_values, utf8_lengths
from asrfit.testing.dummies import (
    dummy_audio_folder,
    dummy_manifest,
    write_dummy_audio,
    write_manifest,
)

GOOD = {"audio_filepath": "a.wav", "duration": 1.0, "text": "hi"}


@pytest.fixture(params=["pyarrow", "python"])
def reader(request, monkeypatch):
    """Run a test with each reader: the pyarrow fast path and the line-by-line fallback."""
    if request.param == "pyarrow":
        pytest.importorskip("pyarrow.json")
    else:
        monkeypatch.setattr(mf, "_scan_pyarrow", lambda *args, **kwargs: None)
    return request.param


# ------------------------------------------------------------------ reservoir


def test_reservoir_keeps_everything_when_capacity_exceeds_stream():
    res: mf.Reservoir[int] = mf.Reservoir(10, seed=3)
    for i in range(7):
        for _, slot in res.advance(1):
            res.put(slot, i)
    assert sorted(res.items) == list(range(7))


def test_reservoir_same_sample_one_at_a_time_or_in_batches():
    def run(batches: list[int]) -> list[int]:
        res: mf.Reservoir[int] = mf.Reservoir(5, seed=11)
        start = 0
        for size in batches:
            for offset, slot in res.advance(size):
                res.put(slot, start + offset)
            start += size
        return res.items

    one_by_one = run([1] * 1000)
    assert run([1000]) == one_by_one
    assert run([3, 0, 500, 97, 400]) == one_by_one
    assert len(set(one_by_one)) == 5 and all(0 <= x < 1000 for x in one_by_one)


def test_reservoir_is_uniform():
    # Each of 10 items must be kept with probability 3/10; 4000 seeds give ~1200 +- 29 per item.
    counts: Counter[int] = Counter()
    for seed in range(4000):
        res: mf.Reservoir[int] = mf.Reservoir(3, seed)
        for offset, slot in res.advance(10):
            res.put(slot, offset)
        counts.update(res.items)
    assert sorted(counts) == list(range(10))
    assert all(abs(c - 1200) < 150 for c in counts.values()), counts


# ------------------------------------------------------------------ iter / scan


def test_iter_manifest_skips_blank_lines_and_resolves_paths(tmp_path):
    path = write_manifest(
        tmp_path / "m.jsonl",
        [
            {"audio_filepath": "sub/a.wav", "duration": 1.5, "text": "one"},
            "",
            "   ",
            {"audio_filepath": "/abs/b.wav", "text": "two"},
        ],
    )
    entries = list(mf.iter_manifest(path))
    assert [e.line_number for e in entries] == [1, 4]
    assert entries[0].audio_filepath == tmp_path / "sub" / "a.wav"
    assert entries[1].audio_filepath == Path("/abs/b.wav")
    assert entries[0].duration_seconds == 1.5 and entries[1].duration_seconds is None
    assert [e.text for e in entries] == ["one", "two"]


def test_scan_arrays_and_unicode_lengths(tmp_path, reader):
    rows = [
        {"audio_filepath": "a.wav", "duration": 2, "text": "héllo wörld"},  # 11 characters
        "",
        {"audio_filepath": "b.wav", "text": "日本語", "extra": {"nested": [1]}},  # 3 characters
        {"audio_filepath": "c.wav", "duration": 0.25, "text": ""},
    ]
    scan = mf.scan_manifest(write_manifest(tmp_path / "m.jsonl", rows), sample_size=10)
    assert scan.parser == reader
    assert scan.num_utterances == 3
    np.testing.assert_array_equal(scan.durations_seconds, [2.0, np.nan, 0.25])
    np.testing.assert_array_equal(scan.text_chars, [11, 3, 0])
    assert scan.num_missing_durations == 1
    assert [u.audio for u in scan.sample_all] == [tmp_path / n for n in ("a.wav", "b.wav", "c.wav")]
    assert [u.index for u in scan.sample_missing_duration] == [1]


def _plain(sample: list[mf.SampledUtterance]) -> list[tuple]:
    """Comparable tuples (NaN durations compare unequal, so map them to None)."""
    return [
        (
            u.index,
            u.audio,
            u.text_chars,
            None if math.isnan(u.duration_seconds) else u.duration_seconds,
        )
        for u in sample
    ]


def test_both_readers_give_the_same_scan(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow.json")
    rows = [
        {
            "audio_filepath": f"a{i}.wav",
            "text": "x" * (i % 7),
            **({"duration": 0.5 + i} if i % 3 else {}),
        }
        for i in range(3000)
    ]
    path = write_manifest(tmp_path / "m.jsonl", rows)
    fast = mf.scan_manifest(path, sample_size=50, seed=4)
    monkeypatch.setattr(mf, "_scan_pyarrow", lambda *args, **kwargs: None)
    slow = mf.scan_manifest(path, sample_size=50, seed=4)
    assert (fast.parser, slow.parser) == ("pyarrow", "python")
    np.testing.assert_array_equal(fast.durations_seconds, slow.durations_seconds)
    np.testing.assert_array_equal(fast.text_chars, slow.text_chars)
    assert _plain(fast.sample_all) == _plain(slow.sample_all)
    assert _plain(fast.sample_missing_duration) == _plain(slow.sample_missing_duration)
    assert len(fast.sample_missing_duration) == 50
    assert all(u.index % 3 == 0 for u in fast.sample_missing_duration)


def test_twenty_thousand_line_manifest(tmp_path, reader):
    """Functional check of a large manifest (timing lives in bench/profile_speed.py)."""
    n = 20_000
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(
                json.dumps(
                    {"audio_filepath": f"a/{i}.wav", "duration": 1 + i % 4, "text": "ab" * (i % 5)}
                )
                + "\n"
            )
    scan = mf.scan_manifest(path, sample_size=200, seed=0)
    assert scan.num_utterances == n
    assert scan.durations_seconds.sum() == n / 4 * (1 + 2 + 3 + 4)
    assert scan.text_chars.sum() == n / 5 * 2 * (0 + 1 + 2 + 3 + 4)
    assert len(scan.sample_all) == 200 and scan.sample_missing_duration == []
    assert len({u.index for u in scan.sample_all}) == 200
    for u in scan.sample_all:  # each sampled item carries its own line's values
        assert u.duration_seconds == 1 + u.index % 4 and u.text_chars == 2 * (u.index % 5)
        assert u.audio == tmp_path / "a" / f"{u.index}.wav"


# ------------------------------------------------------------------ bad input


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match=r"nope\.jsonl: no such manifest file"):
        mf.scan_manifest(tmp_path / "nope.jsonl")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_manifest(tmp_path, content, reader):
    path = tmp_path / "m.jsonl"
    path.write_text(content)
    with pytest.raises(ManifestError, match="manifest is empty"):
        mf.scan_manifest(path)


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"audio_filepath": "a.wav", "text": "x"', r"line 3: malformed JSON"),
        ("[1, 2]", r"line 3: expected a JSON object"),
        ('{"duration": 1.0, "text": "x"}', r"line 3: missing field 'audio_filepath'"),
        ('{"audio_filepath": "a.wav", "duration": 1.0}', r"line 3: missing field 'text'"),
        ('{"audio_filepath": "", "text": "x"}', r"line 3: field 'audio_filepath' is ''"),
        ('{"audio_filepath": "a.wav", "text": null}', r"line 3: field 'text' is None"),
        ('{"audio_filepath": "a.wav", "text": 5}', r"line 3: field 'text' is 5"),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": -2.5}',
            r"line 3: field 'duration' is -2\.5",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": 0}',
            r"line 3: field 'duration' is 0\.0",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": NaN}',
            r"line 3: field 'duration' is nan",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": Infinity}',
            r"line 3: field 'duration' is inf",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": 1e999}',
            r"line 3: field 'duration' is inf",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": "1.0"}',
            r"line 3: field 'duration' is '1\.0'",
        ),
        (
            '{"audio_filepath": "a.wav", "text": "x", "duration": true}',
            r"line 3: field 'duration' is True",
        ),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path, bad_line, expected, reader):
    path = write_manifest(tmp_path / "m.jsonl", [GOOD, "", bad_line, GOOD])
    with pytest.raises(ManifestError, match=expected) as info:
        mf.scan_manifest(path)
    assert str(path) in str(info.value)
    with pytest.raises(ManifestError, match=expected):
        list(mf.iter_manifest(path))


def test_bad_line_deep_in_a_large_manifest_is_found_by_the_fallback(tmp_path, reader):
    rows: list = (
        [GOOD] * 9000 + ['{"audio_filepath": "a.wav", "text": "x", "duration": -1}'] + [GOOD] * 10
    )
    with pytest.raises(ManifestError, match=r"line 9001: field 'duration' is -1\.0"):
        mf.scan_manifest(write_manifest(tmp_path / "m.jsonl", rows))


# ------------------------------------------------------------------ audio headers and folders


@pytest.mark.parametrize(
    ("ext", "rate", "frames"), [("wav", 16000, 12345), ("flac", 8000, 4000), ("ogg", 22050, 22050)]
)
def test_read_audio_header_is_exact(tmp_path, ext, rate, frames):
    path = write_dummy_audio(tmp_path / f"x.{ext}", num_samples=frames, sample_rate_hz=rate)
    header = af.read_audio_header(path)
    assert (header.num_frames, header.sample_rate_hz, header.num_channels) == (frames, rate, 1)
    assert header.duration_seconds == frames / rate
    assert header.file_bytes == path.stat().st_size
    from_bytes = af.read_audio_header(path.read_bytes())
    assert (from_bytes.num_frames, from_bytes.file_bytes) == (frames, path.stat().st_size)


def test_read_audio_header_errors(tmp_path):
    garbage = tmp_path / "bad.wav"
    garbage.write_bytes(b"this is not audio" * 10)
    with pytest.raises(AudioError, match=r"bad\.wav: cannot read the audio header"):
        af.read_audio_header(garbage)
    with pytest.raises(AudioError, match=r"gone\.wav: no such audio file"):
        af.read_audio_header(tmp_path / "gone.wav")
    with pytest.raises(AudioError, match="row 7"):
        af.read_audio_header(b"junk", where="row 7")


def test_scan_audio_folder_sibling_and_librispeech(tmp_path):
    dummy_audio_folder(tmp_path / "a", [0.5, 1.0], texts=["hello there", "bye"])
    (tmp_path / "a" / "loose.wav").write_bytes((tmp_path / "a" / "utt_0000.wav").read_bytes())
    pairs = af.scan_audio_folder(tmp_path / "a")
    assert [(p.name, t) for p, t in pairs] == [
        ("loose.wav", None),
        ("utt_0000.wav", "hello there"),
        ("utt_0001.wav", "bye"),
    ]
    dummy_audio_folder(
        tmp_path / "b",
        [0.5, 1.0],
        texts=["one two", "three"],
        layout="librispeech",
        extension="flac",
    )
    pairs = af.scan_audio_folder(tmp_path / "b")
    assert [(p.name, t) for p, t in pairs] == [
        ("19-198-0000.flac", "ONE TWO"),
        ("19-198-0001.flac", "THREE"),
    ]


def test_scan_audio_folder_errors(tmp_path):
    with pytest.raises(ManifestError, match="no such folder"):
        af.scan_audio_folder(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ManifestError, match="no audio files"):
        af.scan_audio_folder(tmp_path)


def test_dummy_manifest_writes_exact_audio(tmp_path):
    path = dummy_manifest(tmp_path, [0.25, 1.0], texts=["a", "b"], sample_rate_hz=8000)
    entries = list(mf.iter_manifest(path))
    assert [af.read_audio_header(e.audio_filepath).num_frames for e in entries] == [2000, 8000]
    assert not math.isnan(entries[0].duration_seconds)


@pytest.mark.parametrize("large", [False, True])
def test_utf8_lengths_count_characters_like_python(large: bool) -> None:
    pa = pytest.importorskip("pyarrow")
    texts = ["", "abc", "naïve café", "日本語のテキスト", "emoji 🎙️ mic", "x" * 300, "ß", ""]
    column = pa.array(texts, type=pa.large_string() if large else pa.string())
    assert utf8_lengths(column).tolist() == [len(t) for t in texts]
    sliced = column.slice(2, 4)  # an offset into shared buffers, as record batches have
    assert utf8_lengths(sliced).tolist() == [len(t) for t in texts[2:6]]
    assert utf8_lengths(pa.array([], type=pa.string())).tolist() == []


def test_float64_values_and_nulls_from_buffers() -> None:
    pa = pytest.importorskip("pyarrow")
    raw = [1.5, None, 3.25, None, None, 7.0, 8.5, None, 9.75, 10.0, None]
    column = pa.array(raw, type=pa.float64())
    for sliced, expected in ((column, raw), (column.slice(3, 6), raw[3:9])):
        values, is_null = float64_values(sliced)
        assert is_null.tolist() == [v is None for v in expected]
        assert [float(v) for v, n in zip(values, is_null, strict=True) if not n] == [
            v for v in expected if v is not None
        ]
    values, is_null = float64_values(pa.array([2.0, 4.0]))
    assert values.tolist() == [2.0, 4.0] and not is_null.any()
