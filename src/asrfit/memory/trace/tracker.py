"""A dispatch mode that follows every live storage of a traced training step.

:class:`StorageTracker` sits above ``FakeTensorMode``: each aten call passes through it,
each new output storage is recorded with its byte count, and a weak reference tells us
when the storage dies. The result is an event log (allocation, free) from which the peak
and the live set at the peak are recovered afterwards, so categorising costs nothing
during the trace.

Values: the sizes a step allocates can depend on the *values* of small integer tensors
(sequence lengths, label masks). Such tensors get a real shadow copy: when every input
of an op has a known value and the op yields integers or booleans of at most 128 MiB (or
any tensor of at most 4096 elements, e.g. lengths computed in float), it is also run on the
real shadows. Integer and boolean outputs past that, up to 512 MiB, are kept as the op that
makes them and computed when read (:mod:`asrfit.memory.trace.lazy`).
Seeded random ops never get a shadow, so a random draw stays unknown and the trace
stays deterministic. ``.item()``, ``masked_select``, ``nonzero`` and the CTC loss then see the
true lengths. Only values that are unknowable (random coin flips, values computed from
float activations) fall back to the pessimistic rules in :mod:`asrfit.memory.trace.datadep`.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakTensorKeyDictionary

from asrfit.memory.trace import datadep
from asrfit.memory.trace.eventlog import (
    Assumption,
    Block,
    TraceLog,
    stand_in_bytes,
)
from asrfit.memory.trace.lazy import LazyValue, Writes
from asrfit.memory.trace.lazy import returns_alias as _returns_alias
from asrfit.memory.trace.values import device_query, tensors_in, user_frame

# Integer/bool tensors up to this many bytes get a real shadow value held whole (an int64
# tensor of 2^24 elements; a boolean mask of 2^27), and larger ones no larger than an input
# whose value is held (held_size); so do tensors of any dtype up to _MAX_SMALL_SHADOW_NUMEL
# elements (lengths computed in float, scalars). Integer/bool tensors past that and up to
# _MAX_LAZY_BYTES are followed as recipes (asrfit.memory.trace.lazy).
_MAX_SHADOW_BYTES = 1 << 27
_MAX_LAZY_BYTES = 1 << 29
_MAX_SMALL_SHADOW_NUMEL = 4096
_INT_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}


# Binary ops whose backward formula keeps the other operand (``grad * other``,
# ``grad / other``): with a Python number there, that is a wrapped 0-dim tensor.
_SAVES_NUMBER_OPERAND = frozenset(
    {
        torch.ops.aten.mul.Tensor,
        torch.ops.aten.div.Tensor,
        torch.ops.aten.div.Tensor_mode,
    }
)


def _integer_bytes(t: torch.Tensor) -> int:
    """The element size of an integer or boolean tensor; 0 for any other dtype."""
    return t.element_size() if t.dtype in _INT_DTYPES else 0


def shadowable_size(numel: int, integer_bytes: int, held: int = 0) -> bool:
    """Whether a tensor of ``numel`` elements gets a shadow value (held whole or as a recipe:
    :func:`held_size`); ``integer_bytes``: its element size where it holds integers or
    booleans, else 0; ``held``: the bytes of the op's largest integer or boolean input, whose
    value is followed.

    Integer values up to 512 MiB are followed, and larger ones no larger than ``held``: one
    past what is held whole is kept as the op that makes it
    (:class:`asrfit.memory.trace.lazy.LazyValue`) and computed only when read, so the limit
    bounds what one read computes, not what the trace keeps.
    """
    if integer_bytes:
        return numel * integer_bytes <= max(_MAX_LAZY_BYTES, held)
    return numel <= _MAX_SMALL_SHADOW_NUMEL


def held_size(numel: int, integer_bytes: int, held: int = 0) -> bool:
    """Whether a followed tensor's value is computed and held whole (else kept as a recipe).

    ``held``: the bytes of the op's largest integer or boolean input whose value is held
    whole. An integer output no larger than that is held at any size (a padding mask's
    running sum, from which a model reads its lengths, read once per layer): it holds no more
    than the trace already does. An output larger than every held input (a ``(B, T)`` mask
    broadcast to ``(B, 1, T, T)``) is held up to 128 MiB.
    """
    if integer_bytes:
        return numel * integer_bytes <= max(_MAX_SHADOW_BYTES, held)
    return numel <= _MAX_SMALL_SHADOW_NUMEL


# FakeTensorMode's dispatch cache (shared by every mode in the process) rebuilds each output
# of a cached call with its own storage, so that outputs one kernel returns as one storage
# (mkldnn_rnn_layer_backward returns its bias gradient twice) count once on a miss and twice
# on a hit: a trace would hang on what traces ran before it in the process. An op whose first
# call returns a storage twice (an input's aside: views) runs uncached from then on.
_SHARES_OUTPUTS: dict[Any, bool] = {}


def _call(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``, uncached where its outputs share storages."""
    shares = _SHARES_OUTPUTS.get(func)
    if shares is None and len(func._schema.returns) < 2:
        shares = _SHARES_OUTPUTS[func] = False
    if shares is False:
        return func(*args, **kwargs)
    mode = next(
        (t.fake_mode for t in tensors_in((args, kwargs)) if isinstance(t, FakeTensor)), None
    )
    if mode is None:
        return func(*args, **kwargs)
    cached, mode.cache_enabled = mode.cache_enabled, False
    try:
        out = func(*args, **kwargs)
    finally:
        mode.cache_enabled = cached
    if shares is None:
        inputs = {t.untyped_storage()._cdata for t in tensors_in((args, kwargs))}
        made = [t.untyped_storage()._cdata for t in tensors_in(out)]
        made = [cdata for cdata in made if cdata not in inputs]
        _SHARES_OUTPUTS[func] = len(set(made)) < len(made)
    return out


def _mutated_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors an op writes to in place (``Tensor(a!)`` and ``Tensor(a!)[]`` arguments)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    out: list[torch.Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out.extend(tensors_in(value))
    return out


class StorageTracker(TorchDispatchMode):
    """Track live storage bytes (and shadow integer values) of everything computed inside.

    Use inside an active ``FakeTensorMode``. Tensors made before entering are registered
    with :meth:`register` (parameters, buffers, the batch).
    """

    def __init__(self) -> None:
        super().__init__()
        self.log = TraceLog()
        self.phase = "setup"
        self.region = ""  # a label that asrfit.memory.fit.depth's layer hooks move along the model
        self.step = 0
        self.assumptions: list[Assumption] = []
        self.flops = 0  # matmul/conv/attention FLOPs, counted as torch.utils.flop_counter does
        self._ids = itertools.count(1)
        self._keys: dict[int, int] = {}  # storage _cdata -> block key, while alive
        self._refs: dict[int, weakref.ref] = {}
        self._values = WeakTensorKeyDictionary()  # fake tensor -> real tensor or LazyValue
        self._writes = Writes()  # writes to the real values' storages (asrfit.memory.trace.lazy)
        self._handlers = datadep.HANDLERS
        self.scratch: dict[Any, Any] = {}  # op -> rule(args, kwargs, out) -> kernel-internal bytes
        # Count the 0-dim tensors autograd saves for a Python number operand (a CPU target:
        # on a GPU they are host memory); held until :meth:`release_saved_scalars`.
        self.count_saved_scalars = False
        self._saved_scalars: list[int] = []
        # When a list: each choice to shadow an op's outputs or not, where the inputs' values
        # were known: ``(((numel, integer_bytes), ...), held, shadowed)`` (held: the largest
        # integer input's bytes; :func:`shadowable_size`; asrfit.memory.tape)
        self.shadow_sizes: list[tuple[tuple[tuple[int, int], ...], int, bool]] | None = None
        # While shadow_sizes is kept: the choices each shadow value was derived through, and
        # those behind a value that was read (value_of): a choice no read value derives from
        # changes nothing in the trace but which values are kept
        self.read_shadows: set[int] = set()
        self._origins = WeakTensorKeyDictionary()  # fake tensor -> frozenset of choices

    # -- storages ---------------------------------------------------------------
    def _track(self, t: torch.Tensor, tag: str | None = None, op: Any = None) -> int | None:
        st = t.untyped_storage()
        cdata = st._cdata
        key = self._keys.get(cdata)
        if key is not None:
            if tag is not None and self.log.blocks[key].tag is None:
                self.log.blocks[key].tag = tag
            return key
        nbytes = st.nbytes()
        key = next(self._ids)
        self.log.blocks[key] = Block(
            key, nbytes, self.phase, self.step, tag, op, tuple(t.shape), t.dtype, self.region
        )
        self.log.events.append((key, 1))
        self._keys[cdata] = key

        def _on_free(_ref: weakref.ref, key: int = key, cdata: int = cdata) -> None:
            if self._keys.get(cdata) == key:
                del self._keys[cdata]
            self._refs.pop(cdata, None)
            self.log.events.append((key, -1))

        self._refs[cdata] = weakref.ref(st, _on_free)
        return key

    def made_by(self, t: torch.Tensor) -> Any:
        """The op that made ``t``'s storage (None: made outside the tracker's ops)."""
        key = self._keys.get(t.untyped_storage()._cdata)
        return None if key is None else self.log.blocks[key].op

    def register(self, tensors: Any, tag: str) -> None:
        """Count tensors made outside the tracker (parameters, buffers, inputs) under ``tag``."""
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, tag)

    def retag(self, tensors: Any, tag: str) -> None:
        """Give live storages a category learnt after they were made (gradients, optimizer state)."""
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                key = self._track(t)
                if key is not None:
                    self.log.blocks[key].tag = tag

    def transient(self, nbytes: int, label: str) -> None:
        """Account a kernel-internal buffer that lives only during one op (allocated, then freed)."""
        key = next(self._ids)
        self.log.blocks[key] = Block(key, nbytes, self.phase, self.step, f"workspace:{label}")
        self.log.events.append((key, 1))
        self.log.events.append((key, -1))

    def hold(self, like: Block, scale: tuple[int, int], at: int | None = None) -> int | None:
        """Allocate a stand-in block for a storage traced once and repeated
        (:mod:`asrfit.memory.trace.lattice`): ``like``'s bytes times ``scale[0] // scale[1]``,
        categorised like it, at event index ``at`` (Default: now); its key (None where it
        has no bytes). Free it with :meth:`drop`."""
        numerator, denominator = scale
        nbytes = stand_in_bytes(like.nbytes, numerator, denominator)
        if not nbytes:
            return None
        key = next(self._ids)
        self.log.blocks[key] = replace(like, key=key, nbytes=nbytes, shape=())
        self.log.stand_ins[key] = (like.key, numerator, denominator)
        self.log.events.insert(len(self.log.events) if at is None else at, (key, 1))
        return key

    def drop(self, key: int) -> None:
        """Free a block made by :meth:`hold`."""
        self.log.events.append((key, -1))

    def _saved_scalar(self, func: Any, args: tuple) -> None:
        """``x * 0.5`` runs ``mul.Tensor`` with 0.5 wrapped in a 0-dim CPU tensor (8 bytes)
        made below the dispatcher, so no trace sees it; autograd saves it for ``x``'s
        gradient (``mul``, ``div``) until the node runs in backward. Held to the end of the
        backward pass (pessimistic: a node that runs earlier frees it earlier)."""
        numbers = [a for a in args[:2] if isinstance(a, (int, float)) and not isinstance(a, bool)]
        if not numbers or not torch.is_grad_enabled():
            return
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args[:2]):
            return
        key = next(self._ids)
        self.log.blocks[key] = Block(
            key, 8, self.phase, self.step, None, func, (), None, self.region
        )
        self.log.events.append((key, 1))
        self._saved_scalars.append(key)

    def release_saved_scalars(self) -> None:
        """Free the saved Python-number operands (call when a backward pass is over)."""
        for key in self._saved_scalars:
            self.log.events.append((key, -1))
        self._saved_scalars.clear()

    # -- values -------------------------------------------------------------------
    def set_value(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Declare the real value of a fake tensor (a batch's lengths, labels, mask).

        Raises:
            ValueError: When ``real`` is itself fake and carries no constant value.
        """
        if isinstance(real, FakeTensor):
            if real.constant is None:
                raise ValueError(
                    "set_value needs a real tensor; make it inside "
                    "torch._subclasses.fake_tensor.unset_fake_temporarily()."
                )
            real = real.constant
        self._values[fake] = real

    def value_of(self, t: Any) -> Any:
        """The real value behind a fake tensor, ``None`` when unknown; non-tensors pass through.

        For a consumer of values (a data-dependent op's rule, a kernel's branch): while
        :attr:`shadow_sizes` is kept, the choices the value derives from are counted as read."""
        value = self._value(t)
        if value is not None and self.shadow_sizes is not None and isinstance(t, FakeTensor):
            self.read_shadows.update(self._origins.get(t, ()))
        return value

    def _value(self, t: Any) -> Any:
        value = self._stored(t)
        if isinstance(value, LazyValue):
            value = value.value()
            if value is None:  # written since: unknown from now on
                self._lost(t)
        return value

    def _stored(self, t: Any) -> Any:
        """What the tracker keeps for ``t``'s value: a real tensor, a :class:`LazyValue`
        (not computed), None when unknown; non-tensors pass through."""
        if isinstance(t, torch.Tensor):
            if not isinstance(t, FakeTensor):  # a real constant on its way into fake mode
                return t
            value = self._values.get(t)
            if value is None:  # a constant made by torch.tensor(...) inside fake mode
                value = getattr(t, "constant", None)
            elif isinstance(value, LazyValue) and value.written:
                return None
            return value
        return t

    def _lost(self, t: torch.Tensor) -> None:
        """A recipe's inputs were written after it ran: the value is unknown, and the choice to
        follow it counts as not followed (a tape from here replays nowhere it would be kept)."""
        lazy = self._values.pop(t, None)
        choice = getattr(lazy, "choice", None)
        if choice is not None and self.shadow_sizes is not None:
            sizes, held, _ = self.shadow_sizes[choice]
            self.shadow_sizes[choice] = (sizes, held, False)

    def release_values(self) -> None:
        """Drop every real shadow value (call when the trace is over).

        A traced step's fake tensors sit in reference cycles (autograd graph, module hooks)
        that only the cyclic garbage collector frees, and the real values keyed by them
        would live as long: the padded input mask of a planner's large trace (512 x 195,968
        samples, 8 bytes each: 800 MB) stayed resident into the next trace.
        """
        self._values = WeakTensorKeyDictionary()
        self._origins = WeakTensorKeyDictionary()
        self._writes = Writes()

    def assume(self, op: str, rule: str) -> None:
        """Record a pessimistic assumption made where a value could not be known."""
        self.assumptions.append(Assumption(op, rule, user_frame()))

    def _propagate(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outs = tensors_in(out)
        mutated = _mutated_tensors(func, args, kwargs)
        if not any(isinstance(t, FakeTensor) for t in outs + mutated):
            return  # real tensors (a batch's inputs, made outside fake mode) are their values
        seeded = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
        if seeded:
            self._forget(mutated)  # random draws (dropout, layerdrop coin flips) stay unknown
            return
        inputs = tensors_in((args, kwargs))
        stored = {t: self._stored(t) for t in inputs}
        if any(v is None for v in stored.values()):
            self._forget(mutated)
            return
        held = max((t.numel() * _integer_bytes(t) for t in inputs), default=0)
        sizes = tuple((t.numel(), _integer_bytes(t)) for t in outs + mutated)
        shadowable = all(shadowable_size(n, i, held) for n, i in sizes)
        choice = None
        if self.shadow_sizes is not None:
            # a tape's record of each size-bound choice (asrfit.memory.tape): where the
            # inputs' values are known, whether the outputs were small enough to shadow
            choice = len(self.shadow_sizes)
            self.shadow_sizes.append((sizes, held, shadowable))
        if not shadowable:
            self._forget(mutated)
            return
        origin = None
        if choice is not None:
            origin = frozenset({choice}).union(*(self._origins.get(t, ()) for t in inputs))
        whole = max(  # the integer inputs held whole (not recipes)
            (
                t.numel() * _integer_bytes(t)
                for t, v in stored.items()
                if isinstance(v, torch.Tensor)
            ),
            default=0,
        )
        if not mutated and (
            not all(held_size(n, i, whole) for n, i in sizes)
            or (_returns_alias(func) and any(isinstance(v, LazyValue) for v in stored.values()))
        ):
            # past what is held whole (or a view of a recipe): keep the recipe
            def recipe(x: Any) -> Any:
                return stored[x] if isinstance(x, torch.Tensor) else x

            rargs, rkwargs = tree_map(recipe, args), tree_map(recipe, kwargs)
            for i, f in enumerate(outs):
                self._values[f] = LazyValue(func, rargs, rkwargs, i, choice, self._writes)
                if origin is not None:
                    self._origins[f] = origin
            return
        known = True

        def real(x: Any) -> Any:
            nonlocal known
            if isinstance(x, torch.Tensor):
                v = self._value(x)
                if v is None:
                    known = False
                return v
            return x

        rargs, rkwargs = tree_map(real, args), tree_map(real, kwargs)
        written = [stored.get(m) for m in mutated]
        if not known:
            self._forget(mutated)
            return
        with unset_fake_temporarily():
            rkwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in rkwargs.items()}
            try:  # in-place ops mutate the shadows here, keeping them in step
                rout = func(*rargs, **rkwargs)
            except Exception:  # shadow evaluation is best effort; sizes never depend on it failing
                self._forget(mutated)
                return
        for before in written:  # the recipes that read a written value see it moved
            if isinstance(before, LazyValue):
                before.mark_written()
            elif isinstance(before, torch.Tensor):
                self._writes.bump(before)
        routs = tensors_in(rout)
        for f, r in zip(outs, routs, strict=False):
            self._values[f] = r
        if origin is not None:
            for f in outs + mutated:
                self._origins[f] = origin

    def _forget(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self._values.pop(t, None)
            self._origins.pop(t, None)

    # -- dispatch -------------------------------------------------------------------
    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        device = device_query(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        out = (
            handler(self, func, args, kwargs) if handler is not None else _call(func, args, kwargs)
        )
        count = flop_registry.get(func._overloadpacket)
        if count is not None:
            self.flops += count(*args, **kwargs, out_val=out)
        for t in tensors_in(out):
            if isinstance(t, FakeTensor):  # real tensors here are shadow values, not device memory
                self._track(t, op=func)
        if self.count_saved_scalars and func in _SAVES_NUMBER_OPERAND and self.phase == "forward":
            self._saved_scalar(func, args)
        rule = self.scratch.get(func)
        if rule is not None:
            nbytes = rule(args, kwargs, out)
            if nbytes:
                self.transient(nbytes, str(func).replace("aten.", ""))
        self._propagate(func, args, kwargs, out)
        return out
