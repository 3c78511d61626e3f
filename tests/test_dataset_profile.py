"""DatasetProfile from manifests, folders, HF datasets and lhotse cuts, against hand-made data."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from asrfit.errors import ConfigError, ManifestError
from asrfit.profiles.dataset import DatasetProfile
from asrfit.testing.dummies import (
    dummy_audio_folder,
    dummy_cutset,
    dummy_hf_dataset,
    dummy_manifest,
    write_dummy_audio,
    write_manifest,
)

HAND_DURATIONS = [1.0, 2.0, 3.0, 4.0, 10.0]
HAND_TEXTS = ["a" * 10, "b" * 20, "c" * 30, "d" * 40, "e" * 50]


def _audio_bytes_on_disk(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.wav"))


@pytest.fixture
def hand_manifest(tmp_path):
    return dummy_manifest(tmp_path, HAND_DURATIONS, texts=HAND_TEXTS)


def test_manifest_statistics_match_hand_computation(hand_manifest, tmp_path):
    p = DatasetProfile.from_manifest(hand_manifest)
    assert p.source_kind == "manifest" and p.source == str(hand_manifest)
    assert p.num_utterances == 5
    assert p.total_seconds == 20.0 and p.total_hours == pytest.approx(20 / 3600)
    assert (p.duration_min_seconds, p.duration_mean_seconds, p.duration_max_seconds) == (
        1.0,
        4.0,
        10.0,
    )
    # Linear interpolation on sorted [1, 2, 3, 4, 10]: position q * 4.
    assert p.duration_p50_seconds == 3.0
    assert p.duration_p90_seconds == pytest.approx(4 + 0.6 * 6)  # 7.6
    assert p.duration_p95_seconds == pytest.approx(4 + 0.8 * 6)  # 8.8
    assert p.duration_p99_seconds == pytest.approx(4 + 0.96 * 6)  # 9.76
    # chars/s per utterance: 10/1, 20/2, 30/3, 40/4, 50/10 = 10, 10, 10, 10, 5.
    assert p.chars_per_second_mean == pytest.approx(45 / 5)
    assert p.chars_per_second_p95 == pytest.approx(10.0)
    assert (p.text_chars_mean, p.text_chars_max) == (30.0, 50)
    # 20 bins of 0.45 s over [1, 10]: 1 -> bin 0, 2 -> 2, 3 -> 4, 4 -> 6, 10 -> 19.
    assert p.histogram.edges_seconds[0] == 1.0 and p.histogram.edges_seconds[-1] == 10.0
    assert len(p.histogram.edges_seconds) == 21
    assert [i for i, c in enumerate(p.histogram.counts) if c] == [0, 2, 4, 6, 19]
    assert sum(p.histogram.counts) == 5
    assert not p.is_estimate
    assert (p.sampled_utterances, p.missing_audio_count) == (5, 0)
    assert p.sample_rate_hz == 16000
    assert p.estimated_decoded_bytes == 20 * 16000 * 4
    # Every file was sampled and its header duration equals the manifest's: the estimate is
    # the exact sum of the file sizes.
    assert p.estimated_disk_bytes == _audio_bytes_on_disk(tmp_path)
    assert p.duration_sample_seconds == HAND_DURATIONS
    assert p.text_chars_sample == [10, 20, 30, 40, 50]


def test_sample_rate_comes_from_headers(tmp_path):
    p = DatasetProfile.from_manifest(dummy_manifest(tmp_path, [0.5, 1.5], sample_rate_hz=8000))
    assert p.sample_rate_hz == 8000
    assert p.estimated_decoded_bytes == 2 * 8000 * 4


def test_json_round_trip(hand_manifest, tmp_path):
    p = DatasetProfile.from_manifest(hand_manifest)
    assert DatasetProfile.from_json(p.to_json()) == p
    assert DatasetProfile.load(p.save(tmp_path / "profile.json")) == p
    data = p.to_dict()
    data["duration_typo_seconds"] = 1.0
    with pytest.raises(ConfigError, match="duration_typo_seconds"):
        DatasetProfile.from_dict(data)


def test_summary_rows(hand_manifest):
    rows = dict(DatasetProfile.from_manifest(hand_manifest).summary_rows())
    assert rows["Utterances"] == "5"
    assert "20.0 s" in rows["Total audio"] and "estimated" not in rows["Total audio"]
    assert rows["Duration p50 / p90 / p95 / p99"] == "3.00 / 7.60 / 8.80 / 9.76 s"
    spark = rows["Duration histogram"]
    assert spark.startswith("1.0 s |") and spark.endswith("| 10.0 s")
    bars = spark[len("1.0 s |") : -len("| 10.0 s")]
    assert len(bars) == 20 and [i for i, ch in enumerate(bars) if ch != " "] == [0, 2, 4, 6, 19]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in rows.items())


def test_durations_from_headers_are_exact_when_sample_covers_all(tmp_path):
    durations = [0.5, 1.25, 2.0, 3.0625]
    p = DatasetProfile.from_manifest(
        dummy_manifest(tmp_path, durations, with_durations=False), sample_size=4
    )
    assert p.total_seconds == sum(durations)
    assert not p.is_estimate and p.sampled_utterances == 4


def test_durations_from_a_header_sample_are_extrapolated(tmp_path):
    durations = [1.0, 2.0, 3.0, 4.0] * 5
    path = dummy_manifest(tmp_path, durations, with_durations=False)
    p = DatasetProfile.from_manifest(path, sample_size=6, seed=1)
    assert p.is_estimate and p.sampled_utterances == 6
    assert len(p.duration_sample_seconds) == 6 and set(p.duration_sample_seconds) <= {
        1.0,
        2.0,
        3.0,
        4.0,
    }
    # The total is n times the mean of the sampled headers; the mean is the total over n.
    assert p.total_seconds == pytest.approx(20 * sum(p.duration_sample_seconds) / 6)
    assert p.duration_mean_seconds == pytest.approx(p.total_seconds / 20)
    assert sum(p.histogram.counts) == 20  # counts scaled to the whole dataset
    assert "(estimated)" in dict(p.summary_rows())["Total audio"]
    again = DatasetProfile.from_manifest(path, sample_size=6, seed=1)
    assert again == p


def test_equal_durations_extrapolate_exactly(tmp_path):
    p = DatasetProfile.from_manifest(
        dummy_manifest(tmp_path, [1.5] * 12, with_durations=False), sample_size=3
    )
    assert p.is_estimate and p.total_seconds == pytest.approx(18.0)


def test_mixed_manifest_uses_given_durations_and_headers(tmp_path):
    for i, d in enumerate([1.0, 2.0, 3.0, 4.0]):
        write_dummy_audio(tmp_path / f"{i}.wav", duration_seconds=d)
    rows = [
        {"audio_filepath": "0.wav", "duration": 1.0, "text": "ab"},
        {"audio_filepath": "1.wav", "text": "abcd"},
        {"audio_filepath": "2.wav", "duration": 3.0, "text": "abcdef"},
        {"audio_filepath": "3.wav", "text": "abcdefgh"},
    ]
    p = DatasetProfile.from_manifest(write_manifest(tmp_path / "m.jsonl", rows), sample_size=10)
    assert p.total_seconds == 10.0 and not p.is_estimate
    assert p.chars_per_second_mean == pytest.approx(2.0)


def test_missing_audio_is_counted_not_fatal(tmp_path):
    path = dummy_manifest(tmp_path, HAND_DURATIONS, texts=HAND_TEXTS)
    os.remove(tmp_path / "audio" / "utt_0001.wav")
    os.remove(tmp_path / "audio" / "utt_0004.wav")
    with pytest.warns(UserWarning, match="2 of 5 sampled audio files do not exist"):
        p = DatasetProfile.from_manifest(path)
    assert p.missing_audio_count == 2 and p.total_seconds == 20.0 and not p.is_estimate
    # Bytes per second of the 3 files found (1 + 3 + 4 s), extrapolated to 20 s.
    found = sum((tmp_path / "audio" / f"utt_000{i}.wav").stat().st_size for i in (0, 2, 3))
    assert p.estimated_disk_bytes == round(found / 8.0 * 20.0)


def test_no_audio_at_all_without_durations_is_an_error(tmp_path):
    path = dummy_manifest(tmp_path, [1.0, 2.0], with_durations=False, write_audio=False)
    with (
        pytest.warns(UserWarning),
        pytest.raises(ManifestError, match="none of the 2 sampled audio files exist"),
    ):
        DatasetProfile.from_manifest(path)


def test_no_audio_with_durations_leaves_disk_bytes_unknown(tmp_path):
    path = dummy_manifest(tmp_path, [1.0, 2.0], write_audio=False)
    with pytest.warns(UserWarning):
        p = DatasetProfile.from_manifest(path)
    assert p.estimated_disk_bytes is None and p.sample_rate_hz == 16000
    assert dict(p.summary_rows())["Audio on disk"].startswith("unknown")


def test_unreadable_audio_names_the_file_and_is_left_out(tmp_path):
    path = dummy_manifest(tmp_path, [1.0, 2.0], with_durations=False)
    (tmp_path / "audio" / "utt_0001.wav").write_bytes(b"not a wav file at all")
    with pytest.warns(
        UserWarning, match=r"1 of 2 sampled audio files cannot be read .*utt_0001\.wav: cannot read"
    ):
        p = DatasetProfile.from_manifest(path)
    assert p.duration_max_seconds == 1.0 and p.missing_audio_count == 1


def test_declared_durations_the_audio_contradicts_are_warned_about(tmp_path) -> None:
    # one line declares 30 s for a 5 s file: the profile keeps the declared durations (the
    # plan's buckets come from them) but says so, before training would skip the utterance
    import json
    import warnings

    path = dummy_manifest(tmp_path, [1.0, 2.0, 5.0])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[2]["duration"] = 30.0
    rows[1]["duration"] = 2.05  # within the tolerance (0.1 s): no warning for it
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(
        UserWarning,
        match=r"1 of 3 sampled utterances declare a duration .*#2: 30 s declared, 5\.00 s in .*utt_0002\.wav",
    ):
        p = DatasetProfile.from_manifest(path)
    assert p.duration_max_seconds == 30.0
    rows[2]["duration"] = 5.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DatasetProfile.from_manifest(path)


def test_mixed_sample_rates_are_named_with_their_counts(tmp_path) -> None:
    path = dummy_manifest(tmp_path, [1.0, 1.5, 2.0])
    write_dummy_audio(
        tmp_path / "audio" / "utt_0002.wav", duration_seconds=2.0, sample_rate_hz=8000
    )
    with pytest.warns(
        UserWarning, match=r"mix sample rates: 16,000 Hz \(2\), 8,000 Hz \(1\) files"
    ):
        p = DatasetProfile.from_manifest(path)
    assert p.sample_rate_hz == 16000  # the most common, as the field says


def test_paired_sample_is_seeded_and_capped(tmp_path):
    write_dummy_audio(tmp_path / "a.wav", duration_seconds=0.1)
    rows = [
        {"audio_filepath": "a.wav", "duration": (i % 50 + 1) / 10, "text": "x" * (i % 50 + 1)}
        for i in range(2500)
    ]
    path = write_manifest(tmp_path / "m.jsonl", rows)
    p = DatasetProfile.from_manifest(path, seed=5)
    assert len(p.duration_sample_seconds) == len(p.text_chars_sample) == 2000
    assert all(
        c == round(d * 10)
        for d, c in zip(p.duration_sample_seconds, p.text_chars_sample, strict=True)
    )
    assert (
        DatasetProfile.from_manifest(path, seed=5).duration_sample_seconds
        == p.duration_sample_seconds
    )
    assert (
        DatasetProfile.from_manifest(path, seed=6).duration_sample_seconds
        != p.duration_sample_seconds
    )


def test_audio_folder_sibling_layout(tmp_path):
    durations = [0.5, 1.0, 1.5]
    dummy_audio_folder(tmp_path, durations, texts=["abcd", "ab", "abcdef"])
    p = DatasetProfile.from_audio_folder(tmp_path)
    assert p.source_kind == "audio_folder" and p.num_utterances == 3
    assert p.total_seconds == 3.0 and not p.is_estimate
    assert (p.text_chars_mean, p.text_chars_max) == (4.0, 6)
    assert p.chars_per_second_mean == pytest.approx((8 + 2 + 4) / 3)
    assert p.estimated_disk_bytes == _audio_bytes_on_disk(tmp_path)


def test_audio_folder_librispeech_layout_flac_and_sampling(tmp_path):
    durations = [0.25 * (i + 1) for i in range(8)]
    dummy_audio_folder(
        tmp_path,
        durations,
        texts=["x y"] * 8,
        layout="librispeech",
        extension="flac",
        sample_rate_hz=8000,
    )
    p = DatasetProfile.from_source(tmp_path, sample_size=8)
    assert (
        p.total_seconds == sum(durations) and p.text_chars_mean == 3.0 and p.sample_rate_hz == 8000
    )
    sampled = DatasetProfile.from_audio_folder(tmp_path, sample_size=3)
    assert sampled.is_estimate and sampled.sampled_utterances == 3


def test_audio_folder_without_transcript_warns_and_counts(tmp_path):
    dummy_audio_folder(tmp_path, [0.5, 1.0], texts=["abc", "de"])
    (tmp_path / "utt_0001.txt").unlink()
    with pytest.warns(UserWarning, match="1 of 2 audio files have no transcript"):
        p = DatasetProfile.from_audio_folder(tmp_path)
    assert p.missing_text_count == 1 and p.text_chars_mean == 1.5


def test_from_source_dispatch_and_errors(hand_manifest, tmp_path):
    assert DatasetProfile.from_source(str(hand_manifest)).source_kind == "manifest"
    json_copy = shutil.copy(hand_manifest, tmp_path / "copy.json")
    assert DatasetProfile.from_source(json_copy).total_seconds == 20.0
    with pytest.raises(ManifestError, match="no such manifest"):
        DatasetProfile.from_source(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ManifestError, match="cannot tell what this is"):
        DatasetProfile.from_source(tmp_path / "data.csv")
    with pytest.raises(ManifestError, match="cannot profile a int"):
        DatasetProfile.from_source(3)


# ------------------------------------------------------------------ Hugging Face datasets


@pytest.mark.parametrize("embed_bytes", [False, True])
def test_hf_dataset_without_torchcodec(tmp_path, embed_bytes):
    datasets = pytest.importorskip("datasets")
    ds = dummy_hf_dataset(
        tmp_path, [0.5, 1.0, 2.5], texts=["ab", "abcd", "abcde"], embed_bytes=embed_bytes
    )
    assert isinstance(ds.features["audio"], datasets.Audio)
    p = DatasetProfile.from_source(ds)
    assert p.source_kind == "hf_dataset" and p.num_utterances == 3
    assert p.total_seconds == 4.0 and not p.is_estimate
    assert (p.text_chars_mean, p.text_chars_max) == (11 / 3, 5)
    assert p.chars_per_second_mean == pytest.approx((4 + 4 + 2) / 3)
    assert p.estimated_disk_bytes == _audio_bytes_on_disk(tmp_path)
    if importlib.util.find_spec("torchcodec") is None:
        with pytest.raises(ImportError):  # decoding would need torchcodec; profiling did not
            ds[0]


def test_hf_dataset_text_column_detection_and_duration_column(tmp_path):
    pytest.importorskip("datasets")
    ds = dummy_hf_dataset(tmp_path, [0.5, 1.0], texts=["abc", "abcdef"], text_column="sentence")
    p = DatasetProfile.from_hf_dataset(ds)
    assert p.text_chars_max == 6
    ds = ds.add_column("duration", [7.0, 3.0])  # given durations win over the headers
    p = DatasetProfile.from_hf_dataset(ds.shuffle(seed=0))
    assert p.total_seconds == 10.0 and p.duration_max_seconds == 7.0 and not p.is_estimate


def test_hf_dataset_errors(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = dummy_hf_dataset(tmp_path, [0.5, 1.0], text_column="words")
    with pytest.raises(ManifestError, match=r"no transcript column .*Pass text_column="):
        DatasetProfile.from_hf_dataset(ds)
    with pytest.raises(ManifestError, match="no audio column 'speech'"):
        DatasetProfile.from_hf_dataset(ds, audio_column="speech", text_column="words")
    with pytest.raises(ManifestError, match="profile one split"):
        DatasetProfile.from_source(datasets.DatasetDict({"train": ds}))
    bad = ds.add_column("duration", [1.0, -3.0])
    with pytest.raises(ManifestError, match=r"row 1: field 'duration' is -3\.0"):
        DatasetProfile.from_hf_dataset(bad, text_column="words")
    nulls = datasets.Dataset.from_dict({"audio": [None, None], "text": ["a", None]})
    with pytest.raises(ManifestError, match=r"row 1: field 'text' is null"):
        DatasetProfile.from_hf_dataset(nulls)


# ------------------------------------------------------------------ lhotse


def test_lhotse_cutset(tmp_path):
    pytest.importorskip("lhotse")
    cuts = dummy_cutset(
        tmp_path, [0.5, 1.0, 2.5], texts=["ab", "abcd", "abcde"], sample_rate_hz=8000
    )
    p = DatasetProfile.from_source(cuts)
    assert p.source_kind == "lhotse_cutset" and p.num_utterances == 3
    assert p.total_seconds == 4.0 and not p.is_estimate
    assert (p.text_chars_mean, p.text_chars_max, p.sample_rate_hz) == (11 / 3, 5, 8000)
    assert p.estimated_disk_bytes == _audio_bytes_on_disk(tmp_path)
    assert DatasetProfile.from_json(p.to_json()) == p


def test_lhotse_empty_and_missing_audio(tmp_path):
    lhotse = pytest.importorskip("lhotse")
    with pytest.raises(ManifestError, match="CutSet is empty"):
        DatasetProfile.from_cutset(lhotse.CutSet.from_cuts([]))
    cuts = dummy_cutset(tmp_path, [0.5, 1.0])
    (tmp_path / "utt_0000.wav").unlink()
    with pytest.warns(UserWarning, match="1 of 2 sampled audio files do not exist"):
        p = DatasetProfile.from_cutset(cuts)
    assert p.missing_audio_count == 1 and p.total_seconds == 1.5


def test_mixed_manifest_with_partial_header_sample_is_weighted(tmp_path):
    write_dummy_audio(tmp_path / "one.wav", duration_seconds=1.0)
    write_dummy_audio(tmp_path / "three.wav", duration_seconds=3.0)
    rows = [{"audio_filepath": "one.wav", "duration": 1.0, "text": "ab"}] * 10
    rows += [{"audio_filepath": "three.wav", "text": "abcdef"}] * 10
    p = DatasetProfile.from_manifest(write_manifest(tmp_path / "m.jsonl", rows), sample_size=4)
    # 10 given seconds + 10 lines estimated from 4 sampled 3-second headers.
    assert p.is_estimate and p.total_seconds == pytest.approx(40.0)
    assert p.duration_mean_seconds == pytest.approx(2.0)
    # Half the utterances are 1 s and half 3 s: the weighted (inverted-CDF) median is 1 s.
    assert (p.duration_p50_seconds, p.duration_p90_seconds) == (1.0, 3.0)
    assert p.chars_per_second_mean == pytest.approx(2.0)
    assert sum(p.histogram.counts) == 20 and (p.histogram.counts[0], p.histogram.counts[-1]) == (
        10,
        10,
    )
