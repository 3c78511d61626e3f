"""Screening: the planner refines only the setups in contention, and plans as the exhaustive search.

The exhaustive search refines every setup's fit (``plan(..., exhaustive=True)``); the
default screens on coarse traces first (:mod:`asrfit.plan.screen`). Each counts the distinct
simulations it needs. Bucket limits are then checked with fresh
full (two-step) simulations at the plan's setup, not with the fit the planner used.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asrfit.memory.cuda.allocator import predict_cuda
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.plan import costs as costs_module
from asrfit.plan.search import plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.testing import write_manifest
from tests.test_plan import MIB, _tiny_config

CASES = {  # (usable bytes, planner keyword arguments)
    "memory bound": (1200 * MIB, {"target_hours": 10.0}),
    "batch capped": (1200 * MIB, {"target_effective_batch": 16}),
    "capped short": (1200 * MIB, {"target_effective_batch": 8}),
    "capped everywhere": (6000 * MIB, {"target_effective_batch": 4}),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DatasetProfile:
    folder = tmp_path_factory.mktemp("data")
    durations = [1.0 + 0.25 * i for i in range(40)]  # 1 .. 10.75 s
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": d, "text": "ab " * int(4 * d)}
        for i, d in enumerate(durations)
    ]
    return DatasetProfile.from_manifest(write_manifest(folder / "train.jsonl", rows))


def _planned(
    monkeypatch: pytest.MonkeyPatch,
    dataset: DatasetProfile,
    case: str,
    exhaustive: bool,
    cache: Path | None = None,
):
    """The plan and the distinct simulations it needed (computed, or found in ``cache``)."""
    usable, kwargs = CASES[case]
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(cache) if cache is not None else "off")
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: usable))
    keys: set[str] = set()
    real = costs_module.cached

    def counting(key, compute):  # noqa: ANN001, ANN202
        keys.add(key)
        return real(key, compute)

    monkeypatch.setattr(costs_module, "cached", counting)
    hardware = HardwareProfile.from_name("L4")
    p = plan(hardware, dataset, _tiny_config(), exhaustive=exhaustive, **kwargs)
    return p, len(keys), usable


@pytest.mark.parametrize("case", sorted(CASES))
def test_screened_plan_is_the_exhaustive_plan_with_fewer_traces(
    case: str, monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile, tmp_path: Path
) -> None:
    # the exhaustive search reuses the screened search's traces (one cache) but counts every
    # simulation it needs
    fast, fast_traces, _ = _planned(monkeypatch, dataset, case, False, tmp_path)
    full, full_traces, _ = _planned(monkeypatch, dataset, case, True, tmp_path)
    assert fast.setup == full.setup
    assert [(b.max_seconds, b.batch_size) for b in fast.buckets] == [
        (b.max_seconds, b.batch_size) for b in full.buckets
    ]
    assert fast_traces < full_traces


def test_limits_checked_by_fresh_full_simulations(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    """The longest bucket's limit fits a fresh two-step simulation; one more does not."""
    p, _, usable = _planned(monkeypatch, dataset, "memory bound", False, None)
    adapter = hf_adapter(_tiny_config())
    last = p.buckets[-1]

    def reserved(batch: int) -> int:
        step = simulate_step(
            adapter, BatchShape(batch, last.max_input_length, last.max_label_length), p.setup
        )
        return predict_cuda(
            step.peak_bytes, step.peak_bytes, architecture=p.architecture
        ).reserved_bytes

    assert reserved(last.batch_size) <= usable
    assert reserved(last.batch_size + 1) > usable


def test_capped_limits_checked_by_fresh_full_simulations(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile
) -> None:
    """With a batch cap: the longest bucket at the cap fits it in a fresh two-step simulation,
    and the longest bucket fits its memory-bound limit and not one more."""
    p, _, usable = _planned(monkeypatch, dataset, "batch capped", False, None)
    adapter = hf_adapter(_tiny_config())
    capped = [b for b in p.buckets if b.batch_size == 16]
    last = p.buckets[-1]
    assert capped and last.batch_size < 16

    def reserved(bucket, batch: int) -> int:  # noqa: ANN001
        shape = BatchShape(batch, bucket.max_input_length, bucket.max_label_length)
        step = simulate_step(adapter, shape, p.setup)
        return predict_cuda(
            step.peak_bytes, step.peak_bytes, architecture=p.architecture
        ).reserved_bytes

    assert reserved(capped[-1], 16) <= usable
    assert reserved(last, last.batch_size) <= usable
    assert reserved(last, last.batch_size + 1) > usable


def test_the_winner_is_fitted_on_the_exhaustive_searchs_traces_where_the_cap_binds(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile, tmp_path: Path
) -> None:
    """Where the target caps the batch at short lengths, the winner's fit is still refined
    there, on the same traces as the exhaustive search's: those near-budget points shape the
    fit at the lengths where memory sets the limit, so leaving them out plans other limits
    (parakeet-tdt-0.6b-v3 on an L4 planned one utterance more than a fresh simulation fits)."""
    traced: list[tuple[Setup, BatchShape]] = []
    real = costs_module.CostEstimator._simulate

    def spy(self, batch, setup, what, optimizer_step=True, forward_backward=True):  # noqa: ANN001, ANN202
        if what == "activations":  # a fit's points (not companions traced for their tapes)
            traced.append((setup, batch))
        return real(self, batch, setup, what, optimizer_step, forward_backward)

    monkeypatch.setattr(costs_module.CostEstimator, "_simulate", spy)
    fast, _, _ = _planned(monkeypatch, dataset, "capped short", False, tmp_path)
    fast_traced, traced[:] = list(traced), []
    _planned(monkeypatch, dataset, "capped short", True, tmp_path)  # its traces only
    cap = CASES["capped short"][1]["target_effective_batch"]
    assert fast.buckets[0].batch_size == cap and fast.buckets[-1].batch_size < cap
    base = costs_module._activation_base(fast.setup)
    shapes = {b for s, b in fast_traced if s == base}
    assert shapes == {b for s, b in traced if s == base}
    assert max(b.batch_size for b in shapes) >= 2 * cap  # refined where twice the cap fits


def test_checkpointing_untraced_where_its_twin_holds_the_cap_everywhere(
    monkeypatch: pytest.MonkeyPatch, dataset: DatasetProfile, tmp_path: Path
) -> None:
    """Without checkpointing every bucket takes the cap: no checkpointed setup is traced, not
    even coarsely, and the plan is the exhaustive search's (which traces them all; the case
    is in the parametrised comparison above)."""
    traced: list[Setup] = []
    real = costs_module.CostEstimator._simulate

    def spy(self, batch, setup, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        traced.append(setup)
        return real(self, batch, setup, *args, **kwargs)

    monkeypatch.setattr(costs_module.CostEstimator, "_simulate", spy)
    fast, _, _ = _planned(monkeypatch, dataset, "capped everywhere", False, tmp_path)
    assert all(b.batch_size == 4 for b in fast.buckets), str([b.batch_size for b in fast.buckets])
    assert traced and not any(s.gradient_checkpointing or s.checkpoint_layers for s in traced)
    traced.clear()
    full, _, _ = _planned(monkeypatch, dataset, "capped everywhere", True, tmp_path)
    assert any(s.gradient_checkpointing for s in traced)  # the reference did trace them
    assert full.setup == fast.setup
