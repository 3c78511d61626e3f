"""Two-dimensional buckets (duration x labels): label terms, plan, sampler, exports.

References: closed forms for the label slopes and the step-time parts; real lhotse cuts for
the export; fresh full simulations of the real model for the planned limits.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import numpy as np
import pytest

from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.errors import ConfigError
from asrfit.memory.fit.costmodel import PeakModel, label_slopes, with_label_terms
from asrfit.memory.steptime.runtime import StepCost, step_seconds
from asrfit.plan.exports import export_plan
from asrfit.plan.plan import Bucket, Plan
from asrfit.testing import make_bucket
from tests.test_exports import example_plan


def _closed_form(c0, a, b, c, e, d=0.0):  # noqa: ANN001, ANN202
    return lambda B, T, U: c0 + B * (d + a * T + b * T * T + c * U + e * T * U)  # noqa: N803


def test_label_slopes_recover_both_terms_from_two_pairs() -> None:
    f = _closed_form(1e6, 300.0, 2.0, 700.0, 5.0)
    pairs = [
        (1, 800, 40, f(1, 800, 40), 10, f(1, 800, 10)),
        (2, 400, 20, f(2, 400, 20), 5, f(2, 400, 5)),
    ]
    c, e = label_slopes(pairs)
    assert (c, e) == (pytest.approx(700.0), pytest.approx(5.0))


def test_label_slopes_keep_the_smaller_reading_when_a_term_would_be_negative() -> None:
    # slope 100 per label at T=100 and 50 at T=200: e < 0; below the line the smaller slope
    # predicts more memory, so 50 is kept for every length, and no cross term
    pairs = [(1, 100, 20, 2000.0, 10, 1000.0), (1, 200, 20, 1500.0, 10, 1000.0)]
    assert label_slopes(pairs) == (50.0, 0.0)
    with pytest.raises(ValueError, match="equal labels"):
        label_slopes([(1, 100, 10, 1.0, 10, 1.0)])


def test_with_label_terms_keeps_the_line_and_moves_off_it_by_the_slopes() -> None:
    fitted = PeakModel(1e6, 400.0, 3.0, 50.0, 1e4)  # fitted on U = r T: label columns arbitrary
    r, c, e = 0.05, 700.0, 5.0
    moved = with_label_terms(fitted, r, c, e)
    for b, t in ((1, 200), (7, 800), (32, 1600)):
        u_line = r * t
        assert moved.predict(b, t, u_line) == pytest.approx(fitted.predict(b, t, u_line))
        for u in (1, u_line / 2, 2 * u_line):
            shift = b * (c + e * t) * (u - u_line)
            assert moved.predict(b, t, u) == pytest.approx(fitted.predict(b, t, u_line) + shift)


def _loop_cost(b: int, t: int, u: int) -> StepCost:
    """A transducer-like step: a loss loop of T x U small kernels (batch-independent count,
    each moving B x 4 KB) and one encoder op moving B x T x 8 KB."""
    return StepCost(
        [
            ["forward", "elementwise", "fp32", 0, 8192 * b * t, 1, 1],
            ["backward", "elementwise", "fp32", 0, 4096 * b, 1, t * u],
        ]
    )


@pytest.mark.parametrize("gpu", [False, True])
def test_step_time_parts_follow_a_loop_whose_kernel_count_does_not_grow_with_the_batch(gpu) -> None:
    from asrfit.memory.setup import Setup
    from asrfit.plan.setup_costs import SetupCosts
    from asrfit.plan.speed import predict_step_seconds
    from asrfit.profiles.gpus.catalog import find_gpu
    from asrfit.profiles.rates import gpu_rates
    from tests.test_runtime import _cpu_rates

    rates = gpu_rates(find_gpu("A100-80GB")) if gpu else _cpu_rates()
    traced = [(1, 100, 5), (1, 400, 20), (2, 200, 10), (2, 400, 20), (16, 100, 5), (16, 400, 20)]
    costs = SetupCosts(
        Setup(), None, 0, 0, 0, None, time_points=[(*s, _loop_cost(*s)) for s in traced]
    )
    # an untraced shape: a large batch of a long input
    for b, t, u in [*traced, (64, 300, 15)]:
        expected = step_seconds(_loop_cost(b, t, u), rates)
        assert predict_step_seconds(costs, rates, b, t, u) == pytest.approx(expected, rel=0.02)


def two_d_plan() -> Plan:
    """Two duration ranges, each split in two label ranges; memory grows with T x U."""
    base = example_plan()
    bucket = functools.partial(make_bucket, predicted_peak_bytes=int(12e9))
    return dataclasses.replace(
        base,
        buckets=[
            bucket(0.0, 4.0, 40, max_label_length=30, utterance_fraction=0.3),
            bucket(0.0, 4.0, 32, min_label_length=30, max_label_length=60, utterance_fraction=0.2),
            bucket(4.0, 10.0, 16, max_label_length=100, utterance_fraction=0.3),
            bucket(
                4.0, 10.0, 12, min_label_length=100, max_label_length=150, utterance_fraction=0.2
            ),
        ],
        bucketing="2d",
        cost_model=PeakModel(1e9, 100.0, 0.0, 0.0, 0.0, e_bytes_per_step_label=50.0),
    )


def test_two_d_plan_places_utterances_by_duration_then_labels() -> None:
    plan = two_d_plan()
    assert plan.bucket_index(3.0, 10) == 0
    assert plan.bucket_index(3.0, 30) == 0
    assert plan.bucket_index(3.0, 31) == 1
    assert plan.bucket_index(3.0, 500) == 1  # longer than every edge: the last range
    assert plan.bucket_index(4.5, 31) == 2
    assert plan.bucket_index(9.9, 101) == 3
    assert plan.bucket_index(10.5, 1) is None
    assert plan.bucket_duration_bins == [[4.0, 30], [4.0, 60], [10.0, 100], [10.0, 150]]
    assert plan.duration_limits() == ([4.0, 10.0], [32, 12])
    again = Plan.from_dict(plan.to_dict())
    assert again == plan


def test_two_d_plan_rejects_label_ranges_that_do_not_follow_each_other() -> None:
    plan = two_d_plan()
    broken = plan.to_dict()
    broken["buckets"][1]["min_label_length"] = 25
    with pytest.raises(ConfigError, match="expected min_label_length=30"):
        Plan.from_dict(broken)
    one_d = plan.to_dict()
    one_d["bucketing"] = "1d"
    with pytest.raises(ConfigError, match="in a '1d' plan"):
        Plan.from_dict(one_d)


def test_sampler_batches_by_both_dimensions_and_keeps_every_utterance_once() -> None:
    plan = two_d_plan()
    rng = np.random.default_rng(0)
    seconds = rng.uniform(0.5, 9.9, 400)
    labels = np.round(seconds * rng.uniform(4, 15, 400)).astype(int) + 1
    sampler = MemoryBudgetSampler(seconds, plan, label_lengths=labels, seed=3)
    want = np.array([plan.bucket_index(s, int(u)) for s, u in zip(seconds, labels, strict=True)])
    seen = []
    for batch in sampler:
        seen += batch
        assert len(batch) <= max(plan.buckets[k].batch_size for k in set(want[batch]))
        t = plan.input_length(max(seconds[batch]))
        assert (
            plan.predicted_reserved_bytes(len(batch), t, int(max(labels[batch])))
            <= plan.usable_bytes
        )
    assert sorted(seen) == list(range(400))
    # no carrying between buckets here: each batch is one bucket's, by duration and labels
    sampler = MemoryBudgetSampler(seconds, plan, label_lengths=labels, seed=3, num_replicas=1)
    pure = [b for b in sampler if len(set(want[b])) == 1]
    assert len(pure) >= len(list(sampler)) - len(plan.buckets)  # at most one mixed per bucket
    assert {sampler.bucket_of(b) for b in pure} == set(want.tolist())


def test_nemo_and_lhotse_exports_carry_the_pairs(tmp_path) -> None:
    plan = two_d_plan()
    nemo = export_plan(plan, "nemo")["model"]["train_ds"]
    assert nemo["bucket_duration_bins"] == [[4.0, 30], [4.0, 60], [10.0, 100], [10.0, 150]]
    assert nemo["bucket_batch_size"] == [40, 32, 16, 12]
    assert nemo["bucketing_2d_strict_mode"] is False
    lhotse_kwargs = export_plan(plan, "lhotse")
    assert lhotse_kwargs["constraint"]["strict_2d"] is False
    assert lhotse_kwargs["duration_bins"] == nemo["bucket_duration_bins"]


def test_lhotse_sampler_with_the_bytes_constraint_buckets_by_duration_and_transcript(
    tmp_path,
) -> None:
    pytest.importorskip("lhotse")
    from lhotse.dataset import DynamicBucketingSampler

    from asrfit.data.lhotse_constraint import LhotseBytesConstraint
    from asrfit.testing.dummies import dummy_cutset

    plan = two_d_plan()
    rng = random.Random(0)
    durations = [round(rng.uniform(0.5, 9.9), 2) for _ in range(80)]
    texts = ["a" * max(1, round(d * rng.uniform(4, 15))) for d in durations]
    cuts = dummy_cutset(tmp_path, durations, texts=texts, sample_rate_hz=8000)
    kwargs = export_plan(plan, "lhotse")
    kwargs.pop("constraint")
    sampler = DynamicBucketingSampler(cuts, constraint=LhotseBytesConstraint(plan), **kwargs)
    seen = []
    for batch in sampler:
        buckets = {plan.bucket_index(c.duration, len(c.supervisions[0].text)) for c in batch}
        assert len(buckets) == 1  # lhotse kept the plan's 2-D buckets apart
        assert len(batch) <= plan.buckets[buckets.pop()].batch_size
        seen += [c.id for c in batch]
    assert sorted(seen) == sorted(c.id for c in cuts)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_planner_splits_a_transducer_by_labels_and_each_limit_holds_in_a_fresh_simulation(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny Parakeet-TDT with a 257-token vocabulary: its joint network (B x T x U x V)
    makes memory grow with the transcript, so label ranges get larger batches. Each checked
    limit is traced afresh (the real model, two steps, the plan's setup): it fits, and 15 %
    more does not (the label terms come from a chord of a convex peak: never optimistic,
    and not far off). The traced peak in allocator segments is what is checked; reserved
    bytes follow from it by the planner's allocator model (expandable segments), as in the
    plan."""
    from asrfit.memory.cuda.allocator import predict_cuda
    from asrfit.memory.models.adapters import hf_adapter
    from asrfit.memory.simulate import simulate_step
    from asrfit.memory.step import BatchShape
    from asrfit.plan.search import plan
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile
    from asrfit.testing import write_manifest
    from tests.test_memory_scratch import _bench

    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path / "cache"))
    config = _bench("_grid")._config("parakeet-tdt")
    config.vocab_size, config.blank_token_id, config.pad_token_id = 257, 256, 256
    rng = np.random.default_rng(0)
    seconds = rng.uniform(1.0, 4.0, 200)
    rows = [
        {"audio_filepath": f"a{i}.wav", "duration": float(d), "text": "a" * int(d * c)}
        for i, (d, c) in enumerate(
            zip(seconds, np.clip(rng.normal(15, 3, 200), 6, 26), strict=True)
        )
    ]
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "m.jsonl", rows))
    usable = 300 * 2**20
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: usable))
    hardware = HardwareProfile.from_name("L4")
    p = plan(hardware, dataset, config, target_effective_batch=512)
    assert p.bucketing == "2d", p.bucketing_reason
    assert "duration x label buckets" in p.bucketing_reason and "x)" in p.bucketing_reason
    one_d = plan(hardware, dataset, config, target_effective_batch=512, bucketing="1d")
    assert p.predicted_throughput_seconds_per_second > one_d.predicted_throughput_seconds_per_second
    last_range = [b for b in p.buckets if b.max_seconds == p.buckets[-1].max_seconds]
    assert len(last_range) >= 2
    adapter = hf_adapter(config)

    def reserved(batch: int, bucket: Bucket) -> int:
        step = simulate_step(
            adapter, BatchShape(batch, bucket.max_input_length, bucket.max_label_length), p.setup
        )
        return predict_cuda(
            step.peak_bytes,
            step.segment_bytes(p.expandable_segments),
            architecture=p.architecture,
            expandable_segments=p.expandable_segments,
        ).reserved_bytes

    for bucket in (last_range[0], last_range[-1]):
        assert reserved(bucket.batch_size, bucket) <= usable
        assert reserved(int(bucket.batch_size * 1.15) + 1, bucket) > usable


def test_label_ranges_may_pick_a_setup_slower_with_duration_buckets(monkeypatch) -> None:
    """The fastest setup with duration buckets is tried with label ranges first; where they
    help it, the next ones are tried too, and the fastest result wins (the earlier on a tie,
    a later one only with label ranges)."""
    from types import SimpleNamespace

    from asrfit.memory.setup import Setup
    from asrfit.plan import label_buckets

    def candidate(throughput: float, ckpt: bool, optimizer: str = "adamw") -> SimpleNamespace:
        setup = Setup(gradient_checkpointing=ckpt, optimizer=optimizer)
        return SimpleNamespace(
            costs=SimpleNamespace(setup=setup), buckets=[], throughput=throughput, epoch_seconds=1.0
        )

    outcome: dict[
        bool, tuple[str, float]
    ] = {}  # per setup (checkpointing): (dims, rate per device)
    asked: list[bool] = []

    def fake(costs, one_d, *args):  # noqa: ANN001, ANN002, ANN202
        asked.append(costs.setup.gradient_checkpointing)
        dims, rate = outcome[costs.setup.gradient_checkpointing]
        return costs, ([], rate, 1.0), dims, f"{dims} reason"

    monkeypatch.setattr(label_buckets, "choose_bucketing", fake)
    # 2 devices; the second keeps activations as the first does (another optimizer): skipped
    cands = [candidate(200.0, True), candidate(190.0, True, "sgd"), candidate(180.0, False)]
    outcome.update({True: ("2d", 104.0), False: ("2d", 130.0)})
    at, (_, result, dims, reason) = label_buckets.choose_across(cands, 2)
    assert (at, dims, result[1]) == (2, "2d", 130.0)
    assert asked == [True, False]
    assert "faster than fp32+ckpt" in reason and "208.0 audio s/s" in reason
    asked.clear()
    outcome.update({True: ("1d", 100.0)})  # label ranges do not help the fastest: it stays
    assert label_buckets.choose_across(cands, 2)[0] == 0
    assert asked == [True]
    outcome.update({True: ("2d", 104.0), False: ("1d", 150.0)})  # a later one only with 2-D
    assert label_buckets.choose_across(cands, 2)[0] == 0
    outcome.update({True: ("2d", 130.0), False: ("2d", 130.0)})  # tie: the earlier
    assert label_buckets.choose_across(cands, 2)[0] == 0
