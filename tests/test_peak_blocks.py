"""The blocks a trace counts live at its peak add up to the peak, and the segment figure of a
CUDA prediction is the peak plus their rounding, never more.

Reference: the peak is the running sum of the event log, which the CPU memory benchmarks
check against the real allocator; the segment rounding is the closed form of
``asrfit.memory.cuda.allocator.segment_bytes`` (2 MiB small segments, 20 MiB mid segments,
large blocks rounded to 2 MiB; with expandable segments, each pool's total rounded to its
2 MiB or 20 MiB pages).
"""

from __future__ import annotations

import transformers

from asrfit.memory.cuda.allocator import (
    LARGE_ROUND_BYTES,
    MID_BLOCK_MAX_BYTES,
    MID_SEGMENT_BYTES,
    SMALL_SEGMENT_BYTES,
    expandable_segment_bytes,
    segment_bytes,
)
from asrfit.memory.models.adapters import hf_adapter
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from tests.test_memory_scratch import _bench

KIB, MIB = 1 << 10, 1 << 20


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
    # expandable segments: each pool's total rounds to its pages, so the figure is within one
    # small page and one large page of the peak, whatever the number of blocks
    assert sim.peak_expandable_bytes == sim.peak_bytes + expandable_segment_bytes(sizes) - sum(
        sizes
    )
    assert sim.peak_bytes <= sim.peak_expandable_bytes < sim.peak_bytes + 22 * MIB
    assert sim.segment_bytes(True) == sim.peak_expandable_bytes
    assert sim.segment_bytes(False) == sim.peak_segment_bytes


def test_expandable_segments_round_each_pool_total_not_each_block() -> None:
    """Closed form (PyTorch's "Note [Expandable Segments]": one growing segment per pool, in
    2 MiB pages for the small pool and 20 MiB pages for the large pool) against classic
    segments (a 2 MiB small segment, a 20 MiB mid segment, each large block its own segment
    rounded to 2 MiB), for blocks of 512 KiB, 1 MiB, 3 MiB and two of 25 MiB + 512 bytes."""
    sizes = [512 * KIB, MIB, 3 * MIB, 25 * MIB + 512, 25 * MIB + 512]
    # small pool: 1.5 MiB -> one 2 MiB page; large pool: 53 MiB + 1 KiB -> three 20 MiB pages
    assert expandable_segment_bytes(sizes) == 2 * MIB + 60 * MIB
    # classic: 2 MiB small segment, 20 MiB mid segment, 26 MiB for each large block
    assert segment_bytes(sizes) == 2 * MIB + 20 * MIB + 2 * 26 * MIB
    # one byte more per large block costs classic segments nothing more, and 20 MiB pages
    # hold any number of such blocks until the pool's total crosses a page
    assert expandable_segment_bytes([25 * MIB + 512] * 40) == 1000 * MIB + 20 * MIB
    assert segment_bytes([25 * MIB + 512] * 40) == 40 * 26 * MIB
