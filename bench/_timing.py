"""Predicted vs measured step time of one grid case (shared by the CPU and GPU benchmarks).

:func:`time_case` simulates the case on fake tensors (its :class:`StepCost`), then runs the
real step of ``bench/_grid.py`` (same model, inputs, optimizer and order as the simulator)
``warmup`` times unmeasured and ``steps`` times measured, and returns the median;
:func:`time_cases` alternates the steps of several cases of one architecture, group by
group, in one or more rounds. The
prediction is :func:`asrfit.memory.runtime.step_seconds` on the given rates. The 1-minute
load average is read before and after the timed steps. On the CPU, glibc keeps freed memory
(:func:`asrfit.train.host_allocator.keep_freed_host_memory`), as ``asrfit train`` does there.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass

import _grid
import torch

from asrfit.memory.adapters import hf_adapter
from asrfit.memory.optimizers import make_optimizer
from asrfit.memory.runtime import StepCost, seconds_by_kind, step_seconds
from asrfit.memory.simulate import simulate_step
from asrfit.profiles.rates import DeviceRates
from asrfit.train.host_allocator import keep_freed_host_memory


@dataclass
class Timed:
    """One case's predicted and measured step time."""

    case: _grid.Case
    cost: StepCost
    predicted_seconds: float
    measured_seconds: float
    steps_seconds: list[float]
    load_before: float
    load_after: float
    by_kind: dict[str, float]

    @property
    def error_pct(self) -> float:
        """Signed error of the prediction, percent of the measured median."""
        return 100.0 * (self.predicted_seconds - self.measured_seconds) / self.measured_seconds

    @property
    def fastest_error_pct(self) -> float:
        """Signed error against the fastest measured step (the least disturbed by load)."""
        fastest = min(self.steps_seconds)
        return 100.0 * (self.predicted_seconds - fastest) / fastest

    @property
    def audio_per_second(self) -> float:
        """Measured audio seconds trained per wall second."""
        return self.case.batch_size * self.case.seconds / self.measured_seconds

    @property
    def predicted_audio_per_second(self) -> float:
        """Predicted audio seconds per wall second."""
        return self.case.batch_size * self.case.seconds / self.predicted_seconds


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_cases(
    cases: list[_grid.Case],
    rates: DeviceRates,
    device: str = "cpu",
    warmup: int = 2,
    steps: int = 7,
    rounds: int = 1,
) -> list[Timed]:
    """Simulate each case, then time their real steps (median over rounds of round medians).

    Cases of one architecture form a group whose steps alternate (case 1, 2, 3, 1, 2, 3,
    ...), so that a change of load falls on all of them alike and comparisons between them
    stay fair; each group is timed on its own, after ``warmup`` unmeasured steps, as a
    training run repeats one model (alternating dozens of models leaves every step's
    weights and activations out of the caches: docs/benchmarks.md, the step-time run of
    2026-11-27 01:54). With ``rounds`` > 1 every group is timed again in each round,
    so that a slow minute on a shared machine falls on one of a case's rounds, not on all.
    """
    target = "cuda" if device == "cuda" else "cpu"
    if target == "cpu":
        keep_freed_host_memory()
    sims = [simulate_step(hf_adapter(c.config()), c.batch, c.setup, target=target) for c in cases]
    gc.collect()
    runs = []
    for case in cases:
        model = _grid.build_real_model(case, device)
        optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
        runs.append((model, optimizer))
    groups: dict[str, list[int]] = {}
    for j, case in enumerate(cases):
        groups.setdefault(case.arch, []).append(j)
    load_before = os.getloadavg()[0]
    times: list[list[float]] = [[] for _ in cases]
    medians: list[list[float]] = [[] for _ in cases]
    counter = 0
    for _ in range(rounds):
        for members in groups.values():
            for i in range(warmup + steps):
                for j in members:
                    case, (model, optimizer) = cases[j], runs[j]
                    started = time.perf_counter()
                    _grid._train_step(case, model, optimizer, device, counter + i)
                    _sync(device)
                    if i >= warmup:
                        times[j].append(time.perf_counter() - started)
            for j in members:
                medians[j].append(statistics.median(times[j][-steps:]))
            counter += warmup + steps
    load_after = os.getloadavg()[0]
    del runs
    return [
        Timed(
            case=case,
            cost=sim.cost,
            predicted_seconds=step_seconds(sim.cost, rates),
            measured_seconds=statistics.median(ms),
            steps_seconds=ts,
            load_before=load_before,
            load_after=load_after,
            by_kind=seconds_by_kind(sim.cost, rates),
        )
        for case, sim, ts, ms in zip(cases, sims, times, medians, strict=True)
    ]


def time_case(
    case: _grid.Case, rates: DeviceRates, device: str = "cpu", warmup: int = 2, steps: int = 7
) -> Timed:
    """Simulate ``case`` and time its real step on ``device`` (median of ``steps``)."""
    return time_cases([case], rates, device, warmup, steps)[0]
