"""The TDT loss's diagonal loop traced at a few diagonals against the trace of every one.

The reference is the simulator's own full trace of transformers' loss (every anti-diagonal
of the lattice, ``sample_lattice=False``), on a tiny Parakeet-TDT with random weights: the
sampled trace must give the same peak, phase peaks and categories, and the kernel rows of
every diagonal (calls and bytes), while tracing a fraction of the calls.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from asrfit.memory.models.generic import speech_adapter  # noqa: E402
from asrfit.memory.setup import Precision, Setup  # noqa: E402
from asrfit.memory.simulate import simulate_step  # noqa: E402
from asrfit.memory.step import BatchShape  # noqa: E402
from asrfit.memory.trace import lattice  # noqa: E402

_ENCODER = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    num_mel_bins=16,
    subsampling_conv_channels=8,
)


def _adapter():
    config = transformers.ParakeetTDTConfig(
        vocab_size=11,
        blank_token_id=10,
        pad_token_id=2,
        decoder_hidden_size=8,
        encoder_config=dict(_ENCODER),
    )
    return speech_adapter(config)


def test_diagonal_length_counts_the_cells_of_each_anti_diagonal() -> None:
    for frames, labels in [(1, 1), (5, 3), (3, 5), (7, 7), (12, 1), (1, 9)]:
        for n in range(frames + labels - 1):
            cells = sum(1 for t in range(frames) for u in range(labels) if t + u == n)
            assert lattice.diagonal_length(n, frames, labels) == cells, (frames, labels, n)


@pytest.mark.parametrize("frames,labels,head", [(50, 31, 5), (16, 13, 5), (3, 2, 5), (40, 2, 2)])
def test_groups_cover_every_diagonal_once(frames: int, labels: int, head: int) -> None:
    groups = lattice._groups(frames, labels, 6, head)
    covered = [n for _, group in groups for n in group]
    assert covered == list(range(1, frames + labels - 1))
    assert all(rep in group for rep, group in groups)
    assert [g for _, g in groups[:head]] == [[n] for n in range(1, min(head, len(covered)) + 1)]
    assert len(groups) <= head + 6


@pytest.mark.parametrize(
    "batch,setup",
    [
        (BatchShape(3, 256, 20), Setup()),
        (BatchShape(4, 128, 12), Setup(precision=Precision.BF16, gradient_checkpointing=True)),
    ],
    ids=["fp32", "bf16_ckpt"],
)
def test_sampled_loop_gives_the_full_trace(batch: BatchShape, setup: Setup) -> None:
    adapter = _adapter()
    full = simulate_step(adapter, batch, setup, steps=1, sample_lattice=False)
    sampled = simulate_step(adapter, batch, setup, steps=1, sample_lattice=True)
    tol = 1e-3 * full.peak_bytes
    assert abs(sampled.peak_bytes - full.peak_bytes) <= tol
    for phase, nbytes in full.phase_peaks_bytes.items():
        assert abs(sampled.phase_peaks_bytes[phase] - nbytes) <= tol, phase
    for category, nbytes in full.breakdown_bytes.items():
        assert abs(sampled.breakdown_bytes.get(category, 0) - nbytes) <= tol, category
    assert sampled.flops == full.flops
    for phase in ("forward", "backward"):
        a, b = full.cost.select((phase,)), sampled.cost.select((phase,))
        assert b.calls == pytest.approx(a.calls, rel=0.01), phase
        assert b.bytes_moved == pytest.approx(a.bytes_moved, rel=0.01), phase
    assert full.traced_calls == full.cost.calls  # every call traced once
    assert sampled.traced_calls < 0.7 * full.traced_calls
    note = next(a for a in sampled.assumptions if a.startswith("lattice:"))
    traced, total = (int(w) for w in note.split() if w.isdigit())
    assert traced <= 5 + lattice.GROUPS < total  # 5 leading diagonals (durations 0-4)
    assert not any(a.startswith("lattice:") for a in full.assumptions)


def test_a_loss_without_the_loop_is_traced_whole(monkeypatch) -> None:
    """When transformers' loss no longer has the loop the sampler relies on, nothing is
    sampled: every kernel call is traced (and counted) once."""
    adapter = _adapter()
    batch = BatchShape(2, 128, 8)
    sampled = simulate_step(adapter, batch, steps=1)
    assert sampled.traced_calls < sampled.cost.calls
    lattice._has_loop.cache_clear()
    monkeypatch.setattr(lattice, "_LOOP", "for n in range(2, max_t):")
    try:
        whole = simulate_step(adapter, batch, steps=1)
    finally:
        lattice._has_loop.cache_clear()
    assert whole.traced_calls == whole.cost.calls
    assert whole.peak_bytes == sampled.peak_bytes
