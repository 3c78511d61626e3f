"""Checks, on a CUDA GPU, of each thing a CUDA prediction adds that a CPU trace cannot see.

Used by ``bench/validate_gpu.py`` (section ``memory-accuracy-gpu``); the table of what each
item is and where it comes from is ``docs/memory_cuda.md``. Every check returns one row:
the item, asrfit's figure, the measured figure and a verdict. Nothing here runs without CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from asrfit.memory.cuda.allocator import CUBLAS_WORKSPACE_BYTES, MIB, segment_bytes
from asrfit.memory.trace.eventlog import round_block

Row = dict[str, Any]


def _row(item: str, predicted: int | None, measured: int, note: str = "") -> Row:
    ok = predicted is not None and predicted >= measured
    return {
        "item": item,
        "predicted": "-" if predicted is None else predicted,
        "measured": measured,
        "verdict": "covered" if ok else ("not modelled" if predicted is None else "UNDER"),
        "note": note,
    }


def check_rounding(device: str) -> Row:
    """Caching-allocator block rounding: odd-sized tensors take 512-byte multiples."""
    sizes = [1, 511, 513, 4097, 1_000_003]
    before = torch.cuda.memory_allocated(device)
    kept = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
    measured = torch.cuda.memory_allocated(device) - before
    del kept
    return _row("allocator rounding (512 B blocks)", sum(round_block(n) for n in sizes), measured)


def check_segments(device: str) -> Row:
    """Segments reserved for a mix of small, mid and large blocks (classic segments)."""
    torch.cuda.empty_cache()
    sizes = [300_000] * 5 + [5 * MIB] * 3 + [33 * MIB]
    before = torch.cuda.memory_reserved(device)
    kept = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
    measured = torch.cuda.memory_reserved(device) - before
    del kept
    torch.cuda.empty_cache()
    return _row(
        "allocator segments (2 MiB / 20 MiB / 2 MiB-rounded)",
        segment_bytes([round_block(n) for n in sizes]),
        measured,
        "with expandable segments the reserved figure may be lower",
    )


def check_cublas_workspace(device: str, measured: int) -> Row:
    """cuBLAS / cuBLASLt workspaces taken from the caching allocator by the first matmuls.

    ``measured``: what ``validate_gpu.measure_workspace_bytes`` saw them take in this
    process before anything else ran (a second measurement here would see 0: the
    workspaces are allocated once per handle and stream).
    """
    major, _ = torch.cuda.get_device_capability(device)
    predicted = CUBLAS_WORKSPACE_BYTES["hopper" if major == 9 else "default"]
    return _row("cuBLAS + cuBLASLt workspaces", predicted, measured)


def _transient(fn: Callable[[], Any], device: str) -> int:
    """Peak bytes allocated inside ``fn`` beyond what it leaves allocated."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    after = torch.cuda.memory_allocated(device) - before
    del out
    return max(0, peak - after)


def check_cudnn_conv_workspace(device: str) -> Row:
    """cuDNN convolution workspace (forward + backward of a wav2vec2-style 1-D conv)."""
    conv = torch.nn.Conv1d(512, 512, 3, stride=2).to(device)
    x = torch.randn(8, 512, 4000, device=device, requires_grad=True)

    def step() -> Any:
        y = conv(x)
        y.sum().backward()
        return None

    return _row(
        "cuDNN convolution workspace",
        None,
        _transient(step, device),
        "not traced; inside the reserved figure's fragmentation allowance",
    )


def check_rnn_reserve(device: str) -> Row:
    """cuDNN RNN reserve space: saved for backward, 0 bytes in the fake (meta) trace."""
    lstm = torch.nn.LSTM(320, 320, num_layers=1, batch_first=True).to(device)
    x = torch.randn(8, 100, 320, device=device)
    before = torch.cuda.memory_allocated(device)
    out, _ = lstm(x)
    kept = torch.cuda.memory_allocated(device) - before - out.untyped_storage().nbytes()
    del out
    return _row(
        "cuDNN RNN reserve space (LSTM 320, 8 x 100)",
        None,
        max(0, kept),
        "bytes kept after forward beyond the output (reserve + states)",
    )


def check_attention_buffers(device: str) -> Row:
    """Flash attention backward: fp32 dq accumulator and softmax sums inside the kernel."""
    q = torch.randn(4, 8, 1024, 64, device=device, dtype=torch.bfloat16, requires_grad=True)

    def step() -> Any:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        out.sum().backward()
        return None

    return _row(
        "attention kernel buffers (flash backward)",
        None,
        _transient(step, device),
        "logsumexp is traced (meta shapes); dq_accum/softmax_d are not",
    )


CHECKS = (
    check_rounding,
    check_segments,
    check_cublas_workspace,
    check_cudnn_conv_workspace,
    check_rnn_reserve,
    check_attention_buffers,
)


def run_all(device: str, workspace_bytes: int) -> list[Row]:
    """Run every check; a failing check is reported as a row, not raised.

    ``workspace_bytes``: the cuBLAS workspaces measured first in this process.
    """
    rows = []
    for check in CHECKS:
        try:
            if check is check_cublas_workspace:
                rows.append(check(device, workspace_bytes))
            else:
                rows.append(check(device))
        except Exception as exc:  # keep the other checks
            rows.append(
                {
                    "item": check.__name__,
                    "predicted": "-",
                    "measured": "-",
                    "verdict": "failed",
                    "note": f"{type(exc).__name__}: {exc}".splitlines()[0][:100],
                }
            )
    return rows


def render(rows: list[Row]) -> str:
    """Markdown table of the checks."""
    lines = [
        "",
        "What a CUDA prediction adds that a CPU trace cannot see (`docs/memory_cuda.md`), "
        "measured on this GPU:",
        "",
        "| item | asrfit bytes | measured bytes | verdict | note |",
        "|---|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['item']} | {r['predicted']} | {r['measured']} | {r['verdict']} | {r['note']} |"
        )
    return "\n".join(lines)
