"""Tests of the memory-budget sampler: budget, coverage, determinism, DDP, resume, loaders."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asrfit.data.constraint import BytesConstraint
from asrfit.data.hf_loader import hf_train_dataloader
from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.errors import ConfigError
from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.plan.plan import Plan
from asrfit.testing import plans

GIB = 2**30


def make_plan(
    buckets: list[tuple[float, float, int]],
    usable_bytes: int,
    cost: PeakModel | None = None,
    labels_per_second: float = 15.0,
) -> Plan:
    """A hand-made plan: ``(min_seconds, max_seconds, batch_size)`` per bucket.

    Each bucket is sized for 16 kHz input and 15 labels per second
    (``max_label_length = ceil(max_seconds x 15)``) whatever the plan's ``labels_per_second``.
    """
    return plans.make_plan(
        buckets=[plans.make_bucket(lo, hi, size) for lo, hi, size in buckets],
        model="test",
        gpu="test",
        usable_bytes=int(usable_bytes),
        setup=Setup(),
        gradient_accumulation_steps=1,
        target_effective_batch="32 utterances",
        cost_model=cost or PeakModel(1e9, 1000.0, 0.0, 0.0),
        labels_per_second=labels_per_second,
    )


# With c0 = 1e9 bytes, a = 1000 bytes per input step and nothing else, an utterance of 10 s
# (160000 samples) costs 1.6e8 bytes. asrfit's allocator model (no architecture given) adds
# the bound of expandable segments' pages to a fitted peak (2 MiB + 20 MiB = 23068672 bytes),
# an 8 MiB + 128 KiB cuBLAS workspace (8519680 bytes), multiplies by 1.02 (expandable
# segments) and rounds up to 2 MiB. Under a 4e9-byte budget:
#   n = 18: (1e9 + 18 * 1.6e8 + 23068672 + 8519680) * 1.02 = 3989820119.04
#           -> 1903 * 2 MiB = 3990880256 <= 4e9
#   n = 19: (1e9 + 19 * 1.6e8 + 23068672 + 8519680) * 1.02 = 4153020119.04 > 4e9
HAND_LIMIT = 18
HAND_BYTES_18 = 3990880256


def test_bytes_constraint_matches_hand_computed_limit():
    plan = make_plan([(0.0, 20.0, 100)], usable_bytes=4_000_000_000)
    c = BytesConstraint(plan, max_batch_size=100)
    for _ in range(HAND_LIMIT):
        assert c.try_add(160000, 150)
    assert c.predicted_bytes == HAND_BYTES_18
    assert c.close_to_exceeding()
    assert c.would_exceed(160000, 150)
    assert not c.try_add(160000, 150)
    assert c.num_utterances == HAND_LIMIT and not c.exceeded()
    # a shorter one does not fit either: the batch is padded to its longest (padding counts)
    assert c.would_exceed(16000, 15)
    c.add(160000, 150)  # add() is unconditional; exceeded() reports it
    assert c.exceeded()
    c.reset()
    assert c.num_utterances == 0 and c.predicted_bytes == 0 and not c.exceeded()


@pytest.mark.parametrize(
    ("expandable", "architecture"), [(True, None), (False, None), (True, "hopper")]
)
def test_predicted_reserved_bytes_follow_the_documented_formula(expandable, architecture):
    # docs/memory_cuda.md, written out here without asrfit's constants: the fitted peak
    # (c0 + a x B x T here), plus the bound of expandable segments' pages (2 MiB + 20 MiB) when
    # they are on, plus the cuBLAS workspace (65 MiB on Hopper, else 8 MiB + 8 x 16 KiB), times
    # 1.02 (expandable segments) or 1.08 (classic), rounded up to 2 MiB
    from dataclasses import replace

    mib = 2**20
    plan = replace(
        make_plan([(0.0, 20.0, 100)], usable_bytes=4_000_000_000),
        expandable_segments=expandable,
        architecture=architecture,
    )
    pages = 22 * mib if expandable else 0
    workspace = 65 * mib if architecture == "hopper" else 8 * mib + 128 * 1024
    allowance = 1.02 if expandable else 1.08
    for n, steps in [(1, 16000), (7, 48000), (18, 160000), (33, 3)]:
        exact = (1e9 + 1000 * n * steps + pages + workspace) * allowance
        assert (
            plan.predicted_reserved_bytes(n, steps, 10)
            == math.ceil(int(exact) / (2 * mib)) * 2 * mib
        )


def test_bytes_constraint_counts_the_longest_seen_and_the_count_limit():
    plan = make_plan([(0.0, 20.0, 100)], usable_bytes=4_000_000_000)
    c = BytesConstraint(plan, max_batch_size=100)
    for _ in range(HAND_LIMIT):
        assert c.try_add(16000, 15)  # 1 s each: far from the budget
    # one 10 s utterance would make 19 x 10 s of padded batch: over budget
    assert c.would_exceed(160000, 150)
    capped = BytesConstraint(plan, max_batch_size=3)
    assert [capped.try_add(16000, 15) for _ in range(4)] == [True, True, True, False]
    with pytest.raises(ConfigError, match="max_batch_size"):
        BytesConstraint(plan, max_batch_size=0)


def test_sampler_batches_follow_the_hand_computed_limit_and_the_bucket_limit():
    plan = make_plan([(0.0, 20.0, 100)], usable_bytes=4_000_000_000)
    batches = list(MemoryBudgetSampler([10.0] * 40, plan, seed=3))
    assert sorted(len(b) for b in batches) == [4, 18, 18]
    capped = make_plan([(0.0, 20.0, 10)], usable_bytes=4_000_000_000)
    assert sorted(len(b) for b in MemoryBudgetSampler([10.0] * 40, capped)) == [10, 10, 10, 10]


EDGES = (2.0, 5.0, 10.0)


@settings(max_examples=60, deadline=None)
@given(
    durations=st.lists(st.floats(0.05, 12.0), min_size=1, max_size=60),
    limits=st.tuples(*[st.integers(1, 40)] * 3),
    usable_gib=st.floats(1.0, 4.0),
    a_bytes=st.floats(100.0, 4000.0),
    b_bytes=st.floats(0.0, 0.002),
    c_bytes=st.floats(0.0, 1e5),
    labels_per_second=st.floats(1.0, 30.0),
    seed=st.integers(0, 1000),
    pool=st.integers(0, 5),
)
def test_never_over_budget_and_every_kept_utterance_once(
    durations, limits, usable_gib, a_bytes, b_bytes, c_bytes, labels_per_second, seed, pool
):
    lows = (0.0, *EDGES[:-1])
    plan = make_plan(
        list(zip(lows, EDGES, limits, strict=True)),
        usable_bytes=int(usable_gib * GIB),
        cost=PeakModel(1e9, a_bytes, b_bytes, c_bytes),
        labels_per_second=labels_per_second,
    )
    sampler = MemoryBudgetSampler(durations, plan, seed=seed, sort_pool_batches=pool)
    inputs = [round(d * 16000) for d in durations]
    labels = [math.ceil(d * labels_per_second) for d in durations]

    def bucket(d):
        return next((k for k, e in enumerate(EDGES) if d <= e), None)

    expected_skips = {
        i
        for i, d in enumerate(durations)
        if bucket(d) is None
        or plan.predicted_reserved_bytes(1, inputs[i], labels[i]) > plan.usable_bytes
    }
    seen = []
    for batch in sampler:
        longest_input = max(inputs[i] for i in batch)
        longest_label = max(labels[i] for i in batch)
        assert (
            plan.predicted_reserved_bytes(len(batch), longest_input, longest_label)
            <= plan.usable_bytes
        )
        # a bucket's partial last batch may start the next bucket's packing: the batch's
        # bucket is that of its longest utterance, and it keeps that bucket's limit
        top = max(bucket(durations[i]) for i in batch)
        assert sampler.bucket_of(batch) == top
        assert len(batch) <= limits[top]
        seen += batch
    assert sorted(seen) == sorted(set(range(len(durations))) - expected_skips)
    assert set(sampler.skipped_indices) == expected_skips
    assert sum(sampler.skipped.values()) == len(expected_skips)


def test_too_long_utterances_are_skipped_and_counted():
    plan = make_plan([(0.0, 5.0, 8), (5.0, 10.0, 4)], usable_bytes=8 * GIB)
    durations = [1.0, 12.0, 3.0, 10.0, 10.5, 7.0, 30.0]
    sampler = MemoryBudgetSampler(durations, plan)
    assert sampler.skipped == {"longer than the largest bucket (10 s)": 3}
    assert sampler.skipped_indices == [1, 4, 6]
    assert sorted(i for b in sampler for i in b) == [0, 2, 3, 5]
    with pytest.raises(ConfigError, match="index 4 was skipped"):
        sampler.bucket_of([4])
    assert sampler.bucket_of([0, 2]) == 0 and sampler.bucket_of([3, 5]) == 1


def test_bad_inputs_are_named():
    plan = make_plan([(0.0, 5.0, 8)], usable_bytes=8 * GIB)
    with pytest.raises(ConfigError, match=r"durations\[1\]"):
        MemoryBudgetSampler([1.0, float("nan")], plan)
    with pytest.raises(ConfigError, match="2 label_lengths for 3 durations"):
        MemoryBudgetSampler([1.0, 2.0, 3.0], plan, label_lengths=[1, 2])
    with pytest.raises(ConfigError, match=r"label_lengths\[0\]"):
        MemoryBudgetSampler([1.0], plan, label_lengths=[-1])
    with pytest.raises(ConfigError, match="rank=2"):
        MemoryBudgetSampler([1.0], plan, num_replicas=2, rank=2)


def spread(count: int, low: float, high: float, seed: int) -> list[float]:
    return np.random.default_rng(seed).uniform(low, high, count).round(3).tolist()


def three_bucket_plan() -> Plan:
    # a budget so large that only the bucket limits bind
    return make_plan([(0.0, 2.0, 10), (2.0, 5.0, 6), (5.0, 10.0, 2)], usable_bytes=64 * GIB)


def three_bucket_durations() -> list[float]:
    # 45 + 30 + 7 utterances: 5, 5 and 4 batches per bucket
    return spread(45, 0.5, 2.0, 1) + spread(30, 2.1, 5.0, 2) + spread(7, 5.1, 10.0, 3)


def test_same_seed_same_batches_other_epoch_or_seed_other_order():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    first = list(MemoryBudgetSampler(durations, plan, seed=7))
    assert list(MemoryBudgetSampler(durations, plan, seed=7)) == first
    other_epoch = MemoryBudgetSampler(durations, plan, seed=7)
    other_epoch.set_epoch(1)
    second = list(other_epoch)
    assert second != first
    assert sorted(map(sorted, second)) != sorted(map(sorted, first))  # new batches, not only order
    assert sorted(i for b in second for i in b) == list(range(len(durations)))
    assert list(MemoryBudgetSampler(durations, plan, seed=8)) != first
    # buckets are mixed: the first batches do not all come from one bucket
    mixed = MemoryBudgetSampler(durations, plan, seed=7)
    assert len({mixed.bucket_of(b) for b in first[:6]}) > 1


def test_without_shuffle_batches_follow_dataset_order_bucket_by_bucket():
    plan = three_bucket_plan()
    durations = [1.0, 3.0, 1.5, 6.0, 0.5, 4.0, 7.0]
    batches = list(MemoryBudgetSampler(durations, plan, shuffle=False, sort_pool_batches=0))
    # bucket 0's partial batch [0, 2, 4] (3 <= bucket 1's limit 6) starts bucket 1's packing;
    # bucket 1's partial batch (5 > bucket 2's limit 2) stays
    assert batches == [[0, 2, 4, 1, 5], [3, 6]]
    # 8 short ones do not fit bucket 1's limit of 6: no carry
    batches = list(MemoryBudgetSampler([1.0] * 8 + [3.0], plan, shuffle=False))
    assert batches == [list(range(8)), [8]]


def test_pools_are_sorted_by_length_before_packing():
    plan = make_plan([(0.0, 10.0, 3)], usable_bytes=64 * GIB)
    durations = [3.0, 1.0, 2.0, 6.0, 5.0, 4.0]
    got = list(MemoryBudgetSampler(durations, plan, shuffle=False, sort_pool_batches=1))
    assert got == [[1, 2, 0], [5, 4, 3]]
    unsorted = list(MemoryBudgetSampler(durations, plan, shuffle=False, sort_pool_batches=0))
    assert unsorted == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("epoch", [0, 1])
def test_two_ranks_disjoint_cover_everything_and_share_the_bucket(epoch):
    plan, durations = three_bucket_plan(), three_bucket_durations()
    ranks = [MemoryBudgetSampler(durations, plan, seed=5, num_replicas=2, rank=r) for r in (0, 1)]
    for s in ranks:
        s.set_epoch(epoch)
    out = [list(s) for s in ranks]
    # buckets: 5 batches (45 = 10+10+10+10+5), 5 (30 = 6*5), 4 (7 = 2+2+2+1): the odd tails are
    # split in two, so each rank gets 3 + 3 + 2 batches
    assert len(out[0]) == len(out[1]) == len(ranks[0]) == 8
    for b0, b1 in zip(*out, strict=True):
        assert ranks[0].bucket_of(b0) == ranks[1].bucket_of(b1)
    flat = [[i for b in o for i in b] for o in out]
    assert not set(flat[0]) & set(flat[1])
    assert sorted(flat[0] + flat[1]) == list(range(len(durations)))
    assert ranks[0].num_repeated == 0 and ranks[0].num_dropped == 0


def test_two_ranks_drop_last_drops_the_tails():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    ranks = [
        MemoryBudgetSampler(durations, plan, num_replicas=2, rank=r, drop_last=True) for r in (0, 1)
    ]
    out = [list(s) for s in ranks]
    assert len(out[0]) == len(out[1]) == 2 + 2 + 2
    flat = [i for o in out for b in o for i in b]
    assert len(flat) == len(set(flat)) == len(durations) - ranks[0].num_dropped
    assert ranks[0].num_dropped == 5 + 6  # the fifth batch of buckets 0 and 1


def test_fewer_utterances_than_ranks_repeats_and_counts():
    plan = three_bucket_plan()
    ranks = [MemoryBudgetSampler([1.0], plan, num_replicas=2, rank=r) for r in (0, 1)]
    assert [list(s) for s in ranks] == [[[0]], [[0]]]
    assert ranks[1].num_repeated == 1


def test_resume_mid_epoch_yields_exactly_the_remaining_batches():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    reference = MemoryBudgetSampler(durations, plan, seed=11)
    reference.set_epoch(2)
    full = list(reference)
    first = MemoryBudgetSampler(durations, plan, seed=11)
    first.set_epoch(2)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict()))
    fresh = MemoryBudgetSampler(durations, plan, seed=0)  # the seed comes from the state
    fresh.load_state_dict(state)
    assert head == full[:5]
    assert list(fresh) == full[5:]
    # the loop may have consumed fewer than the sampler yielded (prefetch)
    behind = MemoryBudgetSampler(durations, plan)
    behind.load_state_dict(first.state_dict(batches_consumed=3))
    assert list(behind) == full[3:]
    # after the epoch, the next iteration is the next epoch
    nxt = MemoryBudgetSampler(durations, plan, seed=11)
    nxt.set_epoch(3)
    assert list(fresh) == list(nxt)


def test_lower_limit_splits_the_rest_and_resumes_exactly():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    ranks = [MemoryBudgetSampler(durations, plan, seed=4, num_replicas=2, rank=r) for r in (0, 1)]
    iters = [iter(s) for s in ranks]
    head = [[next(it) for _ in range(3)] for it in iters]
    for s in ranks:
        s.lower_limit(0, 3)
    state = ranks[0].state_dict()
    rest = [list(it) for it in iters]
    for o in rest:
        for b in o:
            if ranks[0].bucket_of(b) == 0:
                assert len(b) <= 3
    for b0, b1 in zip(*rest, strict=True):
        assert ranks[0].bucket_of(b0) == ranks[1].bucket_of(b1)
    flat = [i for r in range(2) for b in head[r] + rest[r] for i in b]
    assert sorted(flat) == list(range(len(durations)))
    resumed = MemoryBudgetSampler(durations, plan, num_replicas=2, rank=1)
    resumed.load_state_dict(state)
    assert list(resumed) == rest[1]
    assert resumed.limit(0) == 3
    with pytest.raises(ConfigError, match="bucket_index=7"):
        resumed.lower_limit(7, 1)
    # lowered before an epoch starts: that epoch is packed under the new limit
    early = MemoryBudgetSampler(durations, plan, seed=4)
    early.lower_limit(0, 4)
    assert max(len(b) for b in early if early.bucket_of(b) == 0) == 4


def test_load_state_rejects_unknown_keys_and_other_datasets():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    sampler = MemoryBudgetSampler(durations, plan)
    state = sampler.state_dict()
    with pytest.raises(ConfigError, match="rng_state"):
        sampler.load_state_dict({**state, "rng_state": 1})
    missing = dict(state)
    del missing["epoch"]
    with pytest.raises(ConfigError, match="epoch"):
        sampler.load_state_dict(missing)
    with pytest.raises(ConfigError, match="num_utterances"):
        MemoryBudgetSampler(durations[:-1], plan).load_state_dict(state)
    with pytest.raises(ConfigError, match="num_replicas"):
        MemoryBudgetSampler(durations, plan, num_replicas=2).load_state_dict(state)


def test_works_as_a_dataloader_batch_sampler_across_epochs():
    plan, durations = three_bucket_plan(), three_bucket_durations()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(len(durations))),
        batch_sampler=MemoryBudgetSampler(durations, plan, seed=2),
    )
    epochs = [[batch[0].tolist() for batch in loader] for _ in range(2)]
    for epoch, got in enumerate(epochs):
        reference = MemoryBudgetSampler(durations, plan, seed=2)
        reference.set_epoch(epoch)
        assert got == list(reference)
    assert len(loader) == len(epochs[1])


class _Recorder(torch.nn.Module):
    """A one-parameter model that records the dataset indices of every batch it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.seen: list[list[int]] = []

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(idx.tolist())
        return {"loss": (self.weight**2).sum()}


@pytest.mark.slow  # importing transformers.Trainer takes seconds; the training itself does not
def test_hugging_face_trainer_trains_on_the_samplers_batches(tmp_path):
    transformers = pytest.importorskip("transformers")
    plan, durations = three_bucket_plan(), three_bucket_durations()
    sampler = MemoryBudgetSampler(durations, plan, seed=9)

    class BudgetTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            return hf_train_dataloader(self, sampler)

    model = _Recorder()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = BudgetTrainer(
        model=model,
        args=args,
        train_dataset=[{"idx": i} for i in range(len(durations))],
        data_collator=lambda rows: {"idx": torch.tensor([r["idx"] for r in rows])},
    )
    trainer.train()
    expected = []
    for epoch in range(2):
        reference = MemoryBudgetSampler(durations, plan, seed=9)
        reference.set_epoch(epoch)
        expected += list(reference)
    assert model.seen == expected
    wrong = MemoryBudgetSampler(durations, plan, num_replicas=2, rank=1)
    with pytest.raises(ConfigError, match="world_size=1"):
        hf_train_dataloader(trainer, wrong)
