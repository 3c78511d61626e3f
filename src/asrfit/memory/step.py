"""A training step's description, and what its simulation returns, without torch.

:class:`BatchShape` and :class:`StepAdapter` say what step to trace; :class:`StepMemory`
is what :func:`asrfit.memory.simulate.simulate_step` returns and the simulation cache
stores. Nothing here imports torch: a plan whose simulations are all cached reads them,
and times their kernels (:mod:`asrfit.memory.steptime.roofline`), in a process that never imports it
(about 1.3 s of CPU on a 2-core machine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asrfit.errors import ShapeError
from asrfit.memory.setup import Setup
from asrfit.memory.steptime.roofline import StepCost
from asrfit.profiles.registry import FAMILIES
from asrfit.utils.serialization import JsonDataclass

if TYPE_CHECKING:
    import torch
    from torch import nn

    from asrfit.memory.trace.tracker import StorageTracker

# every family the registry knows, except hand-written "custom" models (simulate_model)
SUPPORTED_FAMILIES = tuple(f for f in FAMILIES if f != "custom")


@dataclass(frozen=True)
class BatchShape(JsonDataclass):
    """A padded batch: ``batch_size`` utterances of ``input_length`` model-input steps.

    ``input_length`` is in the model's input units: audio samples for waveform models,
    feature frames for log-mel models. ``label_length`` is the padded label length (tokens).
    """

    batch_size: int
    input_length: int
    label_length: int

    def __post_init__(self) -> None:
        for name in ("batch_size", "input_length", "label_length"):
            if getattr(self, name) < 1:
                raise ShapeError(f"BatchShape.{name}={getattr(self, name)!r}: must be at least 1.")


@dataclass
class StepAdapter:
    """How to run one training step of a model family.

    Attributes:
        name: Model name for reports.
        build: Builds the module under the active (fake) mode.
        make_inputs: ``(shape, tracker) -> kwargs`` for the module's forward.
        loss: ``(module, kwargs) -> scalar loss``.
        supports_checkpointing: Whether ``gradient_checkpointing_enable`` exists.
        output_frames: ``input_length -> encoder frames`` (for CTC shape checks), or None.
        config: The config ``build`` reads at each call, or None: depth scaling builds at
            reduced depth by lowering its layer counts for a build (:mod:`asrfit.memory.fit.depth`).
    """

    name: str
    build: Callable[[], nn.Module]
    make_inputs: Callable[[BatchShape, StorageTracker], dict[str, Any]]
    loss: Callable[[nn.Module, dict[str, Any]], torch.Tensor]
    supports_checkpointing: bool = True
    output_frames: Callable[[int], int] | None = None
    config: Any = None


_DEFERRED = frozenset(
    ("build", "make_inputs", "loss", "supports_checkpointing", "output_frames", "config")
)


class DeferredAdapter(StepAdapter):
    """A :class:`StepAdapter` made on first use of anything but its name.

    A plan whose simulations are all cached reads only the name, so the model's config (and
    transformers, 0.7 s to import) is never loaded; the first simulation makes the real
    adapter with ``make`` and every later access reads it.
    """

    def __init__(self, name: str, make: Callable[[], StepAdapter]) -> None:  # noqa: D107
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_make", make)
        object.__setattr__(self, "_real", None)

    def __getattribute__(self, attr: str) -> Any:
        if attr in _DEFERRED:
            real = object.__getattribute__(self, "_real")
            if real is None:
                real = object.__getattribute__(self, "_make")()
                object.__setattr__(self, "_real", real)
            return getattr(real, attr)
        return object.__getattribute__(self, attr)

    @property
    def made(self) -> bool:
        """Whether the real adapter was made."""
        return object.__getattribute__(self, "_real") is not None


CATEGORIES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
)


@dataclass
class StepMemory(JsonDataclass):
    """Peak memory of one steady-state training step, as traced on fake tensors.

    Attributes:
        model: Model name.
        setup: The setup simulated (before ZeRO sharding, which is applied by formula).
        batch: The padded batch shape.
        target: Device whose kernels were followed ("cuda" or "cpu").
        peak_bytes: Peak of live storage bytes, each rounded up to 512 bytes as the CUDA
            caching allocator does (``torch.cuda.max_memory_allocated`` semantics, before
            workspaces and the attention-kernel correction).
        peak_raw_bytes: The same peak without rounding (what a CPU allocator sees).
        breakdown_bytes: Category -> rounded bytes live at the peak; sums to ``peak_bytes``.
        step_peaks_bytes: Rounded peak of each simulated step (the first lacks optimizer state).
        peak_phase: Phase at the peak: forward, backward, optimizer or zero_grad.
        largest_transient_bytes: Largest kernel workspace accounted inside one op.
        peak_segment_bytes: CUDA allocator segment bytes at the peak: ``peak_bytes`` plus what
            the segments holding the blocks live there take beyond them
            (:func:`asrfit.memory.cuda.allocator.segment_overhead_bytes`), classic segments.
        peak_expandable_bytes: The same with ``expandable_segments:True``, where only each
            pool's total is rounded to its pages (0 where not counted).
        phase_peaks_bytes: Rounded peak of each phase of the last step (forward, backward,
            optimizer, zero_grad), for cost models that separate batch-dependent phases.
        optimizer_state_bytes: Optimizer state live after the last step (rounded).
        flops: Floating-point operations of the last step's forward and backward
            (``torch.utils.flop_counter``'s formulas on the same trace; includes checkpointing's recompute).
        assumptions: Pessimistic rules used where values were unknowable.
        trace_seconds: Wall time of the simulation.
        cost: FLOPs and bytes of every kernel of the last step (forward, backward, optimizer
            step, zero_grad), for the step-time model (:mod:`asrfit.memory.steptime.roofline`).
        traced_calls: Kernel calls the trace of the last step made; fewer than ``cost``
            counts where one traced call stands for many (:mod:`asrfit.memory.trace.lattice`).
        layer_costs: Per encoder layer, in order, the kernels and module calls of its forward
            pass in the last step up to its last saved tensor: what checkpointing it runs
            again in backward (:mod:`asrfit.memory.steptime.layer_span`). Empty where the
            model has no encoder layer stack or the step checkpoints; only the first where the
            step was scaled from reduced depths.
        layer_left_bytes: Per encoder layer, the rounded bytes its forward pass leaves live
            (the most checkpointing it can free); beside ``layer_costs`` or empty.
    """

    model: str
    setup: Setup
    batch: BatchShape
    target: str
    peak_bytes: int
    peak_raw_bytes: int
    breakdown_bytes: dict[str, int]
    step_peaks_bytes: list[int]
    peak_phase: str
    largest_transient_bytes: int = 0
    peak_segment_bytes: int = 0
    peak_expandable_bytes: int = 0
    phase_peaks_bytes: dict[str, int] = field(default_factory=dict)
    optimizer_state_bytes: int = 0
    flops: int = 0
    assumptions: list[str] = field(default_factory=list)
    trace_seconds: float = 0.0
    cost: StepCost = field(default_factory=StepCost)
    traced_calls: int = 0
    layer_costs: list[StepCost] = field(default_factory=list)
    layer_left_bytes: list[int] = field(default_factory=list)

    @property
    def forward_backward_peak_bytes(self) -> int:
        """The larger of the forward and backward phases' peaks (the batch-dependent part)."""
        phases = self.phase_peaks_bytes
        return max(phases.get("forward", 0), phases.get("backward", 0))

    def segment_bytes(self, expandable: bool = True) -> int:
        """The allocator's segments at the peak: ``peak_expandable_bytes`` with
        ``expandable_segments:True``, else ``peak_segment_bytes`` (``peak_bytes`` where the
        figure was not counted)."""
        figure = self.peak_expandable_bytes if expandable else self.peak_segment_bytes
        return max(figure, self.peak_bytes)

    def segment_overhead_bytes(self, expandable: bool = True) -> int:
        """What the allocator's segments hold beyond ``peak_bytes`` (:meth:`segment_bytes`).

        The planner fits classic segments' overhead with each traced peak: without it,
        wav2vec2-base's bucket limits on a T4 were up to 1.2 % over the usable memory by fresh
        simulations (197 MiB at a 12.7 GiB peak, :mod:`asrfit.plan.costs`). Expandable
        segments' overhead is bounded instead
        (:func:`asrfit.memory.cuda.allocator.reserved_of_fitted_peak`).
        """
        return self.segment_bytes(expandable) - self.peak_bytes
