"""The planner's safety margin, and why it is enough.

A plan fills at most ``HardwareProfile.safety_margin`` of each device's memory (0.85 unless
the user sets it). The headroom left must cover what the prediction can miss:

1. the simulator's own error: the worst **under**-prediction measured against plain real
   steps counted at the allocator (``bench/memory_accuracy.py --heldout``, section
   ``memory-accuracy-heldout`` of ``docs/benchmarks.md``): :data:`WORST_UNDER_PREDICTION_PCT`;
2. CUDA effects the CPU trace models by formula rather than traces (allocator
   fragmentation, library workspaces; ``docs/memory_cuda.md``), checked on a GPU by
   ``bench/validate_gpu.py``.

:func:`applied_margin` returns the usable bytes the planner may fill: the profile's figure,
lowered when its headroom would not even cover item 1, and a sentence for the plan's
``rests_on`` saying which margin was applied and why.
"""

from __future__ import annotations

# Worst under-prediction of the held-out split (percent of the measured peak, as a positive
# number); update it with the benchmark (docs/benchmarks.md, memory-accuracy-heldout).
# The worst measured is -0.45 % (lasr-ctc h56 fp32+ckpt, a case written after the final
# rules); the diagnosis groups are at worst -0.30 %. Kept at 0.5, the worst rounded up.
WORST_UNDER_PREDICTION_PCT = 0.5
SOURCE = "bench/memory_accuracy.py --heldout (docs/benchmarks.md, memory-accuracy-heldout)"


def applied_margin(usable_bytes: int, safety_margin: float) -> tuple[int, str]:
    """Usable bytes after making sure the headroom covers the worst measured under-prediction.

    Args:
        usable_bytes: The hardware profile's usable bytes (device memory x ``safety_margin``).
        safety_margin: The profile's share of device memory a plan may fill (0.5 to 0.98).

    Returns:
        ``(usable bytes the planner fills, the reason in one sentence)``.
    """
    headroom_pct = 100.0 * (1.0 - safety_margin)
    worst = WORST_UNDER_PREDICTION_PCT
    if headroom_pct >= worst:
        return usable_bytes, (
            f"safety margin: plans fill at most {safety_margin:.0%} of device memory; the "
            f"{headroom_pct:.0f} % headroom covers the simulator's worst measured "
            f"under-prediction ({worst:.2f} %, {SOURCE}) and leaves "
            f"{headroom_pct - worst:.1f} % for the CUDA effects modelled by formula "
            "(docs/memory_cuda.md)"
        )
    lowered = int(usable_bytes * (1.0 - worst / 100.0))
    return lowered, (
        f"safety margin: the requested {safety_margin:.0%} leaves {headroom_pct:.1f} % "
        f"headroom, less than the simulator's worst measured under-prediction ({worst:.2f} %, "
        f"{SOURCE}); usable memory lowered by {worst:.2f} % to cover it"
    )
