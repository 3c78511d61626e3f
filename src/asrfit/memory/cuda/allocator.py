"""From a traced peak to what the CUDA caching allocator and the device will show.

Two predictions, each stating what it includes:

- **allocated** (``torch.cuda.max_memory_allocated``): the traced peak, where every live
  storage is already rounded up to the allocator's 512-byte blocks, plus the cuBLAS
  workspace PyTorch takes from the caching allocator on the first matmul and keeps
  (it is live for the whole run, so it adds to the peak).
- **reserved** (``torch.cuda.max_memory_reserved``): the segments holding the live blocks
  at the peak. With classic segments, blocks of at most 1 MiB share 2 MiB small-pool
  segments, blocks up to 10 MiB come from 20 MiB large-pool segments, and bigger blocks get
  segments rounded up to 2 MiB each. With ``expandable_segments:True`` (asrfit's default)
  each pool's blocks tile one segment that grows by 2 MiB (small pool) or 20 MiB (large
  pool) pages, so only each pool's total is rounded. On top of that, a fragmentation
  allowance (blocks freed in one phase that cannot be reused for the next phase's shapes),
  smaller with expandable segments.

The **device total** adds the CUDA context (kernels, cuBLAS/cuDNN handles), which
``nvidia-smi`` shows but the allocator does not count.

The fragmentation allowances below are starting values, not measurements: the GPU
validation benchmark (``bench/validate_gpu.py``) measures reserved/allocated on real steps
and is where they are calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asrfit.utils.serialization import JsonDataclass

MIB = 1 << 20
SMALL_BLOCK_MAX_BYTES = 1 * MIB
SMALL_SEGMENT_BYTES = 2 * MIB
MID_BLOCK_MAX_BYTES = 10 * MIB
MID_SEGMENT_BYTES = 20 * MIB
LARGE_ROUND_BYTES = 2 * MIB
# With expandable_segments:True each pool keeps one segment per stream that grows by mapping
# pages: 2 MiB pages for the small pool, 20 MiB for the large pool (PyTorch's
# c10/cuda/CUDACachingAllocator.cpp, "Note [Expandable Segments]").
SMALL_PAGE_BYTES = 2 * MIB
LARGE_PAGE_BYTES = 20 * MIB
#: What expandable segments can hold beyond the live blocks: less than one page per pool.
EXPANDABLE_PAGES_BOUND_BYTES = SMALL_PAGE_BYTES + LARGE_PAGE_BYTES

# cuBLAS and cuBLASLt workspaces PyTorch allocates through the caching allocator, per
# stream/handle; configurations differ by architecture. Hopper: 65.0 MiB measured on an
# H200 (torch 2.11.0+cu130: fp32 and bf16 linear forward + backward in a fresh process,
# bench/validate_gpu.py), where NVIDIA recommends 32 MiB for the cuBLAS one
# alone. Other architectures: PyTorch's default configuration (not measured yet).
CUBLAS_WORKSPACE_BYTES = {"hopper": 65 * MIB, "default": 8 * MIB + 8 * 16 * 1024}
CUDA_CONTEXT_BYTES = 512 * MIB  # same allowance the hardware probe uses for its own context

FRAGMENTATION_EXPANDABLE = 0.02  # starting value; calibrate with bench/validate_gpu.py
FRAGMENTATION_CLASSIC = 0.08  # starting value; calibrate with bench/validate_gpu.py


def segment_bytes(block_sizes: list[int]) -> int:
    """Bytes of allocator segments that hold ``block_sizes`` (each already 512-rounded)."""
    small = sum(b for b in block_sizes if b <= SMALL_BLOCK_MAX_BYTES)
    mid = sum(b for b in block_sizes if SMALL_BLOCK_MAX_BYTES < b <= MID_BLOCK_MAX_BYTES)
    large = [b for b in block_sizes if b > MID_BLOCK_MAX_BYTES]
    total = -(-small // SMALL_SEGMENT_BYTES) * SMALL_SEGMENT_BYTES
    total += -(-mid // MID_SEGMENT_BYTES) * MID_SEGMENT_BYTES
    total += sum(-(-b // LARGE_ROUND_BYTES) * LARGE_ROUND_BYTES for b in large)
    return total


def expandable_segment_bytes(block_sizes: list[int]) -> int:
    """Bytes of expandable segments that hold ``block_sizes`` (each already 512-rounded).

    With ``expandable_segments:True`` the blocks of a pool tile one segment per stream, which
    grows by whole pages, so only each pool's total is rounded: the small pool's (blocks of
    at most 1 MiB) to 2 MiB pages, the large pool's to 20 MiB pages. No block gets a segment
    of its own, so nothing is rounded per block (what :func:`segment_bytes` counts for
    classic segments). Holes between blocks and the remainders the allocator does not split
    off a reused block (at most 1 MiB each) depend on the order of past allocations: the
    fragmentation allowance of :func:`reserved_bytes`, not this figure.
    """
    small = sum(b for b in block_sizes if b <= SMALL_BLOCK_MAX_BYTES)
    large = sum(block_sizes) - small
    return -(-small // SMALL_PAGE_BYTES) * SMALL_PAGE_BYTES + (
        -(-large // LARGE_PAGE_BYTES) * LARGE_PAGE_BYTES
    )


def segment_overhead_bytes(block_sizes: list[int], *, expandable: bool = False) -> int:
    """Bytes the segments holding ``block_sizes`` take beyond the blocks themselves
    (classic segments, :func:`segment_bytes`; with ``expandable``, :func:`expandable_segment_bytes`).

    A traced step's segment figure is its peak plus this overhead of the blocks live at the
    peak. Counting :func:`segment_bytes` of the blocks alone would count blocks that the
    in-place accumulation of gradients (:mod:`asrfit.memory.trace.engine`) has freed (wav2vec2-base,
    fp32, batch 64 x 16 s: 44.9 GiB of blocks at a 41.2 GiB peak); adding only the overhead to
    the peak nets them out, and also keeps the figure at the peak where block counts are extrapolated from
    traces at reduced depth (:mod:`asrfit.memory.fit.depth`).
    """
    held = expandable_segment_bytes(block_sizes) if expandable else segment_bytes(block_sizes)
    return held - sum(block_sizes)


def _workspace(architecture: str | None) -> int:
    return CUBLAS_WORKSPACE_BYTES.get(
        (architecture or "").lower(), CUBLAS_WORKSPACE_BYTES["default"]
    )


def reserved_bytes(
    peak_bytes: int,
    peak_segment_bytes: int,
    *,
    architecture: str | None = None,
    expandable_segments: bool = True,
) -> int:
    """:func:`predict_cuda`'s ``reserved_bytes`` alone, without building its explanation.

    The planner asks it tens of thousands of times per plan (each bucket's largest batch).
    """
    workspace = _workspace(architecture)
    frag = FRAGMENTATION_EXPANDABLE if expandable_segments else FRAGMENTATION_CLASSIC
    reserved = int((max(peak_segment_bytes, peak_bytes) + workspace) * (1 + frag))
    return -(-reserved // LARGE_ROUND_BYTES) * LARGE_ROUND_BYTES


def reserved_of_fitted_peak(
    peak_bytes: int, *, architecture: str | None = None, expandable_segments: bool = True
) -> int:
    """:func:`reserved_bytes` of a peak from the planner's fitted model.

    The fit counts classic segments' rounding at each traced peak. Expandable segments'
    pages step by up to 20 MiB as the peak grows (noise to a linear fit, and no trace tells
    where the next page boundary falls between traced shapes), so the fit leaves them out and
    their bound (less than one page per pool, :data:`EXPANDABLE_PAGES_BOUND_BYTES`) is added
    here.
    """
    pages = EXPANDABLE_PAGES_BOUND_BYTES if expandable_segments else 0
    return reserved_bytes(
        peak_bytes,
        peak_bytes + pages,
        architecture=architecture,
        expandable_segments=expandable_segments,
    )


def peak_within(
    reserved_budget: int, *, architecture: str | None = None, expandable_segments: bool = True
) -> float:
    """About the largest traced peak whose :func:`reserved_bytes` stays within the budget.

    The inverse of :func:`reserved_bytes` up to its rounding: a first guess for searches,
    which must check their answer with :func:`reserved_bytes` itself.
    """
    frag = FRAGMENTATION_EXPANDABLE if expandable_segments else FRAGMENTATION_CLASSIC
    whole = reserved_budget // LARGE_ROUND_BYTES * LARGE_ROUND_BYTES
    return whole / (1 + frag) - _workspace(architecture)


@dataclass
class CudaPrediction(JsonDataclass):
    """Predicted CUDA memory for one step on one device.

    Attributes:
        allocated_bytes: Predicted ``max_memory_allocated``.
        reserved_bytes: Predicted ``max_memory_reserved``.
        device_total_bytes: ``reserved_bytes`` plus the CUDA context (what nvidia-smi shows).
        includes: What each figure is made of, in words.
    """

    allocated_bytes: int
    reserved_bytes: int
    device_total_bytes: int
    includes: list[str] = field(default_factory=list)


def predict_cuda(
    peak_bytes: int,
    peak_segment_bytes: int,
    *,
    architecture: str | None = None,
    expandable_segments: bool = True,
) -> CudaPrediction:
    """Turn a traced peak into allocated / reserved / device-total predictions.

    Args:
        peak_bytes: Traced peak with 512-byte rounding (``StepMemory.peak_bytes``).
        peak_segment_bytes: Segment bytes of the blocks live at the peak (``StepMemory.peak_segment_bytes``).
        architecture: GPU architecture name from the catalog (e.g. "hopper"), for the cuBLAS workspace.
        expandable_segments: Whether ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` is set.
    """
    workspace = _workspace(architecture)
    allocated = peak_bytes + workspace
    frag = FRAGMENTATION_EXPANDABLE if expandable_segments else FRAGMENTATION_CLASSIC
    reserved = reserved_bytes(
        peak_bytes,
        peak_segment_bytes,
        architecture=architecture,
        expandable_segments=expandable_segments,
    )
    return CudaPrediction(
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        device_total_bytes=reserved + CUDA_CONTEXT_BYTES,
        includes=[
            f"allocated = traced peak (512-byte blocks) + cuBLAS workspace {workspace / MIB:.0f} MiB",
            "reserved = allocator segments of the blocks live at the peak + workspace, "
            f"x{1 + frag:.2f} fragmentation allowance ({'expandable' if expandable_segments else 'classic'} "
            "segments; starting value, calibrated by bench/validate_gpu.py)",
            f"device total = reserved + CUDA context {CUDA_CONTEXT_BYTES / MIB:.0f} MiB (not counted by torch)",
        ],
    )
