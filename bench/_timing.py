"""Predicted vs measured step time of one grid case (shared by the CPU and GPU benchmarks).

:func:`time_case` simulates the case on fake tensors (its :class:`StepCost`), then runs the
real step of ``bench/_grid.py`` (same model, inputs, optimizer and order as the simulator)
``warmup`` times unmeasured and ``steps`` times measured, and returns the median;
:func:`time_cases` times several cases one after the other, each on its own, in one or
more rounds. The
prediction is :func:`asrfit.memory.steptime.runtime.step_seconds` on the given rates. The 1-minute
load average is read before and after the timed steps. On the CPU, glibc keeps freed memory
(:func:`asrfit.train.host_allocator.keep_freed_host_memory`), as ``asrfit train`` does there.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.simulate import simulate_step
from asrfit.memory.steptime.runtime import StepCost, seconds_by_kind, step_seconds
from asrfit.memory.trace.optimizers import make_optimizer
from asrfit.profiles.rates import DeviceRates
from asrfit.train.host_allocator import keep_freed_host_memory
from bench import _grid


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


def _time_steps(case: _grid.Case, device: str, warmup: int, steps: int) -> list[float]:
    """Build the case's real model and time ``steps`` steps after ``warmup`` unmeasured."""
    model = _grid.build_real_model(case, device)
    optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
    return timed_steps(case, model, optimizer, device, warmup, steps)


def timed_steps(
    case: _grid.Case,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    device: str,
    warmup: int,
    steps: int,
) -> list[float]:
    """Seconds of ``steps`` real steps of ``model`` after ``warmup`` unmeasured ones.

    On a GPU every step takes one batch made on the device beforehand, as a data loader
    hands it over: making it (``randn`` on the CPU, a copy to the device) is not step time
    (the first GPU run, 2026-11-27, timed it inside the step). On a CPU each step makes its
    batch, as the CPU step-time figures were measured.
    """
    times = []
    batch = _grid.make_real_inputs(case, model.config, device) if device == "cuda" else None
    for i in range(warmup + steps):
        started = time.perf_counter()
        _grid._train_step(case, model, optimizer, device, i, batch)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - started)
    return times


def _time_in_child(case: _grid.Case, warmup: int, steps: int) -> list[float]:
    """:func:`_time_steps` in a forked child process: the model runs in a heap of its own,
    as in a training run, not among the blocks other models' steps left behind."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: time, report through the pipe, exit without cleanup
        os.close(read)
        try:
            payload = {"times": _time_steps(case, "cpu", warmup, steps)}
        except BaseException as err:  # noqa: BLE001  (reported to the parent)
            payload = {"error": f"{type(err).__name__}: {err}"}
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(payload))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        payload = json.loads(answer.read() or '{"error": "the child exited without an answer"}')
    os.waitpid(pid, 0)
    if "error" in payload:
        raise RuntimeError(f"{case.name}: {payload['error']}")
    return payload["times"]


def time_cases(
    cases: list[_grid.Case],
    rates: DeviceRates,
    device: str = "cpu",
    warmup: int = 2,
    steps: int = 7,
    rounds: int = 1,
) -> list[Timed]:
    """Time each case's real steps (median over rounds of round medians), then simulate it.

    Each case is timed on its own, ``warmup`` unmeasured steps and then ``steps`` measured
    ones of the same model, as a training run repeats one model, and on a CPU in a child
    process forked before any case is simulated, that builds only that model, as a
    training run's process holds one:
    alternating the steps of several models leaves each step's weights and activations out
    of the caches (all 54 models alternating: a wavlm case 25.8 ms against 11.8 ms alone,
    docs/benchmarks.md, the step-time run of 2026-11-27 01:54; the 13 cases of one family
    alternating at 03:52: a parakeet-ctc case 21.5 ms against 16.5-17.9 ms alone), and even
    one model at a time in a process that holds all 74 slowed some steps from round to
    round (hubert fp32 sgd 2x5s: 38 ms, then 60 ms with 193 page faults a step; a
    parakeet-ctc 2x5s case 21.7, then 29.2 ms). With ``rounds`` > 1 every case is timed
    again in each round, so that a slow minute on a shared machine falls on one of a case's
    rounds, not on all, and the two cases of a pair are timed seconds apart in every round.
    """
    target = "cuda" if device == "cuda" else "cpu"
    if target == "cpu":
        keep_freed_host_memory()
    load_before = os.getloadavg()[0]
    times: list[list[float]] = [[] for _ in cases]
    medians: list[list[float]] = [[] for _ in cases]
    for _ in range(rounds):
        for j, case in enumerate(cases):
            timed = (
                _time_in_child(case, warmup, steps)
                if device == "cpu"
                else _time_steps(case, device, warmup, steps)
            )
            times[j] += timed
            medians[j].append(statistics.median(timed))
    load_after = os.getloadavg()[0]
    # simulated after the timing: children forked from a process that has run dozens of
    # fake-tensor traces ran their steps 8-15 % slower than in a fresh process (wav2vec2
    # fp32 adamw 2x1.5s: 15.5-15.9 ms against 14.3-14.8), whether or not the traces' objects
    # were freed or frozen first
    sims = [simulate_step(hf_adapter(c.config()), c.batch, c.setup, target=target) for c in cases]
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
