"""Simulate one training step on fake tensors and report its peak memory by category.

``simulate_step`` builds the model under ``FakeTensorMode``, then runs forward, loss,
backward and the optimizer step **twice** under a :class:`StorageTracker`: optimizer
state is created on the first step, so the steady-state peak is the second step's.
The peak and the live storages at that instant come from the tracker's event log.

What the trace measures is the *traced* peak: every storage the step keeps alive, at
its exact byte size, in the order the real model code creates and frees them, on CPU
kernels. :mod:`asrfit.memory.cuda.allocator` turns it into CUDA ``allocated``/``reserved``
predictions, and :mod:`asrfit.memory.cuda.zero` shards model states for ZeRO.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from asrfit.memory.peaks import step_memory
from asrfit.memory.setup import Precision, Setup
from asrfit.memory.step import (  # noqa: F401  (StepMemory re-exported)
    CATEGORIES,
    BatchShape,
    StepAdapter,
    StepMemory,
)
from asrfit.memory.steptime.layer_span import LayerSpans
from asrfit.memory.steptime.runtime import OpCounter
from asrfit.memory.tape import Tape
from asrfit.memory.trace.engine import plain_accumulation, plain_composites
from asrfit.memory.trace.eventlog import round_block
from asrfit.memory.trace.kernels import device_kernels
from asrfit.memory.trace.lattice import sample_transducer_loop
from asrfit.memory.trace.optimizers import make_optimizer
from asrfit.memory.trace.scratch import scratch_rules
from asrfit.memory.trace.tracker import StorageTracker
from asrfit.models.checkpointing import checkpoint_first_layers


@contextlib.contextmanager
def _phase(tracker: StorageTracker, name: str) -> Iterator[None]:
    tracker.phase = name
    try:
        yield
    finally:
        tracker.phase = "idle"


def _autocast(setup: Setup) -> contextlib.AbstractContextManager:
    if setup.precision is Precision.BF16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if setup.precision is Precision.FP16:
        return torch.autocast("cpu", dtype=torch.float16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Make ``dtype`` torch's default dtype inside the block (the one a model is built in)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _no_init_kernels() -> Iterator[None]:
    """Fake parameters have no values: skip the initialisers' kernels while a model is built.

    Building a model under the fake mode runs every parameter's initialiser as a fake op, and
    a plan builds a model once per traced depth (XLS-R-1B: about 150 times). They allocate
    nothing, so the trace is the same without them. The initialisers and the modules that import them are
    transformers' own lists (those its ``no_init_weights`` patches), plus its wrappers in
    ``transformers.initialization``; unlike ``no_init_weights``, ``init_weights`` itself
    still runs, and so ties weights.
    """
    from transformers import initialization

    def keep(tensor: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return tensor

    names = [*initialization.TORCH_MODULES_TO_PATCH, "transformers.initialization"]
    modules = [sys.modules[n] for n in names if n in sys.modules]
    saved = [
        (m, n, getattr(m, n))
        for m in modules
        for n in initialization.TORCH_INIT_FUNCTIONS
        if hasattr(m, n)
    ]
    try:
        for m, n, _ in saved:
            setattr(m, n, keep)
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


@contextlib.contextmanager
def _values_released(tracker: StorageTracker) -> Iterator[None]:
    """Drop the tracker's real shadow values when the trace ends, or fails."""
    try:
        yield
    finally:
        tracker.release_values()


def _float_dtype(setup: Setup) -> torch.dtype:
    return torch.bfloat16 if setup.precision is Precision.PURE_BF16 else torch.float32


def _build(adapter: StepAdapter, setup: Setup) -> nn.Module:
    # Pure bf16 builds the weights in bf16 directly (``.to()`` cannot swap fake parameters).
    with default_dtype(_float_dtype(setup)):
        model = adapter.build()
    if setup.gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        elif not adapter.supports_checkpointing:
            raise ValueError(
                f"{adapter.name}: gradient checkpointing is not supported by this model."
            )
    if setup.checkpoint_layers:
        checkpoint_first_layers(model, setup.checkpoint_layers)
    model.train()
    return model


def simulate_step(
    adapter: StepAdapter,
    batch: BatchShape,
    setup: Setup | None = None,
    *,
    target: str = "cuda",
    steps: int = 2,
    prune: Any = None,
    detail: dict | None = None,
    sample_lattice: bool = True,
    optimizer_step: bool = True,
    forward_backward: bool = True,
    keep_tape: list[Tape] | None = None,
) -> StepMemory:
    """Trace ``steps`` training steps on fake tensors and report the last step's peak.

    Args:
        adapter: How to build the model, make a batch and compute the loss
            (see :func:`asrfit.memory.models.adapters.hf_adapter` and :func:`asrfit.memory.simulate_model`).
        batch: Padded batch shape.
        setup: Precision, checkpointing, optimizer (default: fp32 AdamW).
        target: Device whose kernel choices to follow: "cuda" (Default) runs attention
            through the CUDA flash/memory-efficient kernels' shapes; "cpu" runs the CPU kernels
            as they are and adds oneDNN convolution scratch (for checking against a real CPU
            run). See :mod:`asrfit.memory.trace.kernels` and :mod:`asrfit.memory.trace.scratch`.
        steps: Steps to trace (Default: 2; the second is the steady state).
        prune: Called with the built model and the tracker before tracing (e.g. to drop
            repeated layers and label regions, :mod:`asrfit.memory.fit.depth`); None leaves the
            model as built.
        detail: When given, filled with ``regions`` (per ``phase@region`` of the last step:
            its peak, the breakdown there and the rounded sizes of the blocks live there,
            whose segment overhead ``peak_segment_bytes`` adds to the peak) and
            ``peak_region`` (the region of the peak).
        sample_lattice: Trace a TDT loss's loop over its lattice at a few representative
            diagonals (:mod:`asrfit.memory.trace.lattice`); False traces every diagonal.
        optimizer_step: False skips the optimizer step (the gradients are dropped after the
            backward pass), for callers that read only the forward and backward phases.
        forward_backward: False skips the inputs, forward and backward: each trainable
            parameter gets a gradient of its own shape and layout, what backward leaves, and
            the optimizer step runs on them; for callers that read only the optimizer phase
            and the model states, which do not depend on the batch.
        keep_tape: When given, the trace's :class:`~asrfit.memory.trace.tape.Tape` is
            appended to it, for :func:`asrfit.memory.trace.tape.replay`.

    Returns:
        The peak and its breakdown by category.

    Raises:
        ShapeError: When the batch cannot run (e.g. more labels than CTC frames).
    """
    setup = setup or Setup()
    started = time.perf_counter()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    tracker = StorageTracker()
    tracker.scratch = scratch_rules(target, tracker)
    tracker.count_saved_scalars = target == "cpu"
    with fake_mode, _values_released(tracker), contextlib.ExitStack() as kernels:
        with _no_init_kernels():
            model = _build(adapter, setup)
        # after the build, which imports the model's module on a first trace: device_kernels
        # patches the loaded modules' host-side SpecAugment spans
        kernels.enter_context(
            device_kernels(target, setup.precision in (Precision.BF16, Precision.FP16))
        )
        if prune is not None:
            prune(model, tracker)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(setup, params)
        flops_before_last = state_bytes = 0
        counter = OpCounter(tracker)
        if keep_tape is not None:
            counter.calls, tracker.shadow_sizes = [], []
        lattice = sample_transducer_loop(model, tracker) if sample_lattice else None
        if lattice is not None:
            counter.weight = lattice.weight
        checkpointing = setup.gradient_checkpointing or bool(setup.checkpoint_layers)
        spans = LayerSpans(model, counter, tracker, steps, enabled=not checkpointing)
        with tracker, counter, plain_composites(tracker), spans:
            tracker.register(list(model.parameters()), "parameters")
            tracker.register(list(model.buffers()), "buffers")
            for step in range(1, steps + 1):
                tracker.step = step
                flops_before_last = tracker.flops
                if forward_backward:
                    grads = _forward_backward(
                        adapter, model, batch, setup, tracker, lattice, params
                    )
                else:  # what backward leaves, alone
                    grads = _gradients_alone(params, setup, tracker)
                if not optimizer_step:  # forward/backward only: drop the gradients
                    with _phase(tracker, "zero_grad"):
                        optimizer.zero_grad(set_to_none=True)
                    del grads
                    continue
                with _phase(tracker, "optimizer"):
                    optimizer.step()
                    device_state, host_state = _state_tensors(optimizer, target)
                    state_bytes = sum(
                        round_block(t.untyped_storage().nbytes()) for t in device_state
                    )
                    tracker.retag(device_state, "optimizer_state")
                    tracker.retag(host_state, "host")
                    del device_state, host_state
                with _phase(tracker, "zero_grad"):
                    optimizer.zero_grad(set_to_none=True)
                del grads
    assumptions = sorted({f"{a.op}: {a.rule} at {a.where}" for a in tracker.assumptions})
    if lattice is not None and lattice.note():
        assumptions.append(lattice.note())
    figures = {
        "flops": tracker.flops - flops_before_last,
        "traced_calls": counter.traced.get(steps, 0),
        "state_bytes": state_bytes,
        "assumptions": assumptions,
    }
    if keep_tape is not None:
        # the choices a read value derives from, and those not to follow values (a smaller
        # batch could follow them); a choice to follow values nothing read changes nothing
        shadows = [
            choice
            for i, choice in enumerate(tracker.shadow_sizes or [])
            if not choice[-1] or i in tracker.read_shadows
        ]
        calls = counter.calls or []
        tape = Tape.of(
            tracker.log,
            calls,
            batch,
            steps,
            counter.operands,
            spans.spans(),
            shadows=shadows,
            **figures,
        )
        keep_tape.append(tape)
    return step_memory(
        tracker.log,
        adapter.name,
        setup,
        target,
        batch,
        steps,
        detail,
        cost=counter.cost(steps),
        seconds=time.perf_counter() - started,
        layer_costs=spans.costs(),
        layer_events=spans.events(),
        **figures,
    )


def _forward_backward(
    adapter: StepAdapter,
    model: nn.Module,
    batch: BatchShape,
    setup: Setup,
    tracker: StorageTracker,
    lattice: Any,
    params: list[torch.Tensor],
) -> list[torch.Tensor]:
    """Inputs, forward, loss and backward of one step; the gradients it leaves."""
    with _phase(tracker, "inputs"), default_dtype(_float_dtype(setup)):
        inputs = adapter.make_inputs(batch, tracker)
        tracker.register(inputs, "inputs")
    with _phase(tracker, "forward"), _autocast(setup):
        loss = adapter.loss(model, inputs)
    with _phase(tracker, "backward"):
        if setup.precision is Precision.FP16:
            # GradScaler: scale the loss, then unscale the grads in place. Its
            # inf check calls .item() on data, so its ops are replayed here.
            scale = torch.full((), 65536.0)
            scaled = loss.float() * scale
            with plain_accumulation(tracker, [scaled]):
                scaled.backward()
            del scaled
        else:
            with plain_accumulation(tracker, [loss]):
                loss.backward()
        if lattice is not None:
            lattice.release()
        tracker.release_saved_scalars()
        grads = [p.grad for p in params if p.grad is not None]
        tracker.retag(grads, "gradients")
        if setup.precision is Precision.FP16:
            torch._foreach_mul_(grads, 1.0 / 65536.0)
    del loss, inputs
    return grads


def _gradients_alone(
    params: list[torch.Tensor], setup: Setup, tracker: StorageTracker
) -> list[torch.Tensor]:
    """One gradient per trainable parameter, as backward leaves them (loss scale undone)."""
    with _phase(tracker, "backward"):
        for p in params:
            p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        tracker.retag(grads, "gradients")
        if setup.precision is Precision.FP16:
            torch._foreach_mul_(grads, 1.0 / 65536.0)
    return grads


def _state_tensors(optimizer: Any, target: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Optimizer state tensors, split into (device state, host scalars).

    PyTorch keeps AdamW's ``step`` counter as a CPU scalar for CUDA parameters (unless
    ``capturable``/``fused``), so 0-dim ``step`` tensors do not count toward GPU memory. On a
    CPU target the host is the device: they count (4 bytes per parameter tensor, found as
    the measured CPU peaks' excess over the prediction, 0.3-2.9 KB).
    """
    device, host = [], []
    for state in optimizer.state.values():
        for name, v in state.items():
            if isinstance(v, torch.Tensor):
                on_host = name == "step" and v.dim() == 0 and target != "cpu"
                (host if on_host else device).append(v)
    return device, host
