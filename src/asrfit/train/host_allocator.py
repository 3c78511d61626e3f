"""Keep the memory a CPU training process frees, as CUDA's caching allocator does on a GPU.

PyTorch's CPU tensors come from the C library's ``malloc``. With glibc's defaults a large
block (above a threshold that adapts up to 32 MiB) is its own ``mmap`` and goes back to the
kernel when freed, and free memory at the top of the heap is trimmed back too. A training
step frees and allocates the same sizes every step, so each step pays again for the kernel
to fault in and zero every page of those blocks. Measured on a 2-core host
(``bench/host_allocator.py``, ``docs/benchmarks.md``): writing 64 MiB into a fresh tensor
runs at 2.0 GB/s with the defaults and 9.0 GB/s with freed memory kept; a whole
Conformer-CTC step (batch 8 x 350 frames, one thread) shows no speed-up beyond the
run-to-run spread (0.88x and 1.06x in two runs an hour apart, 1.13x in an earlier one).

:func:`keep_freed_host_memory` turns both off through ``mallopt`` (no ``mmap`` for large
blocks, no trimming below 1 GiB of free heap), so that after the first steps every block is
served from pages the process already holds; the resident set then stays at its high-water
mark, the CPU's counterpart of CUDA's reserved memory. The cost is resident memory: large
blocks now share the heap, and batches of varying shapes leave holes in it that no later
block fits: in 6 epochs of the demo run (``asrfit train`` of conformer-ctc-tiny on the
demo corpus) the peak RSS was 3.63 GiB, and 3.76 GiB with a ``malloc_trim`` at each epoch
start, against 2.42 GiB with glibc's defaults (the epoch times of those runs, 13-26 s, moved
more with the shared machine's load than with the setting; commands in docs/benchmarks.md).
It is what the step-time model
assumes (its kernels run at the rates of memory that is already mapped) and what
``asrfit train`` does on a CPU. It applies to the whole process and cannot be undone (glibc
keeps the fixed thresholds once set), so it is done once, by the trainer, and only with glibc;
set ``ASRFIT_HOST_MALLOC=default`` to leave the C library's defaults alone. Intel's and
PyTorch's CPU tuning guides reach the same end by preloading jemalloc or tcmalloc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

logger = logging.getLogger(__name__)

ENV_VAR = "ASRFIT_HOST_MALLOC"
M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_MAX = -4
TRIM_THRESHOLD_BYTES = 1 << 30

_applied: bool | None = None


def keep_freed_host_memory() -> bool:
    """Make glibc ``malloc`` keep freed memory for this process (once; later calls say the same).

    Returns:
        True when the setting is in effect, False where it is not applied: another C library
        (macOS, musl), ``mallopt`` refused, or ``ASRFIT_HOST_MALLOC=default``.
    """
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(ENV_VAR, "").strip().lower() == "default":
        logger.info("%s=default: leaving the C library's malloc settings alone.", ENV_VAR)
        _applied = False
        return _applied
    libc = _glibc()
    if libc is None:
        logger.info("not glibc: the C library's malloc settings are left as they are.")
        _applied = False
        return _applied
    no_mmap = libc.mallopt(M_MMAP_MAX, 0) == 1
    no_trim = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    _applied = no_mmap and no_trim
    if _applied:
        logger.info(
            "glibc malloc keeps freed memory (no mmap per large block, no trim below 1 GiB), "
            "so steps after the first reuse pages already mapped; set %s=default to turn "
            "this off.",
            ENV_VAR,
        )
    else:
        logger.warning("glibc refused mallopt; malloc keeps its defaults.")
    return _applied


def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (it has ``gnu_get_libc_version``)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
