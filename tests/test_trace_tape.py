"""Tape replay (asrfit.memory.tape) against fresh traces of the same batch.

The reference is :func:`asrfit.memory.simulate.simulate_step` at the replayed batch: every
memory figure (peak, each category, each phase's and step's peak, segments, FLOPs,
assumptions) must be equal, and the kernel rows' FLOPs and bytes equal within 0.01 % (a
masked-frame count is a random draw at any batch). Where a step at another batch would not
be the same log scaled, replay must refuse.
"""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from test_depth_scaling import _PARAKEET, _W2V, _adapter, _whisper  # noqa: E402

import asrfit.memory.trace.tracker as tracker_module  # noqa: E402
from asrfit.memory.setup import Precision, Setup  # noqa: E402
from asrfit.memory.simulate import simulate_step  # noqa: E402
from asrfit.memory.step import BatchShape, StepAdapter, StepMemory  # noqa: E402
from asrfit.memory.tape import Tape, replay, replayed_step  # noqa: E402
from asrfit.models.conformer import conformer_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# two layers; SpecAugment's masked frames: a count drawn per utterance
_W2V_MASKED = {**_W2V, "num_hidden_layers": 2, "mask_time_prob": 0.3, "mask_time_length": 2}
_PARAKEET_2 = {**_PARAKEET, "num_hidden_layers": 2}


CASES = {
    "wav2vec2": (lambda: transformers.Wav2Vec2Config(**_W2V_MASKED), 8000, 8),
    "whisper": (_whisper, 60, 6),
    "parakeet_tdt": (
        lambda: transformers.ParakeetTDTConfig(
            vocab_size=11,
            blank_token_id=10,
            pad_token_id=2,
            decoder_hidden_size=8,
            encoder_config=dict(_PARAKEET_2),
        ),
        128,
        12,
    ),
    "conformer_ctc": (  # its float masks of B x 400 input frames are followed up to B = 10
        lambda: conformer_config(48, encoder_layers=3, encoder_attention_heads=2),
        400,
        6,
    ),
}
SETUPS = {
    "fp16": Setup(precision=Precision.FP16),
    "bf16_ckpt_first_1": Setup(precision=Precision.BF16, checkpoint_layers=1),
}


def _trace(adapter: StepAdapter, shape: BatchShape, setup: Setup, target: str = "cuda"):
    # The same draws at every batch: a random draw may add storages (how many spans a
    # SpecAugment mask has), and replay refuses tapes of other structures (the planner then
    # traces), so that the outcome would hang on what earlier tests drew.
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    tapes: list[Tape] = []
    step = simulate_step(
        adapter, shape, setup, target=target, steps=1, optimizer_step=False, keep_tape=tapes
    )
    return step, tapes[0]


def _assert_same_step(replayed: StepMemory, traced: StepMemory) -> None:
    got, want = replayed.to_dict(), traced.to_dict()
    for name in ("trace_seconds", "cost", "layer_costs"):
        got.pop(name), want.pop(name)
    assert got == want  # layer_left_bytes among them
    # the kernels, and each encoder layer's recompute (asrfit.memory.steptime.layer_span)
    assert len(replayed.layer_costs) == len(traced.layer_costs)
    for cost, truth in (
        (replayed.cost, traced.cost),
        *zip(replayed.layer_costs, traced.layer_costs, strict=True),
    ):
        assert cost.flops == truth.flops
        assert cost.calls == truth.calls and cost.module_calls == truth.module_calls
        assert cost.bytes_moved == pytest.approx(truth.bytes_moved, rel=1e-4)


@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize("family", list(CASES))
def test_a_replayed_batch_is_the_trace_of_that_batch(
    family: str, setup_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asrfit.memory.tape")
    make, length, labels = CASES[family]
    adapter, setup = _adapter(make()), SETUPS[setup_name]
    _, two = _trace(adapter, BatchShape(2, length, labels), setup)
    _, four = _trace(adapter, BatchShape(4, length, labels), setup)
    for batch in (5, 9):  # above both tapes (below, a value followed at 2 only may differ)
        traced, _ = _trace(adapter, BatchShape(batch, length, labels), setup)
        tape = replay(two, four, batch)
        assert tape is not None, f"{family} {setup_name}: {caplog.records[-1].getMessage()}"
        _assert_same_step(replayed_step(tape, adapter.name, setup), traced)


def test_a_trace_does_not_hang_on_the_traces_before_it() -> None:
    """FakeTensorMode's dispatch cache is shared by the process: the TDT decoder's LSTM
    backward returns its bias gradient twice, as one storage on a cache miss and, rebuilt from
    the cache, as two on a hit. The first and second trace of one shape must be alike."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    make, length, labels = CASES["parakeet_tdt"]
    adapter, setup = _adapter(make()), SETUPS["fp16"]
    FakeTensorMode.cache_clear()
    _, first = _trace(adapter, BatchShape(2, length, labels), setup)
    _, second = _trace(adapter, BatchShape(2, length, labels), setup)
    assert FakeTensorMode.cache_hits > 0
    assert first.to_dict() == second.to_dict()


def _xlsr_layout_replayed_and_traced(batch: int) -> tuple[StepMemory | None, StepMemory]:
    """XLS-R's layout (layer-normed feature encoder, padding mask passed) at 8,000 samples:
    ``batch`` replayed from tapes at batches 2 and 4 (None where replay refuses), and traced."""
    config = transformers.Wav2Vec2Config(
        **{**_W2V_MASKED, "layerdrop": 0.1}, feat_extract_norm="layer", do_stable_layer_norm=True
    )
    adapter, setup = _adapter(config), SETUPS["bf16_ckpt_first_1"]
    _, two = _trace(adapter, BatchShape(2, 8000, 8), setup)
    _, four = _trace(adapter, BatchShape(4, 8000, 8), setup)
    traced, _ = _trace(adapter, BatchShape(batch, 8000, 8), setup)
    tape = replay(two, four, batch)
    return (None if tape is None else replayed_step(tape, adapter.name, setup)), traced


def test_a_padding_mask_read_per_utterance_replays() -> None:
    """XLS-R's layout (layer-normed feature encoder) passes the padding mask, whose lengths
    SpecAugment reads with ``.tolist()``: element by element on fake tensors, as many reads as
    utterances; counted as the one copy to the host it is on a device, the tapes align."""
    replayed, traced = _xlsr_layout_replayed_and_traced(7)
    assert replayed is not None
    _assert_same_step(replayed, traced)


def test_a_padding_mask_past_the_size_limit_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """XLS-R reads its lengths from a running sum of the padding mask, a value as large as the
    mask: followed at any batch (it is no larger than the mask the trace holds), so a batch
    whose mask is past the size limit for followed values replays from tapes below it, and the
    replay is the trace there (the planner's refinements of XLS-R at batches of 64-371)."""
    # int64 masks of 2 and 4 x 8000 samples (128 and 256 kB) below the limit, 9 x 8000 above
    for limit in ("_MAX_SHADOW_BYTES", "_MAX_LAZY_BYTES"):
        monkeypatch.setattr(tracker_module, limit, 300_000)
    replayed, traced = _xlsr_layout_replayed_and_traced(9)
    assert replayed is not None
    _assert_same_step(replayed, traced)
    assert not any("_compute_mask_indices" in a for a in traced.assumptions)


def test_a_frame_mask_past_the_held_size_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """XLS-R's encoder repeats its frame mask over the hidden size and zeroes the padded
    frames through it (boolean indexing reads it). Past the size held whole the mask is kept
    as the op that makes it and read exactly, so a batch whose mask is past that size replays
    from tapes below it, and the replay is the trace there (the planner's refinements of
    XLS-R-1B at batches 128-371)."""
    # repeated masks of 2 and 4 x 799 frames x 32 (51 and 102 kB) held whole, of 9 (230 kB) not
    monkeypatch.setattr(tracker_module, "_MAX_SHADOW_BYTES", 150_000)
    replayed, traced = _xlsr_layout_replayed_and_traced(9)
    assert replayed is not None
    _assert_same_step(replayed, traced)
    assert not any("boolean indexing" in a for a in traced.assumptions)
    # the control: no recipes past the size held whole, and the mask at 9 is not followed
    monkeypatch.setattr(tracker_module, "_MAX_LAZY_BYTES", 150_000)
    replayed, traced = _xlsr_layout_replayed_and_traced(9)
    assert replayed is None
    assert any("boolean indexing" in a for a in traced.assumptions)


def test_a_cpu_targets_step_replays_too() -> None:
    """The CPU target adds oneDNN's scratch per convolution; the conformer's is proportional."""
    adapter, setup = _adapter(CASES["conformer_ctc"][0]()), Setup()
    _, two = _trace(adapter, BatchShape(2, 400, 6), setup, "cpu")
    _, four = _trace(adapter, BatchShape(4, 400, 6), setup, "cpu")
    traced, _ = _trace(adapter, BatchShape(7, 400, 6), setup, "cpu")
    tape = replay(two, four, 7)
    assert tape is not None
    _assert_same_step(replayed_step(tape, adapter.name, setup, "cpu"), traced)


def test_a_tape_read_back_from_json_replays_the_same() -> None:
    make, length, labels = CASES["wav2vec2"]
    adapter, setup = _adapter(make()), SETUPS["fp16"]
    _, two = _trace(adapter, BatchShape(2, length, labels), setup)
    _, four = _trace(adapter, BatchShape(4, length, labels), setup)
    back = [Tape.from_dict(json.loads(json.dumps(t.to_dict()))) for t in (two, four)]
    direct, read = replay(two, four, 11), replay(*back, 11)
    assert direct is not None and read is not None
    assert replayed_step(read, "m", setup).to_dict() | {"trace_seconds": 0} == replayed_step(
        direct, "m", setup
    ).to_dict() | {"trace_seconds": 0}


def _adapter_of(forward) -> StepAdapter:
    """A one-layer model whose loss runs ``forward(x, layer)`` on a batch of ``(B, T)``."""

    def build() -> nn.Module:
        return nn.Linear(8, 8, bias=False)

    def make_inputs(shape: BatchShape, tracker: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(shape.batch_size, shape.input_length, 8)}

    def loss(model: nn.Module, kw: dict[str, torch.Tensor]) -> torch.Tensor:
        return forward(kw["x"], model).float().sum()

    return StepAdapter("toy", build, make_inputs, loss)


def test_a_storage_neither_constant_nor_proportional_refuses() -> None:
    """Two rows of a learned prefix joined to the batch: ``B + 2`` rows, not ``B``."""
    prefix = {}

    def forward(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        if "rows" not in prefix:
            prefix["rows"] = torch.zeros(2, x.shape[1], 8)
        return layer(torch.cat([prefix["rows"].to(x), x]))

    adapter = _adapter_of(forward)
    _, two = _trace(adapter, BatchShape(2, 64, 1), Setup())
    prefix.clear()
    _, four = _trace(adapter, BatchShape(4, 64, 1), Setup())
    assert replay(two, four, 8) is None


def _masked(read: bool):
    """A model whose step makes a boolean mask of ``B x T`` from known lengths; ``read``: its
    values pick frames (boolean indexing reads them), else only its sum scales the loss."""

    def forward(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        lengths = torch.full((x.shape[0],), x.shape[1] - 1, dtype=torch.int32)
        frames = torch.arange(x.shape[1], dtype=torch.int32)
        mask = frames[None] < lengths[:, None]  # known values: booleans, (B, T)
        if read:
            return layer(x[mask][:1])
        return layer(x[:, :1]) * mask.sum()

    return _adapter_of(forward)


def test_a_value_read_but_too_large_to_follow_at_the_batch_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tracker follows the mask's values at batches 2 and 4 but, past the size limit for
    followed values (2^27 booleans here), no longer would: the frames it picks are then sized
    by a pessimistic rule, not counted."""
    monkeypatch.setattr(tracker_module, "_MAX_LAZY_BYTES", 1 << 27)
    length = 24_000_000  # 5 x 24 M booleans are followed; 6 x 24 M are not
    adapter = _masked(read=True)
    _, two = _trace(adapter, BatchShape(2, length, 1), Setup())
    _, four = _trace(adapter, BatchShape(4, length, 1), Setup())
    assert replay(two, four, 5) is not None
    assert replay(two, four, 6) is None


def test_a_value_followed_but_never_read_replays_past_the_size_limit() -> None:
    """Whether the tracker follows values that nothing reads changes nothing in the trace:
    the mask's values, followed at batches 2 and 4 only, do not stop a replay at 6 or 9, and
    the replay is the trace there."""
    length = 24_000_000
    adapter = _masked(read=False)
    _, two = _trace(adapter, BatchShape(2, length, 1), Setup())
    _, four = _trace(adapter, BatchShape(4, length, 1), Setup())
    for batch in (6, 9):
        traced, _ = _trace(adapter, BatchShape(batch, length, 1), Setup())
        tape = replay(two, four, batch)
        assert tape is not None
        _assert_same_step(replayed_step(tape, adapter.name, Setup()), traced)


def test_a_setups_costs_are_the_same_with_its_refinement_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner's fit of one setup, refined at batches well above the coarse ones: with
    replays, the refinement's batches at the longest length (traced at both coarse batches)
    are replayed, and the fit is the same."""
    from asrfit.memory.cache import model_key
    from asrfit.plan import costs as costs_module

    monkeypatch.setenv("ASRFIT_CACHE_DIR", "off")
    monkeypatch.setattr(costs_module, "trace_workers", lambda: 1)
    make, length, _ = CASES["wav2vec2"]
    adapter, setup = _adapter(make()), Setup(precision=Precision.FP16)
    budget = simulate_step(adapter, BatchShape(12, length, 8), setup, steps=1).peak_bytes

    def fit(replays: bool):
        estimator = costs_module.CostEstimator(adapter, model_key("tape-test"), 1, 1600)
        estimator.tapes.enabled = replays
        return estimator, estimator.costs(setup, length, 8 / length, budget_bytes=budget)

    traced, plain = fit(False)
    replayed, costs = fit(True)
    assert replayed.replays >= 1 and traced.replays == 0
    assert replayed.simulations < traced.simulations
    assert costs.memory == plain.memory
    assert costs.flops == plain.flops
    assert costs.optimizer_peak_bytes == plain.optimizer_peak_bytes


def test_a_scaled_steps_reduced_traces_are_replayed_to_its_trace() -> None:
    """A step at full depth from reduced-depth traces (asrfit.memory.fit.depth): each reduced
    trace replayed from its tapes at batches 2 and 4 gives the step traced at 9."""
    from asrfit.memory.fit.depth import scaled_step
    from asrfit.plan.tapes import Tapes

    adapter = _adapter(transformers.Wav2Vec2Config(**{**_W2V_MASKED, "num_hidden_layers": 16}))
    setup = SETUPS["fp16"]
    tapes = Tapes(adapter.name, "cuda", (2, 4))

    def scaled(batch: int):
        shape = BatchShape(batch, 8000, 8)
        rows = tapes.rows(shape, setup, False, True)
        step = scaled_step(adapter, shape, setup, steps=1, optimizer_step=False, rows=rows)
        assert "depth: reduced traces" in step.assumptions[-1]
        return step, rows

    scaled(2), scaled(4)
    replayed, rows = scaled(9)
    assert rows.all_replayed and rows.replayed_rows == 3  # the base, one more layer, the check
    tapes.enabled = False
    traced, rows = scaled(9)
    assert rows.kept and not rows.replayed_rows
    _assert_same_step(replayed, traced)
