"""CPU convolution scratch: measured inside single real convolutions, beside asrfit's rules.

Run: ``PYTHONPATH=src .venv/bin/python -m bench cpu_conv_scratch [--threads N]``

Each row runs one convolution (forward, then backward for the input and the weight) on
real CPU tensors under ``torch.profiler`` with memory events, and reports the bytes the
kernel holds beyond what it returns (peak inside the op minus the bytes it leaves
allocated), next to :mod:`asrfit.memory.trace.scratch`'s rule for the same op. This is the
evidence behind those rules; the accuracy grid (``bench/memory_accuracy.py``) checks them
in whole training steps.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
from torch.autograd import DeviceType

from asrfit.memory.trace.scratch import CPU_SCRATCH

aten = torch.ops.aten

# (batch, in channels, out channels, kernel, stride, length, groups); 1-D unless a 2-D size.
SHAPES: list[tuple[int, int, int, int, int, int | tuple[int, int], int]] = [
    (3, 1, 32, 10, 5, 32000, 1),  # wav2vec2's first feature-encoder conv
    (3, 32, 32, 3, 2, 6399, 1),
    (2, 64, 128, 3, 1, 5000, 1),
    (2, 128, 64, 3, 1, 5000, 1),
    (2, 256, 256, 3, 1, 2000, 1),
    (3, 64, 64, 16, 1, 99, 4),  # wav2vec2's grouped positional conv
    (2, 256, 256, 31, 1, 2000, 256),  # conformer depthwise conv
    (3, 1, 32, 3, 2, (200, 80), 1),  # conv subsampling, 2-D
    (3, 32, 32, 3, 2, (100, 40), 32),  # depthwise 2-D
]


def measured_scratch(fn: Callable[[], object], op_name: str) -> int:
    """Bytes held inside the first ``op_name`` call of ``fn`` beyond those it leaves allocated."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        fn()
    events = list(prof.profiler.kineto_results.events())
    memory = sorted(
        (e.start_ns(), e.nbytes())
        for e in events
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    )
    times = np.array([m[0] for m in memory])
    live = np.cumsum([m[1] for m in memory])
    op = next(e for e in events if e.name() == op_name)
    i0 = np.searchsorted(times, op.start_ns(), "left")
    i1 = np.searchsorted(times, op.end_ns(), "right")
    return int(live[i0:i1].max() - live[i1 - 1]) if i1 > i0 else 0


def row(shape: tuple, dtype: torch.dtype) -> str:
    batch, c_in, c_out, kernel, stride, length, groups = shape
    two_d = isinstance(length, tuple)
    size = (batch, c_in, *length) if two_d else (batch, c_in, length)
    conv = torch.nn.functional.conv2d if two_d else torch.nn.functional.conv1d
    x = torch.randn(size, dtype=dtype, requires_grad=True)
    w = torch.randn(c_out, c_in // groups, *([kernel] * (2 if two_d else 1)), dtype=dtype)
    w.requires_grad_(True)
    pad = kernel // 2

    def forward() -> torch.Tensor:
        return conv(x, w, stride=stride, padding=pad, groups=groups)

    out = forward()
    grad = torch.randn_like(out)
    fwd = measured_scratch(forward, "aten::convolution")
    bwd = measured_scratch(
        lambda: torch.autograd.grad(out, [x, w], grad), "aten::convolution_backward"
    )
    nd = 2 if two_d else 1
    args = (
        grad,
        x.detach(),
        w.detach(),
        None,
        [stride] * nd,
        [pad] * nd,
        [1] * nd,
        False,
        [0] * nd,
        groups,
        [True, True, False],
    )
    rule_fwd = CPU_SCRATCH[aten.convolution.default]((x.detach(), w.detach()), {}, out.detach())
    rule_bwd = CPU_SCRATCH[aten.convolution_backward.default](args, {}, None)
    name = str(dtype).replace("torch.", "")
    return (
        f"| {shape} | {name} | {fwd:,} | {rule_fwd:,} | {bwd:,} | {rule_bwd:,} | "
        f"{(rule_bwd - bwd) / max(bwd, 1):+.0%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as is)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        "| (B, C_in, C_out, K, stride, T, groups) | dtype | forward measured B | forward rule B "
        "| backward measured B | backward rule B | backward rule error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        for shape in SHAPES:
            print(row(shape, dtype), flush=True)


if __name__ == "__main__":
    main()
