"""What one setup costs as functions of the batch shape, and the largest batch that fits.

:class:`SetupCosts` is what :class:`asrfit.plan.costs.CostEstimator` fits from traces: the
steady forward/backward peak, the optimizer phase's peak, the model states before and after
sharding, FLOPs and the step-time model's inputs. The planner asks it for each bucket's
largest batch many times, so that search starts from a guess and keeps its answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asrfit.memory.cuda.allocator import peak_within, reserved_of_fitted_peak
from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.memory.steptime.roofline import StepCost


@dataclass
class SetupCosts:
    """Memory and compute of one setup as functions of the batch shape."""

    setup: Setup
    # steady forward/backward peak, unsharded; classic segments' rounding included where the
    # run uses them (CostEstimator._overhead)
    memory: PeakModel
    # steady optimizer-phase peak (segments likewise), unsharded; 0 where the state is
    # offloaded and the step runs on the host
    optimizer_peak_bytes: int
    model_state_bytes: int  # parameters + gradients + optimizer state, unsharded
    sharded_state_bytes: int  # the same after ZeRO/DDP
    flops: PeakModel  # FLOPs of forward + backward
    architecture: str | None = None
    expandable_segments: bool = True
    # (B, T, U, forward + backward kernels) of each traced shape, and the optimizer step's
    # kernels (None where it runs on the host): the step-time model's inputs (asrfit.plan.speed)
    time_points: list[tuple[int, int, int, StepCost]] = field(default_factory=list)
    optimizer_cost: StepCost | None = None
    offloaded_bytes: int = 0  # model states CPU offload keeps in host memory, per process
    # (B, T, U, each encoder layer's recompute, the bytes each leaves live) of each traced
    # shape: what checkpointing costs and frees at most (asrfit.plan.checkpointing.recompute_bound)
    layer_points: list[tuple[int, int, int, list[StepCost], list[int]]] = field(
        default_factory=list
    )

    def traced_peak(self, batch_size: int, input_length: int, label_length: int) -> float:
        """Predicted traced peak (allocated before workspaces) per device."""
        peak = max(
            self.memory.predict(batch_size, input_length, label_length),
            float(self.optimizer_peak_bytes),
        )
        return peak - self.model_state_bytes + self.sharded_state_bytes

    def reserved_bytes(self, batch_size: int, input_length: int, label_length: int) -> int:
        """Predicted ``max_memory_reserved`` per device (see :mod:`asrfit.memory.cuda.allocator`)."""
        peak = int(self.traced_peak(batch_size, input_length, label_length))
        arch, expandable = self.architecture, self.expandable_segments
        return reserved_of_fitted_peak(peak, architecture=arch, expandable_segments=expandable)

    def max_batch(
        self, usable_bytes: int, input_length: int, label_length: int, cap: int = 4096
    ) -> int:
        """Largest batch whose predicted reserved bytes stay within ``usable_bytes`` (0 if none)."""
        key = (usable_bytes, input_length, label_length, cap)
        known = self.__dict__.setdefault("_max_batches", {})  # a plan asks each shape many times
        if key not in known:
            known[key] = self._max_batch(*key)
        return known[key]

    def _max_batch(self, usable_bytes: int, input_length: int, label_length: int, cap: int) -> int:
        def fits(b: int) -> bool:
            return self.reserved_bytes(b, input_length, label_length) <= usable_bytes

        if not fits(1):
            return 0
        # lo fits, hi does not (or is past the cap); both narrowed from a first guess, the
        # batch at which the activations' peak, linear in the batch, meets the budget's peak
        # (the optimizer phase's, constant, fits: batch 1 does)
        lo, hi = 1, cap + 1
        first = self.memory.predict(1, input_length, label_length)
        slope = self.memory.predict(2, input_length, label_length) - first
        base = first - self.model_state_bytes + self.sharded_state_bytes
        room = peak_within(
            usable_bytes,
            architecture=self.architecture,
            expandable_segments=self.expandable_segments,
        )
        guess = min(max(1 + int((room - base) // slope) if slope > 0 else cap, 1), cap)
        guess_fits = fits(guess)
        if not guess_fits:
            # a peak that grows faster at larger batches (partial checkpointing's model, the
            # larger of two lines): guess again along the chord from batch 1 to the miss
            hi = guess
            one = self.traced_peak(1, input_length, label_length)
            rise = self.traced_peak(guess, input_length, label_length) - one
            guess = 1 + int((room - one) * (guess - 1) // rise) if rise > 0 else 1
            guess = min(max(guess, 1), hi - 1)
            guess_fits = fits(guess)
        step = 1
        if guess_fits:  # gallop up from the guess
            lo = guess
            while lo + step < hi and fits(lo + step):
                lo, step = lo + step, step * 2
            hi = min(hi, lo + step)
        else:  # gallop down from it
            hi = guess
            while hi - step > 1 and not fits(hi - step):
                hi, step = hi - step, step * 2
            lo = max(1, hi - step)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo
