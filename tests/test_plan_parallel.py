"""Simulations side by side: forked trace workers give the plan and the simulations of one process.

Reference: the same plan made with ``ASRFIT_TRACE_WORKERS=1`` (every trace in the planning
process, the code path before workers existed), compared field by field, and the cache
entries both runs write compared byte for byte except the trace's own wall time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from asrfit.errors import ConfigError
from asrfit.plan import costs as costs_module
from asrfit.plan.parallel import MAX_TRACE_WORKERS, map_forked, trace_workers
from asrfit.plan.search import plan
from asrfit.profiles.hardware import HardwareProfile
from tests.test_plan import MIB, _tiny_config
from tests.test_plan_screen import dataset  # noqa: F401  (fixture)

FORKS = hasattr(os, "fork") and sys.platform.startswith("linux")
needs_fork = pytest.mark.skipif(not FORKS, reason="trace workers are forked: Linux only")


def _save(value: object, path: Path) -> None:
    path.write_text(json.dumps(value))


def _load(path: Path) -> object:
    return json.loads(path.read_text())


def _no_children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@needs_fork
def test_map_forked_keeps_order_and_runs_jobs_in_other_processes() -> None:
    parent = os.getpid()

    def job(i: int) -> list[int]:
        time.sleep(0.05)  # long enough for every worker to take jobs
        return [i, i * i, os.getpid()]

    jobs = [lambda i=i: job(i) for i in range(9)]
    results = map_forked(jobs, 3, _save, _load)
    assert [r[:2] for r in results] == [[i, i * i] for i in range(9)]
    pids = {r[2] for r in results}
    assert parent in pids and len(pids) == 3  # this process and two children
    assert _no_children_left()


@needs_fork
def test_a_failed_child_job_comes_back_as_none_for_the_caller_to_compute() -> None:
    parent = os.getpid()

    def job(i: int) -> list[int]:
        time.sleep(0.05)
        if os.getpid() != parent:
            raise RuntimeError("traced wrong")
        return [i]

    results = map_forked([lambda i=i: job(i) for i in range(6)], 3, _save, _load)
    # each child fails on the first job it takes and takes no other: this process runs the rest
    assert sum(r is None for r in results) == 2
    assert all(r is None or r == [i] for i, r in enumerate(results))
    assert _no_children_left()


@needs_fork
def test_a_failure_in_the_parents_share_is_raised_after_the_children_are_reaped() -> None:
    parent = os.getpid()

    def job() -> list[int]:
        time.sleep(0.05)
        if os.getpid() == parent:
            raise ValueError("parent's own job")
        return [1]

    with pytest.raises(ValueError, match="parent's own job"):
        map_forked([job] * 4, 2, _save, _load)
    assert _no_children_left()


def test_one_worker_runs_everything_here() -> None:
    parent = os.getpid()
    assert map_forked([lambda: os.getpid()] * 3, 1, _save, _load) == [parent] * 3


def test_trace_workers_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASRFIT_TRACE_WORKERS", "1")
    assert trace_workers() == 1
    monkeypatch.setenv("ASRFIT_TRACE_WORKERS", "3")
    assert trace_workers() == (3 if FORKS else 1)
    for bad in ("0", "-2", "two"):
        monkeypatch.setenv("ASRFIT_TRACE_WORKERS", bad)
        with pytest.raises(ConfigError, match="ASRFIT_TRACE_WORKERS"):
            trace_workers()
    monkeypatch.delenv("ASRFIT_TRACE_WORKERS")
    assert 1 <= trace_workers() <= MAX_TRACE_WORKERS


def _plan_with(
    workers: int, cache: Path, monkeypatch: pytest.MonkeyPatch, profile: object
) -> tuple[object, int, dict[str, dict]]:
    monkeypatch.setenv("ASRFIT_TRACE_WORKERS", str(workers))
    monkeypatch.setenv("ASRFIT_CACHE_DIR", str(cache))
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: 1200 * MIB))
    made: list[costs_module.CostEstimator] = []
    real_init = costs_module.CostEstimator.__init__

    def init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(costs_module.CostEstimator, "__init__", init)
    p = plan(HardwareProfile.from_name("L4"), profile, _tiny_config(), target_hours=10.0)
    entries = {}
    for path in sorted(cache.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            data.pop("trace_seconds", None)  # the trace's own wall time
        entries[path.name] = data
    return p, sum(e.simulations for e in made), entries


@needs_fork
@pytest.mark.slow
def test_a_plan_with_trace_workers_is_the_plan_of_one_process(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    dataset,  # noqa: ANN001, F811
) -> None:
    serial, serial_count, serial_entries = _plan_with(1, tmp_path / "one", monkeypatch, dataset)
    parallel, parallel_count, parallel_entries = _plan_with(
        2, tmp_path / "two", monkeypatch, dataset
    )
    plans = [parallel.to_dict(), serial.to_dict()]
    for d in plans:  # host RAM is read afresh by each plan and quoted in the data reasons
        d["data"].pop("reasons")
    assert plans[0] == plans[1]
    assert parallel_count == serial_count > 0  # each simulation counted once, wherever it ran
    assert parallel_entries == serial_entries  # the same simulations, to the byte
