"""Where one step-time grid case goes: predicted seconds by op kind against the profiled step.

Run: ``PYTHONPATH=src .venv/bin/python -m bench step_kinds whisper bf16 0 sgd 2 2 12``
(arguments: family, precision, checkpointing 0/1, optimizer, batch, seconds, labels, as a
case of ``bench/_grid.py``).

Simulates the case (``target="cpu"``) and prices it on this machine's rates at one thread
(:func:`asrfit.memory.steptime.runtime.seconds_by_kind`), then builds the real model, runs 3 steps
unmeasured and 9 measured alone (one model repeated, as in training; glibc keeps freed
memory as ``asrfit train`` does on a CPU) and prints the median and fastest, and one more
step under ``torch.profiler``: the self time of its aten ops summed by the kind
:func:`asrfit.memory.steptime.runtime.op_kind` gives them, beside the predicted seconds and calls of
that kind. The profiled kinds count composite and view ops the trace leaves out (their
calls are higher), and the profiler adds its own overhead: read the columns side by side
for a kind whose time is several times off, not for a few percent.
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.simulate import simulate_step
from asrfit.memory.steptime.runtime import op_kind, seconds_by_kind, step_seconds
from asrfit.memory.trace.optimizers import make_optimizer
from asrfit.profiles.host import host_rates
from asrfit.train.host_allocator import keep_freed_host_memory
from bench import _grid
from bench._timing import timed_steps


def main() -> None:
    """Print predicted and profiled seconds by kind for one case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch")
    parser.add_argument("precision", choices=("fp32", "bf16"))
    parser.add_argument("checkpointing", type=int, choices=(0, 1))
    parser.add_argument("optimizer")
    parser.add_argument("batch", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("labels", type=int)
    a = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_host_memory()
    case = _grid.Case(
        a.arch, a.precision, bool(a.checkpointing), a.optimizer, a.batch, a.seconds, a.labels
    )
    rates = host_rates(1)
    sim = simulate_step(hf_adapter(case.config()), case.batch, case.setup, target="cpu")
    predicted = seconds_by_kind(sim.cost, rates)
    calls: collections.Counter = collections.Counter()
    for row in sim.cost.rows:
        calls[row[1]] += row[6]
    model = _grid.build_real_model(case, "cpu")
    optimizer = make_optimizer(case.setup, [p for p in model.parameters() if p.requires_grad])
    times = timed_steps(case, model, optimizer, "cpu", warmup=3, steps=9)
    print(
        f"{case.name}: predicted {step_seconds(sim.cost, rates) * 1e3:.1f} ms, measured "
        f"{statistics.median(times) * 1e3:.1f} ms (median of 9), fastest {min(times) * 1e3:.1f} ms"
    )
    profiled: dict[str, float] = collections.defaultdict(float)
    profiled_calls: collections.Counter = collections.Counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _grid._train_step(case, model, optimizer, "cpu", 12)
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            kind = op_kind(event.key.removeprefix("aten::"))
            profiled[kind] += event.self_cpu_time_total / 1e3
            profiled_calls[kind] += event.count
    print(f"{'kind':12s} {'profiled ms':>12s} {'calls':>6s} {'predicted ms':>13s} {'calls':>6s}")
    for kind in sorted(set(profiled) | set(predicted), key=lambda k: -profiled.get(k, 0.0)):
        print(
            f"{kind:12s} {profiled.get(kind, 0.0):12.2f} {profiled_calls.get(kind, 0):6d} "
            f"{predicted.get(kind, 0.0) * 1e3:13.2f} {calls.get(kind, 0):6d}"
        )


if __name__ == "__main__":
    main()
