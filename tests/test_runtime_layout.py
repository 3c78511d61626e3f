"""Layout copies in the step-time trace, checked against the copies a real call makes.

Layer norm, softmax and convolution copy a non-contiguous input into a contiguous one
inside their kernels, below the dispatcher; :class:`asrfit.memory.steptime.runtime.OpCounter` adds
a ``layout`` row for each. The reference is the profiler's ``aten::copy_`` events of the
same call on real tensors (the kernel's own ``.contiguous()``), not the counter's rules.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from asrfit.memory.steptime.roofline import StepCost, step_seconds
from asrfit.memory.steptime.runtime import OpCounter
from asrfit.profiles.rates import DeviceRates


def _real_copied_bytes(run: Callable[[], None]) -> int:
    """Bytes the real call's ``copy_`` events copy (4 bytes per fp32 element)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    total = 0
    for event in prof.events():
        if event.name == "aten::copy_" and event.input_shapes and event.input_shapes[0]:
            total += 4 * int(torch.Size(event.input_shapes[0]).numel())
    return total


def _counted(run: Callable[[], None]) -> tuple[int, int]:
    """(bytes copied by ``layout`` rows, bytes of ``copy`` rows) the counter records."""
    counter = OpCounter(phase="forward")
    with counter:
        run()
    layout = copy = 0
    for row in counter.cost(1, phases=("forward",)).rows:
        if row[1] == "layout":
            layout += row[4] // 2 * row[6]
        elif row[1] == "copy":
            copy += row[4] // 2 * row[6]
    return layout, copy


def _transposed(b: int, c: int, t: int) -> torch.Tensor:
    """A ``(B, C, T)`` tensor stored as ``(B, T, C)``: not contiguous (a non-leaf, so that
    no gradient is accumulated into a leaf of another layout)."""
    return torch.randn(b, t, c, requires_grad=True).transpose(1, 2)


def _grads(out: torch.Tensor, inputs: list[torch.Tensor], grad: torch.Tensor) -> None:
    torch.autograd.grad(out, inputs, grad)


def _layer_norm() -> Callable[[], None]:
    x = _transposed(2, 40, 16)  # normalised over its last dim, stored transposed
    w, b = torch.ones(16, requires_grad=True), torch.zeros(16)
    grad = torch.randn(2, 16, 40).transpose(1, 2)  # a transposed gradient too
    return lambda: _grads(F.layer_norm(x, (16,), w, b), [x, w], grad)


def _conv1d() -> Callable[[], None]:
    x = _transposed(2, 8, 50)
    w = torch.randn(4, 8, 3, requires_grad=True)
    grad = torch.randn(2, 4, 48)
    return lambda: _grads(F.conv1d(x, w), [x, w], grad)


def _softmax() -> Callable[[], None]:
    x = _transposed(2, 30, 12)
    grad = torch.randn(2, 30, 12)
    return lambda: _grads(torch.softmax(x, -1), [x], grad)


def _log_softmax() -> Callable[[], None]:
    x = _transposed(2, 30, 12)
    grad = torch.randn(2, 30, 12)
    return lambda: _grads(torch.log_softmax(x, -1), [x], grad)


def _group_norm() -> Callable[[], None]:
    x = _transposed(2, 8, 30)
    w, b = torch.ones(8, requires_grad=True), torch.zeros(8)
    grad = torch.randn(2, 8, 30)
    return lambda: _grads(F.group_norm(x, 4, w, b), [x, w], grad)


@pytest.mark.parametrize(
    "case", [_layer_norm, _conv1d, _softmax, _log_softmax, _group_norm], ids=lambda f: f.__name__
)
def test_kernel_layout_copies_match_the_real_calls_copies(
    case: Callable[[], Callable[[], None]],
) -> None:
    run = case()
    real = _real_copied_bytes(run)
    layout, copy = _counted(run)
    assert real > 0, "the reference call made no copy: the case no longer tests anything"
    assert (layout, copy) == (real, 0)


def test_contiguous_and_channels_last_inputs_copy_nothing() -> None:
    x = torch.randn(2, 30, 16, requires_grad=True)
    image = torch.randn(2, 4, 6, 6).to(memory_format=torch.channels_last).requires_grad_()
    weight = torch.randn(3, 4, 3, 3).to(memory_format=torch.channels_last)
    strided = torch.randn(2, 8, 5).transpose(1, 2)

    def run() -> None:
        _grads(F.layer_norm(x, (16,)), [x], torch.randn(2, 30, 16))
        out = F.conv2d(image, weight)
        _grads(out, [image], torch.randn_like(out))  # the channels-last gradient
        F.gelu(strided)  # elementwise: strides handled inside

    assert _real_copied_bytes(run) == 0
    assert _counted(run) == (0, 0)


def test_explicit_copies_are_layout_only_when_the_order_changes() -> None:
    x = torch.randn(4, 50, 8)
    assert _counted(lambda: x.transpose(1, 2).contiguous()) == (x.nbytes, 0)
    assert _counted(lambda: x.clone()) == (0, x.nbytes)
    sliced = x[:, :10]  # gaps, same order: a plain copy
    assert _counted(lambda: sliced.contiguous()) == (0, sliced.numel() * 4)


def test_layout_rows_are_priced_at_their_own_bandwidth() -> None:
    curve = {"fp32": [[1e5, 1e9], [1e8, 1e9]]}
    rates = DeviceRates(
        name="test",
        threads=1,
        matmul_flops_per_second={"fp32": 1e11},
        conv_flops_per_second={"fp32": 1e11},
        memory_bytes_per_second=2e10,
        kernel_seconds=0.0,
        forward_kernel_seconds=0.0,
        rate_curves={"bandwidth:layout": curve},
    )
    row = ["forward", "layout", "fp32", 0, 10**6, 1, 1]
    plain = ["forward", "copy", "fp32", 0, 10**6, 1, 1]
    assert step_seconds(StepCost([row]), rates) == pytest.approx(1e-3)
    assert step_seconds(StepCost([plain]), rates) == pytest.approx(5e-5)
