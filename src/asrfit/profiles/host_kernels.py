"""This CPU's fixed costs: seconds per kernel by kind, per ``nn.Module`` call, per
optimizer kernel (micro-benchmarks behind :func:`asrfit.profiles.host.measure_host_rates`).

A kernel's fixed cost is what it takes beyond its arithmetic and memory traffic: the
dispatcher, autograd recording (forward) or the autograd engine (backward), and the
kernel's own set-up. Each is measured on tiny tensors, where nothing else is left, as the
best of many short repeats (so a busy moment does not raise it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from asrfit.profiles.rates import runs_kernel

REPEATS = 5
CHAIN = 16
_KERNEL_REPEATS = 30
_MODULE_ROUNDS = 6  # alternating rounds of wrapped and bare chains
_ROUND_REPEATS = _KERNEL_REPEATS // 3
_MODULE_ATTEMPTS = 3
# An nn.Module call is at least a Python call plus ``_call_impl``'s checks: ~0.1 us even on
# a fast CPU (measured ~1 us here); a smaller difference means the measurement was disturbed.
MIN_MODULE_CALL_SECONDS = 1e-7
OPTIMIZER_PARAMS = 100
# A model's modules run more Python than the micro-benchmark's bare module (shape logic,
# masks, config checks, hooks, the autograd nodes of their views): a least-squares factor
# on :func:`module_call_seconds`, fitted on the FITTED cases of bench/step_time_accuracy.py
# (``--fit``: wav2vec2, whisper, parakeet-ctc); the held-out families there were not used.
MODULE_FACTOR = 51.0


def _no_sync() -> None:
    return None


def _sync_for(device: str) -> Callable[[], None]:
    """What waits for ``device``'s queued kernels (nothing on a CPU)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return _no_sync


def best_seconds(
    run: Callable[[], None],
    repeats: int = REPEATS,
    min_seconds: float = 0.02,
    sync: Callable[[], None] = _no_sync,
) -> float:
    """Best per-call seconds of ``run`` over ``repeats`` timed batches of >= ``min_seconds``.

    ``sync`` runs after each batch, inside its time: on a GPU it waits for the queued
    kernels, so that a batch is not timed while earlier ones still run (once per batch of
    many calls, it adds one kernel's latency to thousands).
    """
    run()  # warm-up (allocations, oneDNN primitive creation)
    sync()
    calls = 1
    started = time.perf_counter()
    run()
    sync()
    once = max(time.perf_counter() - started, 1e-7)
    calls = max(1, int(min_seconds / once))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


class KernelCount:
    """Counts the aten ops that run a kernel (see :func:`asrfit.profiles.rates.runs_kernel`)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                counter.kernels += runs_kernel(func)
                return func(*args, **(kwargs or {}))

        self.kernels = 0
        self.mode = Mode()


def _kind_chains(device: str = "cpu") -> dict[str, Callable[[object], object]]:
    """One shape-preserving op per kernel kind, on a tiny ``(2, 16, 8)`` tensor."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    cw = torch.randn(16, 16, 3, device=device, requires_grad=True)
    return {
        "elementwise": lambda x: x * 1.01,
        "matmul": lambda x: F.linear(x, w),
        "conv": lambda x: F.conv1d(x, cw, padding=1),
        "norm": lambda x: F.layer_norm(x, (8,)),
        "softmax": lambda x: torch.softmax(x, -1),
        "activation": lambda x: F.gelu(x),
        "attention": lambda x: F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None])[
            :, 0
        ],
    }


def _per_kernel(
    run: Callable[[], object], sync: Callable[[], None] = _no_sync
) -> tuple[float, float]:
    """(seconds per forward kernel, per backward kernel) of ``run`` (returns a tensor)."""
    forward_count, backward_count = KernelCount(), KernelCount()
    with forward_count.mode:
        loss = run().sum()
    with backward_count.mode:
        loss.backward(retain_graph=True)
    # many short repeats: the best one is a moment when no other process held the core
    forward_seconds = best_seconds(run, _KERNEL_REPEATS, 0.002, sync)
    # the same graph run backward again and again (gradients accumulate: same kernels)
    backward_seconds = best_seconds(
        lambda: loss.backward(retain_graph=True), _KERNEL_REPEATS, 0.002, sync
    )
    return (
        forward_seconds / max(forward_count.kernels, 1),
        backward_seconds / max(backward_count.kernels, 1),
    )


def kernel_seconds_by_kind(device: str = "cpu") -> dict[str, list[float]]:
    """``{kind: [seconds per forward kernel, per backward kernel]}`` of eager autograd.

    A chain of :data:`CHAIN` ops of one kind on a tiny tensor, called from Python as a
    model's ``forward`` calls them (dispatcher, autograd recording, the kernel's own setup:
    a oneDNN convolution costs ten times an elementwise op), then run backward. On a GPU
    (``device="cuda"``) the tiny kernels finish sooner than the host queues them, so the
    figures are the host's cost per kernel, its launch included.
    """
    import torch

    sync = _sync_for(device)
    out: dict[str, list[float]] = {}
    for kind, op in _kind_chains(device).items():
        x = torch.randn(2, 16, 8, device=device, requires_grad=True)

        def run(op: Callable[[object], object] = op, x: object = x) -> object:
            y = x
            for _ in range(CHAIN):
                y = op(y)
            return y

        out[kind] = list(_per_kernel(run, sync))
    return out


def int_kernel_seconds(device: str = "cpu") -> float:
    """Seconds per forward kernel of index arithmetic on small integer and bool tensors.

    What a transducer loss's loop runs between its float ops (``t - d``, ``clamp``,
    ``>= 0``, ``&``, ``any``): dispatch and the kernel, no autograd recording (integer
    tensors never require grad).
    """
    import torch

    index = torch.arange(24, device=device)

    def run() -> object:
        out = None
        for d in range(CHAIN // 4):
            shifted = index - d
            valid = shifted >= 0
            out = valid & (shifted < 20)
            out.any()
        return out

    count = KernelCount()
    with count.mode:
        run()
    return best_seconds(run, _KERNEL_REPEATS, 0.002, _sync_for(device)) / max(count.kernels, 1)


def module_call_seconds() -> float:
    """Seconds one ``nn.Module`` call adds to the same op called bare (forward + backward)."""
    import torch
    from torch import nn

    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1.01

    chain = nn.Sequential(*[Scale() for _ in range(CHAIN)])
    x = torch.randn(2, 16, 8, requires_grad=True)

    def bare() -> torch.Tensor:
        y = x
        for _ in range(CHAIN):
            y = y * 1.01
        return y

    def both(run: Callable[[], torch.Tensor]) -> float:
        loss = run().sum()
        backward = best_seconds(lambda: loss.backward(retain_graph=True), _ROUND_REPEATS, 0.002)
        return best_seconds(run, _ROUND_REPEATS, 0.002) + backward

    # The difference of two ~60 us figures is ~16 us: one busy moment over either side's
    # whole measurement moves it a lot (once it came out <= 0, and every step-time
    # prediction lost its module term). So the two sides alternate in short rounds, each
    # side's best over all rounds is taken, and a result below what a Python call costs
    # is measured again.
    for _ in range(_MODULE_ATTEMPTS):
        wrapped, plain = float("inf"), float("inf")
        for _ in range(_MODULE_ROUNDS):
            wrapped = min(wrapped, both(lambda: chain(x)))
            plain = min(plain, both(bare))
        per_call = (wrapped - plain) / CHAIN
        if per_call >= MIN_MODULE_CALL_SECONDS:
            return per_call
    raise RuntimeError(
        f"an nn.Module call measured {per_call * 1e6:.2f} us over a bare op in "
        f"{_MODULE_ATTEMPTS} attempts (below {MIN_MODULE_CALL_SECONDS * 1e6:.1f} us, what a "
        "Python call costs): the machine was too busy to measure. Measure again on a quieter "
        "machine (asrfit.profiles.host.host_rates(refresh=True))."
    )


def optimizer_kernel_seconds(device: str = "cpu") -> float:
    """Seconds per kernel of an AdamW step and ``zero_grad`` over many small parameters.

    The optimizer loops over parameters in C++ (foreach) or Python (per tensor) with no
    autograd and no module calls, so its kernels cost less than a model's.
    """
    import torch

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, device=device)) for _ in range(OPTIMIZER_PARAMS)]
    optimizer = torch.optim.AdamW(params, lr=1e-3)

    def step() -> None:
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the state exists from here on, as in every step after the first
    count = KernelCount()
    for p in params:
        p.grad = torch.ones_like(p)
    with count.mode:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync = _sync_for(device)
    grads = best_seconds(lambda: [torch.ones_like(p) for p in params], _KERNEL_REPEATS, 0.002, sync)
    seconds = best_seconds(step, _KERNEL_REPEATS, 0.002, sync) - grads
    return max(seconds, 0.0) / max(count.kernels, 1)
