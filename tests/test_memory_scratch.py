"""CPU convolution scratch rules against a real profiled convolution, and the SpecAugment fallback.

The reference is independent of the simulator: a real convolution on the CPU under
``torch.profiler`` with memory events, whose bytes live inside the op beyond its outputs
are the scratch the rules must predict.
"""

from __future__ import annotations

import importlib
import random

import numpy as np
import pytest
import torch

import asrfit.memory.trace.tracker as tracker_module
from asrfit.memory.models import adapters
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape, StepMemory
from asrfit.memory.trace.scratch import CPU_SCRATCH, scratch_rules

aten = torch.ops.aten


def _bench(name: str):
    """The module ``bench.<name>`` (bench/ is a package; the repository root is on the path)."""
    return importlib.import_module(f"bench.{name}")


def _measured_scratch(fn, op_name: str) -> int:
    """Bytes held inside ``op_name`` beyond its outputs (``bench/cpu_conv_scratch.py``)."""
    return _bench("cpu_conv_scratch").measured_scratch(fn, op_name)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
@pytest.mark.parametrize(
    ("c_in", "c_out", "stride"), [(32, 32, 2), (64, 128, 1), (128, 64, 1), (1, 32, 5)]
)
def test_forward_rule_matches_profiled_conv1d(c_in: int, c_out: int, stride: int) -> None:
    x = torch.randn(2, c_in, 4000)
    w = torch.randn(c_out, c_in, 3)
    out = torch.nn.functional.conv1d(x, w, stride=stride)
    measured = _measured_scratch(
        lambda: torch.nn.functional.conv1d(x, w, stride=stride), "aten::mkldnn_convolution"
    )
    predicted = CPU_SCRATCH[aten.convolution.default]((x, w), {}, out)
    assert predicted == pytest.approx(measured, rel=0.02)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN (mkldnn)")
def test_backward_rule_is_close_for_fp32_conv() -> None:
    x = torch.randn(2, 64, 3000, requires_grad=True)
    w = torch.randn(128, 64, 3, requires_grad=True)
    y = torch.nn.functional.conv1d(x, w)
    grad = torch.randn_like(y)
    measured = _measured_scratch(
        lambda: torch.autograd.grad(y, [w], grad), "aten::convolution_backward"
    )
    args = (grad, x.detach(), w.detach(), None, [1], [0], [1], False, [0], 1, [False, True, False])
    predicted = CPU_SCRATCH[aten.convolution_backward.default](args, {}, None)
    assert predicted == pytest.approx(measured, rel=0.05)


def test_convolution_rules_apply_only_to_cpu_traces() -> None:
    # a CUDA trace's only scratch is layer norm's contiguous copy (tests/test_cuda_autocast.py)
    assert set(scratch_rules("cuda")) == {
        aten.native_layer_norm.default,
        aten.native_layer_norm_backward.default,
    }
    assert set(scratch_rules("cpu")) == {
        aten.convolution.default,
        aten.convolution_backward.default,
    }


def _tiny_wav2vec2(mask_time_prob: float):
    """The accuracy grid's tiny wav2vec2 (XLS-R layout: it takes the padding mask)."""
    config = _bench("_grid")._config("wav2vec2")
    config.mask_time_prob, config.mask_time_length = mask_time_prob, 2
    return config


def test_cpu_trace_adds_conv_scratch_and_cuda_trace_does_not() -> None:
    cfg = _tiny_wav2vec2(0.0)
    batch = BatchShape(2, 4000, 10)
    cpu = simulate_step(hf_adapter(cfg), batch, Setup(), target="cpu")
    cuda = simulate_step(hf_adapter(cfg), batch, Setup(), target="cuda")
    assert cpu.largest_transient_bytes >= 2 * 4000 * 4  # at least the raw audio's reorder
    assert cuda.largest_transient_bytes < cpu.largest_transient_bytes


def _seeded_step(cfg: object, batch: BatchShape) -> StepMemory:
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # the same SpecAugment draws
    return simulate_step(hf_adapter(cfg), batch, Setup())


def test_spec_augment_spans_with_unknown_mask_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A padding mask whose values the tracker does not know (made in the trace, past the
    size limit for followed values) still traces; the assumption is reported."""
    cfg = _tiny_wav2vec2(0.5)
    batch = BatchShape(4, 4000, 10)
    known = _seeded_step(cfg, batch)
    for limit in ("_MAX_SHADOW_BYTES", "_MAX_LAZY_BYTES"):  # masks are 4 x 4000
        monkeypatch.setattr(tracker_module, limit, 1000)
    monkeypatch.setattr(  # made inside the trace from nothing known: ones, not followed
        adapters, "_mask", lambda tracker, b, length: torch.ones(b, length, dtype=torch.long)
    )
    unknown = _seeded_step(cfg, batch)
    assert any("_compute_mask_indices" in a for a in unknown.assumptions)
    assert not any("_compute_mask_indices" in a for a in known.assumptions)
    assert unknown.peak_bytes == pytest.approx(known.peak_bytes, rel=0.05)


def test_lengths_read_from_a_mask_past_the_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model reads its lengths from a running sum of the padding mask (``cumsum``), a
    value as large as the mask: it is followed past the size limit, being no larger than the
    mask the trace already holds, so a batch that large traces as a small one does."""
    cfg = _tiny_wav2vec2(0.5)
    batch = BatchShape(4, 4000, 10)
    known = _seeded_step(cfg, batch)
    # the int64 mask of 4 x 4000 samples (128 kB) past the limit; the encoder's frame masks not
    for limit in ("_MAX_SHADOW_BYTES", "_MAX_LAZY_BYTES"):
        monkeypatch.setattr(tracker_module, limit, 64_000)
    limited = _seeded_step(cfg, batch)
    assert limited.assumptions == known.assumptions
    assert limited.peak_bytes == known.peak_bytes


def test_transducer_may_have_more_labels_than_frames() -> None:
    """TDT emits several labels per frame: no CTC length rule (CTC keeps its clear error)."""
    grid = _bench("_grid")
    tdt = grid._config("parakeet-tdt")
    ctc = grid._config("parakeet-ctc")
    shape = BatchShape(1, 80, 30)  # 80 feature frames -> 10 encoder frames, 30 labels
    assert simulate_step(hf_adapter(tdt), shape, Setup()).peak_bytes > 0
    from asrfit.errors import ShapeError

    with pytest.raises(ShapeError, match="CTC needs at least one frame per label"):
        simulate_step(hf_adapter(ctc), shape, Setup())
