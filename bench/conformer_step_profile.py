"""Where a step of the built-in Conformer goes on this CPU: predicted vs measured, per op.

Run: ``PYTHONPATH=src .venv/bin/python -m bench conformer_step_profile --batch 8 --frames 600``

Simulates one step of conformer-ctc-tiny (fp32 AdamW, padded batch) and prints the
step-time model's prediction by op kind (``asrfit.memory.steptime.runtime.seconds_by_kind``, this
machine's rates at one thread), then times the real step (median of 7 after 3 warm-up) and
lists the real step's largest ``torch.profiler`` self times, grouped by input shape. glibc
keeps freed memory, as in ``asrfit train`` on a CPU (:mod:`asrfit.train.host_allocator`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from asrfit.memory.report import resolve_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from asrfit.memory.steptime.runtime import seconds_by_kind, step_seconds
from asrfit.models.conformer.config import conformer_config
from asrfit.models.conformer.modeling import ConformerForCTC
from asrfit.profiles.host import host_rates
from asrfit.train.host_allocator import keep_freed_host_memory


def conformer_train_step(
    size: str, batch: int, frames: int, labels: int, padded: int
) -> Callable[[], None]:
    """One fp32 AdamW training step of the built-in Conformer-CTC ``size`` (no dropout) on
    random log-mel features, the last utterance's final ``padded`` frames masked."""
    torch.manual_seed(0)
    model = ConformerForCTC(conformer_config(size, dropout=0.0)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    features = torch.randn(batch, frames, 80)
    targets = torch.randint(1, 27, (batch, labels))
    mask = torch.ones(batch, frames, dtype=torch.long)
    mask[-1, frames - padded :] = 0

    def step() -> None:
        model(input_features=features, attention_mask=mask, labels=targets).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    """Print the prediction, the measured step and its largest ops."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=600, help="log-mel frames (100 per s)")
    parser.add_argument("--labels", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_host_memory()  # as asrfit train does on a CPU
    b, t, u = args.batch, args.frames, args.labels
    adapter, _ = resolve_adapter("conformer-ctc-tiny")
    sim = simulate_step(adapter, BatchShape(b, t, u), Setup(optimizer="adamw"), target="cpu")
    rates = host_rates(1)
    by_kind = {k: round(v * 1e3, 1) for k, v in seconds_by_kind(sim.cost, rates).items()}
    print(f"predicted {step_seconds(sim.cost, rates) * 1e3:.1f} ms: {by_kind}")

    step = conformer_train_step("tiny", b, t, u, padded=t // 50)  # as the bundled config
    for _ in range(3):
        step()
    times = []
    for _ in range(7):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    print(f"measured {statistics.median(times) * 1e3:.1f} ms (median of 7)")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    rows = sorted(
        prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total
    )
    for e in rows[:14]:
        print(
            f"{e.self_cpu_time_total / 1e3:7.2f} ms  {e.count:3d}x {e.key}  {e.input_shapes}"[:160]
        )


if __name__ == "__main__":
    main()
