"""The first encoder layer's recompute, marked in a trace without checkpointing
(asrfit.memory.steptime.layer_span).

Reference: a trace of the same step with that layer checkpointed, where
``torch.utils.checkpoint`` really runs the recompute (up to the layer's last saved tensor, its
early stop). The kernels it adds to the step without checkpointing are what the mark must
count: the same FLOPs exactly, at most the same time (the checkpoint's own Python around the
layer is not counted), on each family, including a pre-norm layer whose last linear is not
run again.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from test_trace_tape import CASES, _adapter, _trace  # noqa: E402

from asrfit.memory.setup import Precision, Setup  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.steptime.roofline import step_seconds  # noqa: E402
from asrfit.profiles.hardware import HardwareProfile  # noqa: E402
from asrfit.profiles.host import device_rates  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", list(CASES))
def test_the_marked_layer_is_what_checkpointing_it_runs_again(family: str) -> None:
    make, length, labels = CASES[family]
    adapter, shape = _adapter(make()), BatchShape(3, length, labels)
    off, off_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    one, _ = _trace(adapter, shape, Setup(precision=Precision.BF16, checkpoint_layers=1))
    layer = off.first_layer_cost
    assert layer.calls > 0 and layer.flops > 0
    assert one.cost.flops - off.cost.flops == layer.flops
    rates = device_rates(HardwareProfile.from_name("A10G"))
    added = step_seconds(one.cost, rates) - step_seconds(off.cost, rates)
    assert 0 < step_seconds(layer, rates) <= added
    # the tape marks the same calls; a checkpointed step marks none (its own hooks rule there)
    assert off_tape.first_layer_cost().rows == layer.rows
    assert one.first_layer_cost.rows == []


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
    assert sum(r[6] for r in off.first_layer_cost.rows if r[3] == ffn) == 1
    assert sum(r[6] for r in off.cost.rows if r[3] == ffn and r[0] == "forward") == 2 * (
        config.encoder_layers
    )


def test_marking_changes_nothing_the_trace_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    import asrfit.memory.simulate as simulate

    make, length, labels = CASES["wav2vec2"]
    adapter, shape = _adapter(make()), BatchShape(2, length, labels)
    marked, marked_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    span = simulate.FirstLayerSpan
    monkeypatch.setattr(
        simulate, "FirstLayerSpan", lambda *a, **k: span(*a, **{**k, "enabled": False})
    )
    plain, plain_tape = _trace(adapter, shape, Setup(precision=Precision.BF16))
    assert plain.first_layer_cost.rows == [] and marked.first_layer_cost.rows
    got, want = marked.to_dict(), plain.to_dict()
    for name in ("trace_seconds", "first_layer_cost"):
        got.pop(name), want.pop(name)
    assert got == want
    assert marked_tape.log.events == plain_tape.log.events
    assert marked_tape.calls == plain_tape.calls
