"""The planner's choice of k (checkpoint the first k of L encoder layers).

Reference: every k traced for real and planned (exhaustive search); the planner traces
only k = 1 and the k it picks, predicting the others (asrfit.plan.checkpointing).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from asrfit.memory.cache import model_key
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.models.conformer import conformer_config
from asrfit.plan import search
from asrfit.plan.checkpointing import (
    choose_layers,
    encoder_layers_of,
    no_k_can_win,
    recompute_bound,
)
from asrfit.plan.costs import COARSE_TRACES, CostEstimator
from asrfit.plan.explain import explain_plan
from asrfit.plan.search import plan, plan_buckets
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import HardwareProfile
from asrfit.profiles.host import device_rates
from asrfit.testing import write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
MIB = 2**20
LAYERS = 4


def _config():
    return conformer_config(64, encoder_layers=LAYERS, encoder_attention_heads=2)


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("ASRFIT_CACHE_DIR", str(tmp_path_factory.mktemp("simcache")))
    yield
    mp.undo()


def _evaluator(cap: int):
    """The test model on an L4 at 300 MiB: ``(adapter, hardware, estimator, evaluate)``,
    ``evaluate(setup or costs) -> (costs, bucketing result)`` as the planner's."""
    usable, rate, labels_per_second, edge = 300 * MIB, 100.0, 12.0, 8.0
    adapter = hf_adapter(_config())
    hardware = HardwareProfile.from_name("L4")
    durations = np.linspace(1.0, edge, 50)
    estimator = CostEstimator(adapter, model_key(adapter.name + repr(_config())), 1, 100)

    def evaluate(setup):
        costs = setup
        if isinstance(setup, Setup):
            costs = estimator.costs(
                setup, round(edge * rate), labels_per_second / rate, "ada", usable
            )
        result = plan_buckets(
            costs, hardware, durations, usable, rate, labels_per_second, edge, cap, 1000
        )
        return costs, result

    return adapter, hardware, estimator, evaluate


def test_chosen_k_is_the_fastest_of_an_exhaustive_traced_search() -> None:
    cap = 512
    adapter, hardware, estimator, evaluate = _evaluator(cap)

    base = Setup(precision="bf16", optimizer="adamw")
    assert encoder_layers_of(adapter) == LAYERS
    choice = choose_layers(
        base, evaluate(base), evaluate, LAYERS, device_rates(hardware), batch_cap=cap
    )
    assert choice is not None
    traced = {k: evaluate(replace(base, checkpoint_layers=k))[1][1] for k in range(LAYERS + 1)}
    best = max(traced.values())
    assert traced[choice.k] >= 0.995 * best, (choice.k, traced)
    # here memory limits every batch: checkpointing some layers beats none and all of them
    assert 0 < choice.k < LAYERS and traced[choice.k] > max(traced[0], traced[LAYERS])
    # the planner's figure for its pick is a trace's, not an interpolation's
    assert choice.predicted[choice.k] == pytest.approx(traced[choice.k])
    assert f"first {choice.k} of {LAYERS} encoder layers" in choice.reason()


def test_picks_are_traced_only_while_predicted_faster_than_the_fastest_setup_planned() -> None:
    """A pick is traced to find a k faster than everything else; one predicted no faster than
    a setup already planned from traces (the rival) cannot become the plan by the predictions.
    With a rival above every prediction only k = 1 (the predictions' anchor) is traced and
    it is the choice; the exhaustive search (no bound) ignores the rival and traces its
    picks as without one."""
    cap = 512
    _, hardware, _, evaluate = _evaluator(cap)
    base = Setup(precision="bf16", optimizer="adamw")
    off, rates = evaluate(base), device_rates(hardware)

    def choose(**kwargs):
        seen: list[int] = []

        def recording(setup):
            if isinstance(setup, Setup) and setup.checkpoint_layers:
                seen.append(setup.checkpoint_layers)
            return evaluate(setup)

        choice = choose_layers(base, off, recording, LAYERS, rates, batch_cap=cap, **kwargs)
        return choice, seen

    free, free_seen = choose()
    assert free is not None and free.k > 1 and free_seen[0] == 1 and free.k in free_seen
    beaten, beaten_seen = choose(rival=1e12)
    assert beaten_seen == [1] and beaten is not None and beaten.k == 1
    # the rival plans faster than every prediction, so no prediction was worth a trace
    assert max(beaten.predicted.values()) < 1e12
    exhaustive, exhaustive_seen = choose(rival=1e12, bound=False)
    assert exhaustive_seen == free_seen and exhaustive.k == free.k


@pytest.mark.parametrize(("cap", "prunes"), [(512, False), (32, True)])
def test_a_bound_leaves_k_untraced_only_where_no_traced_k_beats_none(
    cap: int, prunes: bool, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference: every k traced and planned. At a batch cap of 32 the setup without
    checkpointing is held below the cap only in the longest buckets, and one layer's recompute
    costs more than those batches give: the bound says so and choose_layers traces no k. At
    512 some k is faster: the bound must not prune."""
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))  # count every trace
    _, hardware, estimator, evaluate = _evaluator(cap)

    base = Setup(precision="bf16", optimizer="adamw")
    off, full = evaluate(base), evaluate(replace(base, gradient_checkpointing=True))
    rates = device_rates(hardware)
    assert any(b.batch_size < cap for b in off[1][0])  # memory limits some bucket
    before = estimator.simulations
    assert no_k_can_win(off, full, LAYERS, evaluate, rates) is prunes
    choice = choose_layers(base, off, evaluate, LAYERS, rates, batch_cap=cap)
    traced_here = estimator.simulations - before
    traced = {k: evaluate(replace(base, checkpoint_layers=k))[1][1] for k in range(1, LAYERS + 1)}
    if prunes:
        assert choice is None and traced_here == 0
        assert max(traced.values()) < off[1][1]
    else:
        assert choice is not None and traced_here > 0
        assert max(traced.values()) > off[1][1]


@pytest.mark.parametrize("cap", [512, 32])
def test_the_recompute_bound_holds_only_where_no_traced_checkpointing_beats_none(
    cap: int, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference: every k and every layer checkpointed, traced and planned. The bound (for k
    layers none's step plus k recomputes and its peak less what they leave live, all marked in
    the traces of none) may hold only where none of them plans faster than none; where it
    holds, choose_layers traces nothing. At a cap of 512 memory limits every bucket and some k
    is faster."""
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(tmp_path))  # count every trace
    _, hardware, estimator, evaluate = _evaluator(cap)
    base = Setup(precision="bf16", optimizer="adamw")
    off, rates = evaluate(base), device_rates(hardware)
    marks = off[0].layer_points
    assert len(marks) == len(off[0].time_points) > 0
    assert all(len(costs) == len(left) == LAYERS for *_, costs, left in marks)
    before = estimator.simulations
    holds = recompute_bound(off, evaluate, rates, LAYERS)
    choice = choose_layers(base, off, evaluate, LAYERS, rates, batch_cap=cap)
    traced_here = estimator.simulations - before
    every = evaluate(replace(base, gradient_checkpointing=True))[1][1]
    traced = {k: evaluate(replace(base, checkpoint_layers=k))[1][1] for k in range(1, LAYERS + 1)}
    best = max(every, *traced.values())
    if holds:  # sound: nothing checkpointed plans faster than none, and nothing is traced
        assert best <= off[1][1] and choice is None and traced_here == 0
    if cap == 512:
        assert not holds and best > off[1][1]
    else:  # one layer's recompute costs more than the few batches memory holds back
        assert holds


def test_plan_uses_partial_checkpointing_and_says_why(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": d, "text": "ab " * int(4 * d)}
        for i, d in enumerate(np.linspace(1.0, 8.0, 40))
    ]
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "train.jsonl", rows))
    # a budget where the planner's own choice of optimizer (8-bit AdamW, less state than
    # the AdamW of the test above) still leaves no-checkpointing batches small: 3 of 4 layers
    # predicted 5.4 % faster than none at 180 MiB (3,666.0 against 3,477.2 audio s/s), and
    # partial checkpointing chosen at every budget tried from 160 to 300 MiB (expandable
    # segments' pages as a bound; with classic segments fitted, none was faster from 200 MiB)
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: 180 * MIB))
    p = plan(HardwareProfile.from_name("L4"), dataset, _config(), target_effective_batch=512)
    k = p.setup.checkpoint_layers
    assert 0 < k < LAYERS and f"+ckpt{k} " in p.setup.describe()
    chosen = dict(explain_plan(p))["Chosen"]
    assert f"first {k} of {LAYERS} encoder layers" in chosen and "with none" in chosen


def test_the_search_anchors_the_choice_on_its_refined_fits(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the search has refined the every-layer setup before choosing k, the choice's
    predictions rest on that refined fit (coarse fits are optimistic on memory, and the
    exhaustive search anchors on the refined fit too), and its rival is the fastest setup
    the search has planned: the every-layer setup's own throughput at least."""
    rows = [
        {"audio_filepath": f"{i}.wav", "duration": d, "text": "ab " * int(4 * d)}
        for i, d in enumerate(np.linspace(1.0, 8.0, 40))
    ]
    dataset = DatasetProfile.from_manifest(write_manifest(tmp_path / "train.jsonl", rows))
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: 180 * MIB))
    seen: dict = {}

    def spy(base, off, evaluate, layers, rates, batch_cap=None, bound=True, rival=0.0):
        seen["full"] = evaluate(replace(base, gradient_checkpointing=True))
        seen["rival"] = rival
        return choose_layers(base, off, evaluate, layers, rates, batch_cap, bound, rival)

    monkeypatch.setattr(search, "choose_layers", spy)
    plan(HardwareProfile.from_name("L4"), dataset, _config(), target_effective_batch=512)
    costs, result = seen["full"]
    assert costs.setup.gradient_checkpointing and result is not None
    # refined: traced beyond the coarse shapes, at the batches near the budget
    assert len(costs.time_points) > COARSE_TRACES
    assert seen["rival"] >= result[1] > 0
