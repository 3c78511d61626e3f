"""Each encoder layer's recompute and what it leaves live, marked in a trace without
checkpointing (asrfit.memory.steptime.layer_span).

Reference: traces of the same step with the first one and two layers checkpointed, where
``torch.utils.checkpoint`` really runs the recompute (up to each layer's last saved tensor, its
early stop) and really frees what the layers saved. The kernels they add to the step without
checkpointing are what the marks must count: the same FLOPs exactly, at most the same time
(the checkpoint's own Python around the layer is not counted); and their peaks may fall below
the peak without checkpointing by at most what the marked layers leave live. On each family,
including a pre-norm layer whose last linear is not run again.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from test_trace_tape import CASES, _adapter, _trace  # noqa: E402

from asrfit.memory.setup import Precision, Setup  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.steptime.roofline import StepCost, step_seconds  # noqa: E402
from asrfit.profiles.hardware import HardwareProfile  # noqa: E402
from asrfit.profiles.host import device_rates  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", list(CASES))
def test_the_marks_are_what_checkpointing_runs_again_and_frees(family: str) -> None:
    make, length, labels = CASES[family]
    adapter, shape = _adapter(make()), BatchShape(3, length, labels)
    off, off_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    assert len(off.layer_costs) == len(off.layer_left_bytes) >= 2
    assert all(c.calls > 0 and c.flops > 0 for c in off.layer_costs)
    assert all(left > 0 for left in off.layer_left_bytes)
    rates = device_rates(HardwareProfile.from_name("A10G"))
    for k in (1, 2):
        ckpt, _ = _trace(adapter, shape, Setup(precision=Precision.BF16, checkpoint_layers=k))
        marked = StepCost([r for c in off.layer_costs[:k] for r in c.rows])
        assert ckpt.cost.flops - off.cost.flops == marked.flops
        added = step_seconds(ckpt.cost, rates) - step_seconds(off.cost, rates)
        assert 0 < step_seconds(marked, rates) <= added
        freed = off.forward_backward_peak_bytes - ckpt.forward_backward_peak_bytes
        assert freed <= sum(off.layer_left_bytes[:k])
        assert ckpt.layer_costs == [] and ckpt.layer_left_bytes == []  # its own hooks rule
    # the tape marks the same calls and events
    assert [c.rows for c in off_tape.layer_costs()] == [c.rows for c in off.layer_costs]


def test_a_pre_norm_layers_last_linear_is_not_counted() -> None:
    # whisper's encoder layer ends with fc2 and a residual add, whose output nothing in the
    # layer saves: the recompute stops before fc2, so the mark counts fc1 (the same FLOPs and
    # bytes: one row) once, not twice
    make, length, labels = CASES["whisper"]
    config = make()
    adapter, shape = _adapter(config), BatchShape(2, length, labels)
    off, _ = _trace(adapter, shape, Setup(precision=Precision.BF16))
    rows = shape.batch_size * config.max_source_positions
    ffn = 2 * rows * config.d_model * config.encoder_ffn_dim
    assert sum(r[6] for r in off.layer_costs[0].rows if r[3] == ffn) == 1
    assert sum(r[6] for r in off.cost.rows if r[3] == ffn and r[0] == "forward") == 2 * (
        config.encoder_layers
    )


def test_marking_changes_nothing_the_trace_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    import asrfit.memory.simulate as simulate

    make, length, labels = CASES["wav2vec2"]
    adapter, shape = _adapter(make()), BatchShape(2, length, labels)
    marked, marked_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    spans = simulate.LayerSpans
    monkeypatch.setattr(
        simulate, "LayerSpans", lambda *a, **k: spans(*a, **{**k, "enabled": False})
    )
    plain, plain_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    assert plain.layer_costs == [] and marked.layer_costs
    got, want = marked.to_dict(), plain.to_dict()
    for name in ("trace_seconds", "layer_costs", "layer_left_bytes"):
        got.pop(name), want.pop(name)
    assert got == want
    assert marked_tape.log.events == plain_tape.log.events
    assert marked_tape.calls == plain_tape.calls
