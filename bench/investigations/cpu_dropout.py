"""The built-in Conformer's CPU training step with PyTorch's dropout vs asrfit's fast mask.

Question (2026-11-27): How much faster is the built-in Conformer's CPU training step with
asrfit's dropout mask (16 random bits per element, attention with dropout on the same masks)
than with PyTorch's (``bernoulli_``, SDPA's math path)?

Answer: 1.15x: conformer-ctc-small, batch 8 x 500 frames, 2 threads, 334 ms against 384 ms a
step; one mask of 0.5 M elements 1.84 ms against 4.21 ms (docs/benchmarks.md, "CPU dropout").
The fast mask is asrfit's CPU dropout since; ``bench/cpu_step_kernels.py`` measures the later
CPU kernel choices.

Run: ``PYTHONPATH=src .venv/bin/python -m bench investigations.cpu_dropout --out docs/benchmarks.md``

One process, one model (conformer-ctc-small, dropout 0.1, 64-channel subsampling, 80 mel
bins), one fp32 AdamW training step on random log-mel features, timed
with PyTorch's kernels (``asrfit.models.dropout.host_kernels(False)``: ``bernoulli_`` for each
mask, SDPA's math path for attention with dropout) and with the fast path, alternating
round by round (warm-up steps first in each round); the table gives each round's median and
the median over rounds. Also the mask alone for one (8, 125, 512) activation, both ways.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from asrfit.models import dropout as D
from asrfit.models.conformer.config import conformer_config
from asrfit.models.conformer.modeling import ConformerForCTC
from asrfit.train.host_allocator import keep_freed_host_memory
from bench._report import write_section

COMMAND = (
    "PYTHONPATH=src .venv/bin/python -m bench investigations.cpu_dropout --out docs/benchmarks.md"
)


def _median_ms(fn: Callable[[], object], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    """Time both ways and print (or write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--frames", type=int, default=500, help="log-mel frames (100 per s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_host_memory()  # as asrfit train does on a CPU
    torch.manual_seed(0)
    model = ConformerForCTC(conformer_config("small", subsampling_conv_channels=64)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, t = args.batch, args.frames
    features = torch.randn(b, t, 80)
    targets = torch.randint(1, 27, (b, t // 7))
    mask = torch.ones(b, t, dtype=torch.long)

    def step() -> None:
        model(input_features=features, attention_mask=mask, labels=targets).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    activation = torch.randn(b, t // 4, 512)
    ways = {"PyTorch (bernoulli_, SDPA math path)": False, "asrfit fast mask": True}
    rounds: dict[str, list[float]] = {w: [] for w in ways}
    masks: dict[str, list[float]] = {w: [] for w in ways}
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for way, fast in ways.items():
            with D.host_kernels(fast):
                rounds[way].append(_median_ms(step, args.steps, 2))
                masks[way].append(
                    _median_ms(lambda: D.dropout(activation, 0.1), 20, 3)
                    if fast
                    else _median_ms(lambda: F.dropout(activation, 0.1, True), 20, 3)
                )
    load_after = os.getloadavg()[0]
    med = {w: statistics.median(v) for w, v in rounds.items()}
    mask_med = {w: statistics.median(v) for w, v in masks.items()}
    slow, fast = med[list(ways)[0]], med[list(ways)[1]]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## CPU dropout: the built-in Conformer's step with PyTorch's masks vs asrfit's",
        "",
        f"Command: `{COMMAND}`",
        "",
        f"Run {when}, conformer-ctc-small (dropout 0.1, 64-channel subsampling), fp32 AdamW, "
        f"batch {b} x {t} frames, {args.threads} threads, one process, the two ways alternating "
        f"over {args.rounds} rounds of {args.steps} timed steps (2 warm-up); 1-minute load "
        f"{load_before:.1f} before, {load_after:.1f} after. Mask: dropout of one "
        f"({b}, {t // 4}, 512) float32 activation, p = 0.1.",
        "",
        "| dropout | step, round medians ms | step, median ms | one mask + multiply, median ms |",
        "|---|---|---:|---:|",
    ]
    for way in ways:
        lines.append(
            f"| {way} | {', '.join(f'{x:.0f}' for x in rounds[way])} | {med[way]:.0f} "
            f"| {mask_med[way]:.2f} |"
        )
    lines += ["", f"Step with PyTorch's dropout / step with the fast mask: **{slow / fast:.2f}x**."]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        write_section(args.out, "cpu-dropout", text)


if __name__ == "__main__":
    main()
