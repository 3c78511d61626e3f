"""The CPU dropout and attention of asrfit.models.dropout, against closed forms and PyTorch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from asrfit.memory.trace.kernels import device_kernels
from asrfit.models import dropout as D


def test_each_lane_of_a_random_word_drops_with_probability_p() -> None:
    torch.manual_seed(0)
    n, p = 1 << 20, 0.1
    drop, scale = D.drop_mask(torch.Size([n // 4, 4]), p, torch.device("cpu"))
    assert drop.dtype == torch.bool and drop.shape == (n // 4, 4)
    exact = round(p * 65536) / 65536
    assert scale == pytest.approx(1 / (1 - exact), rel=1e-12)
    # the four 16-bit lanes of each 64-bit word (a lane whose sign bit never varied, as with
    # random_() without bounds, would drop nothing or everything)
    sigma = math.sqrt(exact * (1 - exact) / (n // 4))
    for lane in range(4):
        assert abs(drop[:, lane].double().mean().item() - exact) < 5 * sigma
    # neighbouring elements independent: both dropped as often as p^2
    both = (drop[:, 0] & drop[:, 1]).double().mean().item()
    assert abs(both - exact**2) < 5 * math.sqrt(exact**2 / (n // 4))


def test_dropout_zeroes_and_scales_and_its_gradient_is_the_same_mask() -> None:
    torch.manual_seed(1)
    x = torch.randn(64, 300, requires_grad=True)
    out = D.dropout(x, 0.25, training=True)
    dropped = out == 0
    scale = 65536 / (65536 - round(0.25 * 65536))
    torch.testing.assert_close(out[~dropped], x[~dropped] * scale)
    assert 0.2 < dropped.double().mean().item() < 0.3
    out.backward(torch.ones_like(out))
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (~dropped).to(x.dtype) * scale)


def test_dropout_keeps_the_expectation() -> None:
    torch.manual_seed(2)
    x = torch.full((200_000,), 3.0)
    out = D.dropout(x, 0.3)
    assert 0.29 < (out == 0).double().mean().item() < 0.31  # it drops (identity would pass below)
    assert out.mean().item() == pytest.approx(3.0, rel=0.01)


def test_dropout_is_identity_in_eval_and_follows_the_seed() -> None:
    x = torch.randn(32, 32)
    assert D.dropout(x, 0.5, training=False) is x
    assert D.Dropout(0.5).eval()(x) is x
    torch.manual_seed(3)
    first = D.dropout(x, 0.5)
    state = torch.get_rng_state()
    second = D.dropout(x, 0.5)
    torch.manual_seed(3)
    torch.testing.assert_close(D.dropout(x, 0.5), first)
    torch.set_rng_state(state)
    torch.testing.assert_close(D.dropout(x, 0.5), second)


def test_outside_the_fast_path_it_is_pytorchs_dropout() -> None:
    x = torch.randn(16, 16)
    with D.host_kernels(False):
        torch.manual_seed(4)
        ours = D.dropout(x, 0.2)
    torch.manual_seed(4)
    torch.testing.assert_close(ours, F.dropout(x, 0.2, training=True))
    torch.testing.assert_close(D.dropout(x, 1.0), torch.zeros_like(x))  # p = 1: PyTorch's


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_attention_math_path_matches_sdpa_when_nothing_is_dropped(mask_kind: str) -> None:
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3))
    mask = None
    if mask_kind == "bool":
        mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
        mask[1, ..., 5:] = False
    elif mask_kind == "float":
        mask = torch.randn(2, 1, 7, 7)
    causal = mask_kind == "causal"
    # p = 1e-6 rounds to no dropped element: the fast path's math, scale 1
    ours = D.attention(q, k, v, attn_mask=mask, dropout_p=1e-6, is_causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(ours.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_attention_dropout_averages_to_attention_without_it() -> None:
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(D.attention(q, k, v, dropout_p=0.2), ref)  # one draw drops
    mean = torch.stack([D.attention(q, k, v, dropout_p=0.2) for _ in range(4000)]).mean(0)
    torch.testing.assert_close(mean, ref, rtol=0.05, atol=0.05)


def test_a_trace_for_a_gpu_runs_pytorchs_kernels_and_one_for_the_cpu_the_fast_ones() -> None:
    assert D._HOST_KERNELS
    with device_kernels("cuda"):
        assert not D._HOST_KERNELS
    with device_kernels("cpu"):
        assert D._HOST_KERNELS
    assert D._HOST_KERNELS


def test_the_float_mask_drops_what_the_boolean_mask_drops_for_a_seed() -> None:
    shape, p = torch.Size([37, 129]), 0.15
    torch.manual_seed(7)
    drop, scale = D.drop_mask(shape, p, torch.device("cpu"))
    torch.manual_seed(7)
    mask = D.keep_scale(shape, p, torch.empty(0, dtype=torch.float64))
    assert mask.dtype == torch.float64
    want = torch.full(shape, scale, dtype=torch.float64).masked_fill(drop, 0.0)
    torch.testing.assert_close(mask, want, rtol=0, atol=0)


def test_conv2d_on_a_cpu_is_the_module_in_channels_last_order() -> None:
    torch.manual_seed(8)
    conv = torch.nn.Conv2d(16, 24, 3, stride=2, padding=1)
    x = torch.randn(3, 16, 41, 20, requires_grad=True)
    ours = D.conv2d(conv, x)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    ref = conv(x)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(ours.square().sum(), (x, conv.weight, conv.bias))
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, conv.weight, conv.bias))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert conv.weight.is_contiguous()  # the parameter itself is left as it was
    with D.host_kernels(False):  # a trace for a GPU: the module's own call
        assert D.conv2d(conv, x).is_contiguous()


@pytest.mark.parametrize("padding", [7, "same"])
def test_conv1d_time_last_is_the_depthwise_module_over_time(padding: int | str) -> None:
    torch.manual_seed(9)
    conv = torch.nn.Conv1d(32, 32, 15, padding=padding, groups=32)
    x = torch.randn(3, 50, 32, requires_grad=True)  # (B, T, C)
    ours = D.conv1d_time_last(conv, x)
    ref = conv(x.transpose(1, 2)).transpose(1, 2)
    assert ours.shape == (3, 50, 32) and ours.is_contiguous()  # no copy back to (B, T, C)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    grads = torch.autograd.grad(ours.square().sum(), (x, conv.weight, conv.bias))
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, conv.weight, conv.bias))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with D.host_kernels(False):
        torch.testing.assert_close(D.conv1d_time_last(conv, x), ref, rtol=0, atol=0)
