"""A length the first fit calls capped is checked by a trace at the cap before it is left
unrefined.

The first fit rests on small batches (``COARSE_BATCHES``). Where most layers are
checkpointed, the peak there may sit where few activations are live (the model states at the
end of backward), and the activations' line only overtakes it at larger batches: XLS-R-1B on
an L4 with 35 of 48 layers checkpointed traced 7.75 / 7.87 GB at batches 1 / 2 and 24.5 s, but
9.98 GB at 4 and 14.18 GB at 8 (``simulate_step``, bf16). A fit on batches 1 and 2 had a
ninth of the real slope, the plan took batch 32 there, and a fresh simulation of that bucket
needed 42.2 GB of 20.5.

Here the traced peak is a closed form with that shape, the larger of two lines in the batch
that cross just above the largest coarse batch, and the largest batch that fits is counted
against it directly.
"""

from __future__ import annotations

import pytest

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape, StepAdapter, StepMemory
from asrfit.plan import costs as costs_module
from asrfit.plan.costs import COARSE_BATCHES, CostEstimator

GB = 10**9
BUDGET = 20 * GB
T_MAX = 400_000
LABELS_PER_STEP = 1e-3


def lines(batch: int, length: int) -> tuple[float, float]:
    """States at the end of backward (7.6 GB, barely growing) and the activations' line (1 GB
    per utterance of ``T_MAX``); they cross at a batch of 4.04 at ``T_MAX``."""
    flat = 7.6 * GB + 0.06 * GB * batch * length / T_MAX
    steep = 3.8 * GB + 1.0 * GB * batch * length / T_MAX
    return flat, steep


def flat_then_steep(batch: int, length: int) -> int:
    """The traced peak: the larger line."""
    return int(max(lines(batch, length)))


def test_the_coarse_batches_peak_on_the_flat_line() -> None:
    """The premise of the tests below, for the planner's coarse batches at every length."""
    for batch in COARSE_BATCHES:
        for length in (T_MAX // 4, T_MAX // 2, T_MAX):
            flat, steep = lines(batch, length)
            assert flat > steep


class ClosedForm(CostEstimator):
    """A cost estimator whose traces return :func:`flat_then_steep` instead of tracing."""

    def __init__(self) -> None:
        adapter = StepAdapter("closed-form", build=None, make_inputs=None, loss=None)
        super().__init__(adapter, "closed-form", 10**9, 16_000)
        self.traced: list[BatchShape] = []

    def trace(self, batch, setup, optimizer_step, forward_backward):  # noqa: ANN001, ANN201
        self.traced.append(batch)
        peak = flat_then_steep(batch.batch_size, batch.input_length)
        return StepMemory(
            model="closed-form",
            setup=setup,
            batch=batch,
            target="cuda",
            peak_bytes=peak,
            peak_raw_bytes=peak,
            breakdown_bytes={},
            step_peaks_bytes=[peak],
            peak_phase="backward",
            phase_peaks_bytes={"backward": peak},
            flops=batch.batch_size * batch.input_length,
        )


def largest_fitting(length: int) -> int:
    """The largest batch whose closed-form peak is within the budget, by counting."""
    batch = 0
    while flat_then_steep(batch + 1, length) <= BUDGET:
        batch += 1
    return batch


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", "off")
    monkeypatch.setattr(costs_module, "trace_workers", lambda: 1)


@pytest.mark.parametrize("cap", [10, 32])
def test_a_capped_length_is_refined_when_the_cap_does_not_fit_twice(cap: int) -> None:
    """Cap 32 does not fit at all; twice 10 does not (``CAP_MARGIN``): both are refined."""
    estimator = ClosedForm()
    fit, _ = estimator._activation_fit(Setup(), T_MAX, LABELS_PER_STEP, BUDGET, cap)
    u = round(T_MAX * LABELS_PER_STEP)
    assert largest_fitting(T_MAX) == 16  # the closed form, counted: below twice the cap
    assert BatchShape(cap, T_MAX, u) in estimator.traced  # the check at the cap
    predicted = fit.max_batch(BUDGET, T_MAX, u)
    assert largest_fitting(T_MAX) - 1 <= predicted <= largest_fitting(T_MAX)


@pytest.mark.parametrize("cap", [5, 6])
def test_a_cap_that_fits_twice_is_checked_once_and_not_refined(cap: int) -> None:
    estimator = ClosedForm()
    fit, _ = estimator._activation_fit(Setup(), T_MAX, LABELS_PER_STEP, BUDGET, cap)
    assert len(estimator.traced) == 5  # four coarse traces and the check at the cap
    for length in (T_MAX // 4, T_MAX // 2, T_MAX):
        u = round(length * LABELS_PER_STEP)
        assert fit.max_batch(BUDGET, length, u) >= cap
        assert flat_then_steep(cap, length) <= BUDGET
        assert fit.predict(cap, length, u) >= flat_then_steep(cap, length)


def test_without_the_check_the_first_fit_would_have_passed_the_cap() -> None:
    """The control: the coarse fit alone allows more than twice the cap of 32 at T_MAX."""
    estimator = ClosedForm()
    fit, _ = estimator._activation_fit(Setup(), T_MAX, LABELS_PER_STEP, None, None)
    assert fit.max_batch(BUDGET, T_MAX, round(T_MAX * LABELS_PER_STEP)) >= 2 * 32
