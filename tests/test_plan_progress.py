"""Planning progress: one rewritten stderr line on a terminal, nothing otherwise."""

from __future__ import annotations

import io

import pytest

from asrfit.memory.setup import Setup
from asrfit.memory.step import BatchShape
from asrfit.plan import costs as costs_module
from asrfit.plan.progress import TraceProgress
from asrfit.plan.search import plan
from asrfit.profiles.hardware import HardwareProfile
from tests.test_plan import MIB, _tiny_config
from tests.test_plan_screen import dataset  # noqa: F401  (fixture)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_unless_enabled_on_a_terminal() -> None:
    assert TraceProgress.for_terminal(stream=io.StringIO()) is None  # a pipe or file
    assert TraceProgress.for_terminal(enabled=False, stream=_Terminal()) is None  # --json
    assert isinstance(TraceProgress.for_terminal(stream=_Terminal()), TraceProgress)


def test_line_names_the_simulation_and_what_remains() -> None:
    out = _Terminal()
    progress = TraceProgress(out, frames_per_second=16000)
    progress.expect(5)
    progress.started(BatchShape(8, 32000, 20), Setup(precision="bf16"), "activations")
    progress.skip(3)
    progress.started(BatchShape(1, 16000, 1), Setup(gradient_checkpointing=True), "adamw state")
    progress.close()
    text = out.getvalue()
    assert "simulation 1 (at most 4 more): activations, bf16, batch 8 x 2.0 s" in text
    assert "simulation 2 (at most 0 more): adamw state, fp32+ckpt, batch 1 x 1.0 s" in text
    assert text.endswith("\r") and "\n" not in text


def test_plan_counts_every_new_simulation(
    monkeypatch: pytest.MonkeyPatch,
    dataset,  # noqa: ANN001, F811
) -> None:
    monkeypatch.setenv("ASRFIT_CACHE_DIR", "off")
    # every trace in this process, where the counter below sees it (trace workers are forked:
    # tests/test_plan_parallel.py checks that they change neither the count nor the plan)
    monkeypatch.setenv("ASRFIT_TRACE_WORKERS", "1")
    monkeypatch.setattr(HardwareProfile, "usable_bytes", property(lambda self: 1200 * MIB))
    out = _Terminal()
    seen: list[tuple[int, int]] = []
    progress = TraceProgress(out)
    real = progress.started

    def started(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        real(*args, **kwargs)
        seen.append((progress.done, progress.bound))

    monkeypatch.setattr(progress, "started", started)
    traced: list[BatchShape] = []
    for name in ("simulate_step", "scaled_step"):  # a simulation is one or the other
        simulate = getattr(costs_module, name)
        monkeypatch.setattr(
            costs_module,
            name,
            lambda adapter, batch, *a, _f=simulate, **k: (
                traced.append(batch) or _f(adapter, batch, *a, **k)
            ),
        )
    plan(HardwareProfile.from_name("L4"), dataset, _tiny_config(), progress=progress)
    assert len(seen) == len(traced) > 0  # each simulation shown once
    assert [d for d, _ in seen] == list(range(1, len(seen) + 1))
    bounds = [b for _, b in seen]
    assert all(done <= bound for done, bound in seen)
    assert bounds == sorted(bounds, reverse=True)  # "at most" never grows within a pass
    assert out.getvalue().endswith("\r")
