"""The blocks a trace counts live at its peak add up to the peak, and the segment figure of a
CUDA prediction is the peak plus their rounding, never more.

Reference: the peak is the running sum of the event log, which the CPU memory benchmarks
check against the real allocator; the segment rounding is the closed form of
``asrfit.memory.allocator.segment_bytes`` (2 MiB small segments, 20 MiB mid segments,
large blocks rounded to 2 MiB).
"""

from __future__ import annotations

import transformers

from asrfit.memory.adapters import BatchShape, hf_adapter
from asrfit.memory.allocator import (
    LARGE_ROUND_BYTES,
    MID_BLOCK_MAX_BYTES,
    MID_SEGMENT_BYTES,
    SMALL_SEGMENT_BYTES,
    segment_bytes,
)
from asrfit.memory.simulate import simulate_step
from tests.test_memory_scratch import _bench


def _wav2vec2() -> transformers.Wav2Vec2Config:
    """The accuracy grid's tiny wav2vec2 layout (``bench/_grid.py``), group-normed extractor."""
    return _bench("_grid")._wav2vec2_like(transformers.Wav2Vec2Config, "Wav2Vec2ForCTC")


def test_blocks_live_at_the_peak_add_up_to_it() -> None:
    """Backward accumulates gradients in place; the rewrite that does it frees a block before
    the log allocates it. Such a block cancels the live block of its size it was written
    into, so the sizes add up to the peak (before: 34.3 MiB of blocks at a 32.7 MiB peak,
    for this model at 8 x 4 s, and a segment figure over the peak by those 1.6 MiB plus
    rounding)."""
    detail: dict = {}
    sim = simulate_step(
        hf_adapter(_wav2vec2()), BatchShape(8, 64_000, 20), target="cuda", detail=detail
    )
    sizes = detail["regions"][detail["peak_region"]][2]
    assert sum(sizes) == sim.peak_bytes == sum(sim.breakdown_bytes.values())
    assert sim.peak_segment_bytes == sim.peak_bytes + segment_bytes(sizes) - sum(sizes)
    large = sum(1 for s in sizes if s > MID_BLOCK_MAX_BYTES)
    bound = large * LARGE_ROUND_BYTES + MID_SEGMENT_BYTES + SMALL_SEGMENT_BYTES
    assert sim.peak_bytes <= sim.peak_segment_bytes < sim.peak_bytes + bound
