"""asrfit.testing's plan factory: valid plans, sized and summed as a real plan is.

References are hand arithmetic on the reference plan (batches 32 / 12 / 5 over 0-4-10-20 s,
50 / 40 / 10 % of the utterances, 16 kHz input, 15 labels per second) and the plan's own file
format and validation.
"""

from __future__ import annotations

import dataclasses

import pytest

from asrfit.errors import ConfigError
from asrfit.memory.setup import Setup
from asrfit.plan.effective_batch import accumulation
from asrfit.plan.fingerprint import fingerprint_mismatches
from asrfit.plan.plan import Plan
from asrfit.testing import make_bucket, make_plan


def test_the_reference_plan_round_trips_through_its_file(tmp_path) -> None:
    plan = make_plan()
    path = plan.save(tmp_path / "plan.json")
    assert Plan.load(path) == plan
    assert Plan.from_dict(plan.to_dict()) == plan


def test_buckets_are_sized_as_a_plan_sizes_them() -> None:
    plan = make_plan()
    assert [(b.min_seconds, b.max_seconds) for b in plan.buckets] == [
        (0.0, 4.0),
        (4.0, 10.0),
        (10.0, 20.0),
    ]
    assert plan.bucket_batch_sizes == [32, 12, 5]
    # 16000 samples and 15 labels per second of the upper edge
    assert [b.max_input_length for b in plan.buckets] == [64000, 160000, 320000]
    assert [b.max_label_length for b in plan.buckets] == [60, 150, 300]
    assert [plan.input_length(b.max_seconds) for b in plan.buckets] == [64000, 160000, 320000]
    assert [b.utterance_fraction for b in plan.buckets] == [0.5, 0.4, 0.1]
    assert plan.data.max_seconds == 20.0 and plan.gradient_accumulation_steps == 2


def test_predicted_peaks_are_the_plans_own_and_fit() -> None:
    plan = make_plan()
    for b in plan.buckets:
        assert b.predicted_peak_bytes == plan.predicted_reserved_bytes(
            b.batch_size, b.max_input_length, b.max_label_length
        )
    # the last bucket by hand: 1e9 + 5 x (100 x 320000 + 0.001 x 320000^2 + 1000 x 300) bytes
    # fitted; the allocator model only adds to it
    last = plan.buckets[-1]
    assert last.predicted_peak_bytes >= 1e9 + 5 * (3.2e7 + 1.024e8 + 3e5)
    assert all(b.predicted_peak_bytes <= plan.usable_bytes for b in plan.buckets)


def test_summary_figures_by_hand() -> None:
    plan = make_plan()
    # micro-batches per utterance: 0.5/32 + 0.4/12 + 0.1/5; two micro-batches per step
    per_batch = 1 / (0.5 / 32 + 0.4 / 12 + 0.1 / 5)
    assert plan.effective_batch_utterances == pytest.approx(2 * per_batch)
    # mean duration from bucket midpoints: 0.5 x 2 + 0.4 x 7 + 0.1 x 15 = 5.3 s
    assert plan.effective_batch_hours == pytest.approx(2 * per_batch * 5.3 / 3600)
    # every bucket trains 100 audio s per s; 1000 utterances of 5.3 s take 53 s
    assert plan.predicted_throughput_seconds_per_second == pytest.approx(100.0)
    assert plan.predicted_epoch_seconds == pytest.approx(53.0)
    # the plan search's own arithmetic picks the same accumulation and effective batch
    accum, utts, hours, _ = accumulation(plan.buckets, world=1, target_utts=32, target_hours=None)
    assert accum == plan.gradient_accumulation_steps
    assert utts == pytest.approx(plan.effective_batch_utterances)
    assert hours == pytest.approx(plan.effective_batch_hours)


def test_world_size_multiplies_the_effective_batch_and_throughput() -> None:
    one = make_plan()
    four = make_plan(setup=Setup(world_size=4))
    ratio = four.effective_batch_utterances / one.effective_batch_utterances
    assert ratio == pytest.approx(4.0)
    assert four.predicted_throughput_seconds_per_second == pytest.approx(400.0)


def test_a_hand_made_plan_carries_no_fingerprint_to_refuse() -> None:
    plan = make_plan()
    assert plan.fingerprints == {}
    current = {"model": "wav2vec2/X params=1 trainable=1", "gpu": "T4 15360 MiB", "data": "x"}
    assert fingerprint_mismatches(plan.fingerprints, current) == []


def test_explicit_figures_are_kept() -> None:
    plan = make_plan(
        (4, 2),
        bucket_edges_seconds=(0.0, 5.0, 8.0),
        utterance_fractions=(0.7, 0.3),
        predicted_peak_bytes=(7, 9),
        throughputs_seconds_per_second=(50.0, 60.0),
        effective_batch_utterances=40.0,
        effective_batch_hours=0.06,
        predicted_throughput_seconds_per_second=1.0,
        predicted_epoch_seconds=2.0,
        input_frames_per_second=100.0,
        labels_per_second=10.0,
        num_workers=3,
        architecture="ampere",
    )
    assert [b.predicted_peak_bytes for b in plan.buckets] == [7, 9]
    assert [b.throughput_seconds_per_second for b in plan.buckets] == [50.0, 60.0]
    assert [b.max_input_length for b in plan.buckets] == [500, 800]
    assert [b.max_label_length for b in plan.buckets] == [50, 80]
    assert (plan.effective_batch_utterances, plan.effective_batch_hours) == (40.0, 0.06)
    assert (plan.predicted_throughput_seconds_per_second, plan.predicted_epoch_seconds) == (1, 2)
    assert plan.data.num_workers == 3 and plan.architecture == "ampere"


def test_a_two_dimensional_plan_from_buckets_round_trips(tmp_path) -> None:
    buckets = [
        make_bucket(0.0, 4.0, 40, max_label_length=30, utterance_fraction=0.3),
        make_bucket(0.0, 4.0, 32, min_label_length=30, max_label_length=60, utterance_fraction=0.2),
        make_bucket(4.0, 10.0, 16, max_label_length=100, utterance_fraction=0.5),
    ]
    plan = make_plan(buckets=buckets, bucketing="2d")
    assert plan.bucket_duration_bins == [[4.0, 30], [4.0, 60], [10.0, 100]]
    assert Plan.load(plan.save(tmp_path / "plan.json")) == plan
    plan.buckets[0].batch_size = 1  # the factory copied the caller's buckets
    assert buckets[0].batch_size == 40


def test_inconsistent_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="bucket_edges_seconds"):
        make_plan((8, 4), bucket_edges_seconds=(0.0, 4.0))
    with pytest.raises(ValueError, match="utterance_fractions"):
        make_plan((8, 4), bucket_edges_seconds=(0.0, 2.0, 4.0), utterance_fractions=(1.0,))
    with pytest.raises(ValueError, match="not both"):
        make_plan(buckets=[make_bucket(0.0, 4.0, 8)], utterance_fractions=(1.0,))
    # the plan's own validation still runs
    with pytest.raises(ConfigError, match="max_seconds must increase"):
        make_plan(buckets=[make_bucket(4.0, 10.0, 8), make_bucket(0.0, 4.0, 8)])
    with pytest.raises(ConfigError, match="batch_size"):
        make_plan((0,), bucket_edges_seconds=(0.0, 4.0))
    with pytest.raises(ConfigError, match="'1d' plan"):
        dataclasses.replace(make_plan(), buckets=[make_bucket(0.0, 4.0, 8, min_label_length=3)])
