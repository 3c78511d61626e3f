"""asrfit's plan inside lhotse's own DynamicBucketingSampler: the exported fixed per-bucket
sizes and the byte-budget ``SamplingConstraint``, checked on real lhotse cuts."""

from __future__ import annotations

import io
import random

import pytest
import torch

from asrfit.errors import ConfigError
from asrfit.plan.exports import export_plan

lhotse = pytest.importorskip("lhotse")
from lhotse.dataset import DynamicBucketingSampler  # noqa: E402
from lhotse.dataset.sampling.base import SamplingConstraint  # noqa: E402
from lhotse.dataset.sampling.dynamic_bucketing import (  # noqa: E402
    FixedBucketBatchSizeConstraint,
)

from asrfit.data.lhotse_constraint import LhotseBytesConstraint, sampler_state_dict  # noqa: E402
from asrfit.testing.dummies import dummy_cutset  # noqa: E402
from tests.test_exports import example_plan  # noqa: E402

EDGES = [4.0, 10.0, 20.0]


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    rng = random.Random(0)
    durations = [round(rng.uniform(0.5, 19.5), 2) for _ in range(90)]
    return dummy_cutset(tmp_path_factory.mktemp("cuts"), durations, sample_rate_hz=8000)


def bucket_of(seconds: float) -> int:
    return next(i for i, edge in enumerate(EDGES) if seconds <= edge)


def batches(sampler):
    return [list(b) for b in sampler]


def test_exported_fixed_bucket_sizes_drive_lhotse(cuts):
    plan = example_plan()
    kwargs = export_plan(plan, "lhotse")
    constraint = FixedBucketBatchSizeConstraint(**kwargs.pop("constraint"))
    sampler = DynamicBucketingSampler(cuts, constraint=constraint, **kwargs)
    seen = []
    for batch in batches(sampler):
        buckets = {bucket_of(c.duration) for c in batch}
        assert len(buckets) == 1  # lhotse keeps the plan's buckets apart
        assert len(batch) <= plan.buckets[buckets.pop()].batch_size
        seen += [c.id for c in batch]
    assert sorted(seen) == sorted(c.id for c in cuts)  # every cut once


def test_bytes_constraint_is_a_lhotse_constraint_and_keeps_the_budget(cuts):
    plan = example_plan()
    # A budget that binds: what a batch of 3 cuts of 10 s with 150 labels is predicted to need.
    budget = plan.predicted_reserved_bytes(3, plan.input_length(10.0), 150)
    constraint = LhotseBytesConstraint(plan, budget_bytes=budget)
    assert isinstance(constraint, SamplingConstraint)
    sampler = DynamicBucketingSampler(
        cuts, constraint=constraint, duration_bins=plan.bucket_duration_bins, shuffle=True, seed=1
    )
    seen, sizes = [], []
    for batch in batches(sampler):
        bucket = bucket_of(batch[0].duration)
        assert len(batch) <= plan.buckets[bucket].batch_size
        longest = max(plan.input_length(c.duration) for c in batch)
        labels = max(len(c.supervisions[0].text) for c in batch)
        if len(batch) > 1:  # a single cut over the budget is still yielded (lhotse warns)
            assert plan.predicted_reserved_bytes(len(batch), longest, labels) <= budget
        seen += [c.id for c in batch]
        sizes.append(len(batch))
    assert sorted(seen) == sorted(c.id for c in cuts)
    # The budget bound: without it the short bucket would fill 32-cut batches.
    unbounded = DynamicBucketingSampler(
        cuts,
        constraint=LhotseBytesConstraint(plan),
        duration_bins=plan.bucket_duration_bins,
        shuffle=True,
        seed=1,
    )
    assert max(len(b) for b in batches(unbounded)) > max(sizes)


def test_state_dict_round_trip_mid_batch(cuts):
    plan = example_plan()
    first = LhotseBytesConstraint(plan)
    short = [c for c in cuts if c.duration <= 4.0]
    for cut in short[:3]:
        first.add(cut)
    state = first.state_dict()
    restored = LhotseBytesConstraint(plan)
    restored.load_state_dict(dict(state))
    assert restored.state_dict() == state
    assert restored.predicted_bytes == first.predicted_bytes > 0
    for cut in short[3:40]:  # the two decide alike from here on
        first.add(cut)
        restored.add(cut)
        assert first.exceeded() == restored.exceeded()
        assert first.close_to_exceeding() == restored.close_to_exceeding()
    copy = first.copy()
    assert copy.state_dict() == first.state_dict() and copy is not first
    with pytest.raises(ConfigError, match="unknown key"):
        restored.load_state_dict(dict(state, extra=1))


def test_sampler_stopped_mid_epoch_resumes_with_exactly_the_remaining_batches(cuts):
    plan = example_plan()
    budget = plan.predicted_reserved_bytes(3, plan.input_length(10.0), 150)

    def sampler():
        return DynamicBucketingSampler(
            cuts,
            constraint=LhotseBytesConstraint(plan, budget_bytes=budget),
            duration_bins=plan.bucket_duration_bins,
            shuffle=True,
            seed=3,
        )

    reference = sampler()  # the epoch without interruption
    reference.set_epoch(1)
    everything = [[c.id for c in batch] for batch in reference]
    stopped = sampler()
    stopped.set_epoch(1)
    taken = len(everything) // 2
    iterator = iter(stopped)
    first_half = [[c.id for c in next(iterator)] for _ in range(taken)]
    assert first_half == everything[:taken]
    # lhotse's own state_dict refuses a custom constraint; sampler_state_dict gives its dict
    with pytest.raises(AssertionError, match="custom constraint"):
        stopped.state_dict()
    saved = io.BytesIO()
    torch.save(sampler_state_dict(stopped), saved)  # as a checkpoint holds it
    saved.seek(0)
    fresh = sampler()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    rest = list(fresh)
    assert [[c.id for c in batch] for batch in rest] == everything[taken:]
    assert 0 < taken < len(everything)
    for batch in rest:  # each within the byte budget (a single cut over it is yielded alone)
        longest = max(plan.input_length(c.duration) for c in batch)
        labels = max(len(c.supervisions[0].text) for c in batch)
        assert (
            len(batch) == 1 or plan.predicted_reserved_bytes(len(batch), longest, labels) <= budget
        )
    with pytest.raises(ConfigError, match="not LhotseBytesConstraint"):
        sampler_state_dict(DynamicBucketingSampler(cuts, max_duration=40.0))


def test_cut_above_the_largest_bucket_is_named(tmp_path):
    constraint = LhotseBytesConstraint(example_plan())
    (cut,) = dummy_cutset(tmp_path, [21.0], sample_rate_hz=8000)
    with pytest.raises(ConfigError, match="above the plan's largest bucket"):
        constraint.add(cut)
