"""Step time from the fake-tensor trace: FLOPs and bytes of every aten op, and a roofline.

:class:`OpCounter` is a dispatch mode entered inside the simulator's
:class:`~asrfit.memory.trace.tracker.StorageTracker`; it sees the same aten calls of the traced
step (forward, loss, backward with checkpointing's recompute, the optimizer step) and keeps,
for each op that runs a kernel:

- its **kind**: matmul (``mm``, ``addmm``, ``bmm``, ``baddbmm``), attention (the fused
  scaled-dot-product kernels), conv, norm, softmax, activation (GELU, SiLU, exp, ...),
  loss, reduction, copy, layout (a copy that changes the memory layout: below), random
  (dropout's ``bernoulli_``: bound by the generator), elementwise, or optimizer (anything
  in the optimizer step or ``zero_grad``);
- its **FLOPs** (``torch.utils.flop_counter``'s formulas; the CPU flash-attention kernels,
  which that table lacks, as ``4 B H L S D`` forward and 2.5x that backward);
- its **bytes moved**: every distinct tensor read or written, at most its storage's size
  (an expanded view reads its storage once);
- how many tensors it touches (a ``_foreach_*`` op over N tensors is N kernels on a CPU,
  about N / 48 fused launches on a GPU).

View ops (outputs that alias an input: ``view``, ``transpose``, ``expand``, ``slice`` ...)
and ``empty`` allocations run no kernel and are not counted.

A copy whose source is laid out in another order than its destination (a transposed
tensor made contiguous) is of kind **layout**: it reads with a stride and runs several
times slower than a streaming copy (``asrfit.profiles.host``: 1.5-7 GB/s against 27-88
GB/s for ``add`` on a 2-core Intel Xeon). Some kernels make such a copy
themselves before they run (:data:`CONTIGUOUS_INPUTS`: layer and group norm, softmax and
convolution call ``.contiguous()`` on their inputs, forward and backward): the copy
happens below the dispatcher, where a fake tensor never sees it, so each non-contiguous
input of those kernels adds a layout row of its own (a wav2vec2 feature encoder's layer
norms between transposes: about a tenth of its CPU step).

The counts are a :class:`~asrfit.memory.steptime.roofline.StepCost`; :mod:`asrfit.memory.steptime.roofline`
(no torch: warm plans time cached costs without importing it) turns them into seconds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from asrfit.memory.steptime.roofline import (  # noqa: F401  (re-exported: the roofline's old home)
    GPU_FOREACH_TENSORS_PER_LAUNCH,
    KINDS,
    RUNTIME_VERSION,
    STEP_PHASES,
    StepCost,
    arithmetic_seconds,
    kernel_counts,
    op_seconds,
    seconds_by_kind,
    step_seconds,
    step_seconds_parts,
)
from asrfit.memory.trace.values import device_query, tensors_in
from asrfit.profiles.rates import runs_kernel

_aten = torch.ops.aten
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul", "dot", "mv"}
_CONV = {"convolution", "convolution_backward", "_convolution", "cudnn_convolution"}
_CONV_PREFIX = ("mkldnn_convolution", "_slow_conv", "slow_conv", "conv_depthwise")
_NORM = (
    "native_layer_norm",
    "native_group_norm",
    "native_batch_norm",
    "_native_batch_norm",
    "batch_norm",
    "_batch_norm",
    "rms_norm",
    "_fused_rms_norm",
)
_SOFTMAX = ("_softmax", "_log_softmax", "softmax", "log_softmax")
_LOSS = ("_ctc_loss", "ctc_loss", "nll_loss", "cross_entropy", "mse_loss", "binary_cross_entropy")
_ACTIVATION = {"gelu", "silu", "tanh", "sigmoid", "exp", "log", "erf", "pow", "sqrt", "rsqrt",
               "softplus", "glu", "elu", "mish", "hardswish", "log_sigmoid_forward",
               "log_sigmoid_backward", "reciprocal", "sin", "cos"}  # fmt: skip
_REDUCTION = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean",
              "norm", "linalg_vector_norm", "prod", "cumsum", "any", "all", "argmax", "argmin",
              "logsumexp", "_local_scalar_dense"}  # fmt: skip
_COPY = {"_to_copy", "copy_", "clone", "cat", "stack", "contiguous", "_copy_from",
         "constant_pad_nd", "index_select", "gather", "scatter", "index", "index_put_",
         "masked_fill", "masked_select", "where", "repeat", "embedding", "embedding_dense_backward",
         "fill_", "zero_", "zeros", "ones", "full", "new_zeros", "new_full", "zeros_like",
         "ones_like", "full_like", "scalar_tensor", "nonzero", "slice_backward",
         "select_backward", "new_empty_strided"}  # fmt: skip
# random number generation (dropout's mask): bound by the generator, not by bandwidth
_RANDOM = {"bernoulli", "native_dropout", "rand", "randn", "rand_like", "randn_like", "normal",
           "uniform", "randint", "randint_like", "randperm", "multinomial", "exponential",
           "geometric", "random", "cauchy", "log_normal"}  # fmt: skip
_ATTENTION_FWD_CPU = "_scaled_dot_product_flash_attention_for_cpu"
# kernels that copy these tensor arguments (by position) into a contiguous layout before
# they run, where they are not already (their CPU and CUDA implementations call
# .contiguous(); tests/test_runtime_layout.py checks each against a real call's copies)
CONTIGUOUS_INPUTS: dict[str, tuple[int, ...]] = {
    "native_layer_norm": (0,),
    "native_layer_norm_backward": (0, 1),
    "native_group_norm": (0,),
    "native_group_norm_backward": (0, 1),
    "_softmax": (0,),
    "_log_softmax": (0,),
    "_softmax_backward_data": (0, 1),
    "_log_softmax_backward_data": (0, 1),
    "convolution": (0,),
    "convolution_backward": (0, 1),
}
_LAYOUT_COPIES = ("copy_", "clone", "_to_copy")


def _dtype_key(dtype: torch.dtype | None) -> str:
    if dtype is torch.bfloat16:
        return "bf16"
    if dtype is torch.float16:
        return "fp16"
    return "fp32"


def op_kind(name: str) -> str:
    """The kind of an aten op from its packet name (``"addmm"``, ``"native_layer_norm"``)."""
    base = name[:-1] if name.endswith("_") and not name.startswith("_foreach") else name
    if base.startswith("_foreach"):
        return "optimizer"
    if base in _MATMUL:
        return "matmul"
    if "attention" in base:
        return "attention"
    if base in _CONV or base.startswith(_CONV_PREFIX):
        return "conv"
    if base.startswith(_NORM):
        return "norm"
    if base.startswith(_SOFTMAX):
        return "softmax"
    if base.startswith(_LOSS):
        return "loss"
    if base in _ACTIVATION or base.removesuffix("_backward") in _ACTIVATION:
        return "activation"
    if base in _RANDOM:
        return "random"
    if base in _REDUCTION:
        return "reduction"
    if base in _COPY or name in _COPY:
        return "copy"
    return "elementwise"


def _tensor_bytes(t: torch.Tensor) -> int:
    numel_bytes = t.numel() * t.element_size()
    try:
        return min(numel_bytes, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return numel_bytes


def _order(t: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of ``t`` longer than 1, from the largest stride to the smallest."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    return tuple(sorted(dims, key=lambda d: -t.stride(d)))


def _needs_layout_copy(t: torch.Tensor) -> bool:
    """True when a kernel that wants contiguous input must copy ``t`` first (a 4-D tensor
    in channels-last order is a convolution's own layout, not copied)."""
    if t.numel() <= 1 or t.is_contiguous():
        return False
    return not (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


def _is_layout_copy(name: str, args: tuple, out: Any) -> bool:
    """True for an explicit copy (``copy_``, ``clone``, ``_to_copy``) whose source is laid
    out in another order than its result."""
    if name not in _LAYOUT_COPIES or not args or not isinstance(args[0], torch.Tensor):
        return False
    src, dst = (args[1], args[0]) if name == "copy_" else (args[0], out)
    if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        return False
    if src.shape != dst.shape or src.numel() <= 1:
        return False
    return _order(src) != _order(dst)


def _cpu_attention_shape(name: str, args: tuple) -> tuple[int, int, int, int, int]:
    """``(batch x heads, query length, key length, head dim, 1 if backward else 0)`` of a
    CPU flash-attention call (checkpointing's recompute runs the forward kernel in the
    backward phase: the kernel, not the phase, says which)."""
    backward = name.endswith("_backward")
    q, k = (args[1], args[2]) if backward else (args[0], args[1])
    b, h, length, d = q.shape
    return int(b * h), int(length), int(k.shape[-2]), int(d), int(backward)


def _cpu_attention_flops(name: str, args: tuple, out: Any) -> int:
    """FLOPs of PyTorch's CPU flash-attention kernels (absent from the flop counter)."""
    q, k = args[0], args[1]
    if name.endswith("_backward"):  # (grad_out, query, key, value, ...)
        q, k = args[1], args[2]
    b, h, length, d = q.shape
    s = k.shape[-2]
    forward = 4 * b * h * length * s * d
    return int(forward * 2.5) if name.endswith("_backward") else forward


class OpCounter(TorchDispatchMode):
    """Count FLOPs and bytes of every kernel of a traced step (enter inside the tracker).

    Args:
        tracker: The simulator's tracker, whose ``phase`` and ``step`` label each op; or
            None (every op is labelled ``phase``, step 1), e.g. to count a real run.
        phase: The phase used without a tracker.
    """

    def __init__(self, tracker: Any = None, phase: str = "forward") -> None:
        super().__init__()
        self.tracker = tracker
        self.default_phase = phase
        self.counts: dict[int, Counter] = {}
        self._module_hook: Any = None
        # calls each kernel stands for (asrfit.memory.trace.lattice: one traced diagonal of a
        # transducer loss's loop counts for its group); None: 1
        self.weight: Any = None
        self.traced: Counter = Counter()  # step -> kernel calls of STEP_PHASES seen, once each
        # every call in order, ``(step, row key, weight)`` (asrfit.memory.tape), when a
        # list is set
        self.calls: list[tuple[int, tuple, int]] | None = None
        # each call's bytes, operand by operand (its row's bytes are their sum; one that
        # counts values negated: _operand), beside calls
        self.operands: list[tuple[int, ...]] = []
        self._reading: int | None = None  # the storage of the latest scalar read (.item())

    def __enter__(self) -> OpCounter:
        # every nn.Module call (the Python a model runs around its kernels; checkpointing's
        # recompute calls them again in backward) is a row of kind "module"
        self._module_hook = torch.nn.modules.module.register_module_forward_pre_hook(
            self._module_called
        )
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._module_hook is not None:
            self._module_hook.remove()
            self._module_hook = None
        super().__exit__(*exc)

    def _module_called(self, module: Any, args: Any) -> None:
        phase = self.tracker.phase if self.tracker is not None else self.default_phase
        step = self.tracker.step if self.tracker is not None else 1
        key = (phase, "module", "fp32", 0, 0, 0, None)
        self.counts.setdefault(step, Counter())[key] += 1
        if self.calls is not None:
            self.calls.append((step, key, 1))
            self.operands.append(())

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        device = device_query(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        weight = 1 if self.weight is None else self.weight()  # before the op allocates
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out, weight)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any, weight: int = 1) -> None:
        if not runs_kernel(func):
            return
        name = func._overloadpacket.__name__
        if name == "_local_scalar_dense":
            # ``.tolist()`` of a fake tensor reads each element in turn; on a device it is one
            # copy to the host: one read per run of reads of one storage
            read = args[0].untyped_storage()._cdata
            if read == self._reading:
                return
            self._reading = read
        else:
            self._reading = None
        phase = self.tracker.phase if self.tracker is not None else self.default_phase
        step = self.tracker.step if self.tracker is not None else 1
        inputs = tensors_in((args, kwargs))
        outputs = tensors_in(out)
        # reads and writes: distinct inputs plus distinct outputs (an in-place op's output
        # is its input, read once and written once)
        operands = [self._operand(t) for t in {id(t): t for t in inputs}.values()]
        operands += [self._operand(t) for t in {id(t): t for t in outputs}.values()]
        nbytes = sum(abs(n) for n in operands)
        kind = "optimizer" if phase in ("optimizer", "zero_grad") else op_kind(name)
        if kind == "copy" and _is_layout_copy(name, args, out):
            kind = "layout"
        flops = 0
        shape = None
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            flops = int(count(*args, **kwargs, out_val=out))
        elif name.startswith(_ATTENTION_FWD_CPU):
            flops = _cpu_attention_flops(name, args, out)
            shape = _cpu_attention_shape(name, args)
        floats = [t for t in inputs if t.is_floating_point()] or outputs
        dtype = _dtype_key(floats[0].dtype if floats else None)
        if floats is outputs and not any(t.is_floating_point() for t in outputs):
            dtype = "int"  # integer / bool only: never records autograd (DeviceRates.fixed_seconds)
        tensors = 1
        if name.startswith("_foreach"):  # one kernel per list element; count the first list
            first = args[0] if args and isinstance(args[0], (list, tuple)) else inputs
            tensors = max(1, len(first))
        key = (phase, kind, dtype, flops, nbytes, tensors, shape)
        keys = [(key, tuple(operands))]
        for i in CONTIGUOUS_INPUTS.get(name, ()):  # the copies the kernel makes itself
            t = args[i] if i < len(args) else None
            if isinstance(t, torch.Tensor) and _needs_layout_copy(t):
                copied = t.numel() * t.element_size()
                row = (phase, "layout", _dtype_key(t.dtype), 0, 2 * copied, 1, None)
                keys.append((row, (copied, copied)))
        counts = self.counts.setdefault(step, Counter())
        for k, parts in keys:
            counts[k] += weight
            if self.calls is not None:
                self.calls.append((step, k, weight))
                self.operands.append(parts)
        calls = len(keys)
        self.traced[step] += calls if phase in STEP_PHASES else 0

    def _operand(self, t: torch.Tensor) -> int:
        """An operand's bytes for :attr:`operands`: negated where its size counts values (its
        storage made by an op PyTorch tags ``dynamic_output_shape``: a boolean-mask index)."""
        nbytes = _tensor_bytes(t)
        made_by = None if self.tracker is None else self.tracker.made_by(t)
        tags = getattr(made_by, "tags", ())
        return -nbytes if torch.Tag.dynamic_output_shape in tags else nbytes

    def cost(self, step: int | None = None, phases: tuple[str, ...] = STEP_PHASES) -> StepCost:
        """The step's kernels (Default: the last step), rows sorted for a stable cache."""
        if not self.counts:
            return StepCost()
        step = max(self.counts) if step is None else step
        return cost_of(self.counts.get(step, Counter()), phases)


def cost_of(counts: Counter, phases: tuple[str, ...] = STEP_PHASES) -> StepCost:
    """A :class:`StepCost` from calls counted by row key (:attr:`OpCounter.counts` of one step),
    rows of ``phases`` only, sorted for a stable cache."""
    rows = [
        [*k[:6], n, *([list(k[6])] if k[6] else [])] for k, n in counts.items() if k[0] in phases
    ]
    rows.sort(key=lambda r: (r[0], r[1], r[2], r[3], r[4], r[5], r[7:]))
    return StepCost(rows)
