"""Data-dependent operations under fake tensors, each handled explicitly.

Fake tensors carry shapes, not values, so an op whose output size or Python result
depends on values cannot run. The tracker keeps real values for small integer tensors
(lengths, masks, labels); these handlers use them when known, and otherwise apply the
pessimistic rule documented beside each (the one that can only over-predict memory).

| op | known values | unknown values (recorded as an assumption) |
|---|---|---|
| ``.item()`` / ``_local_scalar_dense`` | the real scalar | bool: ``False`` (so a layerdrop coin flip never skips a layer, an ``if x.any()`` guard takes the cheap branch only for checks such as ``labels.max() >= vocab``); int/float: error naming the call site |
| ``masked_select`` | exact count | every element selected |
| ``nonzero`` | exact count | every element non-zero |
| indexing with a boolean mask | exact positions | every position selected |
| CTC loss forward/backward | ``log_alpha``/``log_beta`` sized by the real longest target | longest target = padded label length |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from asrfit.errors import ShapeError
from asrfit.memory.trace.values import ValueTracker, fake_with_value, user_frame

aten = torch.ops.aten


class UnknownValueError(ShapeError):
    """A traced step needed a numeric value that fake tensors cannot provide."""


def _item(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    (t,) = args
    value = tr.value_of(t)
    if value is not None:
        with unset_fake_temporarily():
            return value.item()
    if t.dtype == torch.bool:
        tr.assume("item", "unknown boolean taken as False")
        return False
    raise UnknownValueError(
        f"the traced step reads a {t.dtype} value with .item() that depends on data ({_where()}); "
        "asrfit cannot know it on fake tensors. Pass that value as a plain Python number, or "
        "report the model so a handler can be added."
    )


def _where() -> str:
    return user_frame()


def _masked_select(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    x, mask = args
    mask_value = tr.value_of(mask)
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    if mask_value is not None:
        with unset_fake_temporarily():
            count = int(mask_value.expand(shape).sum())
    else:
        count = shape.numel()
        tr.assume("masked_select", "unknown mask taken as all True")
    return x.new_empty((count,))


def _nonzero(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    (x,) = args
    value = tr.value_of(x)
    if value is not None:
        with unset_fake_temporarily():
            count = int(torch.count_nonzero(value))
    else:
        count = x.numel()
        tr.assume("nonzero", "unknown tensor taken as all non-zero")
    return x.new_empty((count, x.dim()), dtype=torch.long)


def _max_target(tr: ValueTracker, targets: torch.Tensor, target_lengths: Any) -> int:
    lengths = (
        tr.value_of(target_lengths) if isinstance(target_lengths, torch.Tensor) else target_lengths
    )
    if lengths is not None:
        with unset_fake_temporarily():
            return int(max(torch.as_tensor(lengths).tolist(), default=0))
    tr.assume("ctc_loss", "unknown target lengths taken as the padded label length")
    return int(targets.shape[-1]) if targets.dim() == 2 else int(targets.numel())


def _ctc_loss(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    # aten._ctc_loss(log_probs (T,B,C), targets, input_lengths, target_lengths, blank, zero_infinity)
    log_probs, targets, _input_lengths, target_lengths = args[:4]
    t_frames, batch = log_probs.shape[0], log_probs.shape[1]
    states = 2 * _max_target(tr, targets, target_lengths) + 1
    nll = log_probs.new_empty((batch,))
    log_alpha = log_probs.new_empty((batch, t_frames, states))
    return nll, log_alpha


def _ctc_loss_backward(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    # aten._ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, ...)
    log_probs, log_alpha = args[1], args[6]
    # The kernel fills log_beta, shaped like log_alpha, and frees it before returning.
    tr.transient(log_alpha.untyped_storage().nbytes(), "ctc_log_beta")
    return log_probs.new_empty(log_probs.shape)


# Known masks up to this many elements give index tensors with real values; so do known
# masks into a tensor whose value is known (its result's value is then known too). Any
# other mask gives fake index tensors sized by its count alone.
_MAX_VALUED_MASK_NUMEL = 1 << 16


def _mask_count(tr: ValueTracker, mask: torch.Tensor) -> int:
    """True elements of a boolean (or uint8) mask: exact when known, else all of them."""
    value = tr.value_of(mask)
    if value is None:
        tr.assume("boolean indexing", "unknown mask taken as all True")
        return mask.numel()
    with unset_fake_temporarily():
        return int(torch.count_nonzero(value))


def _bool_indices_to_long(tr: ValueTracker, indices: list[Any], valued: bool) -> list[Any]:
    """Replace boolean masks in an index list by the long indices they select.

    Only their count sizes the result: a mask of ``n`` dimensions with ``k`` true elements
    selects ``n`` long index tensors of ``k`` elements, as ``mask.nonzero(as_tuple=True)``
    does. A known mask that is small, or indexes a tensor of known value (``valued``), gives
    the real positions (later ops may read the result); any other mask is counted
    (``count_nonzero``, or every element when unknown) and never expanded into positions
    on the host.
    """
    out: list[Any] = []
    for idx in indices:
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.bool, torch.uint8):
            out.append(idx)
            continue
        value = tr.value_of(idx)
        if idx.dim() == 0 or (
            value is not None and (valued or idx.numel() <= _MAX_VALUED_MASK_NUMEL)
        ):
            if value is None:
                tr.assume("boolean indexing", "unknown mask taken as all True")
            with unset_fake_temporarily():
                if value is None:
                    value = torch.ones(idx.shape, dtype=torch.bool)
                positions = value.bool().nonzero(as_tuple=True)
            out.extend(fake_with_value(tr, p) for p in positions)
            continue
        count = _mask_count(tr, idx)
        # made under the fake mode below the tracker: shapes only, as the real indices are
        # internal to the indexing kernel
        out.extend(idx.new_empty((count,), dtype=torch.long) for _ in range(max(idx.dim(), 1)))
    return out


def _index(tr: ValueTracker, func: Any, args: tuple, kwargs: dict) -> Any:
    x, indices, *rest = args
    if not any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    ):
        return func(*args, **kwargs)
    valued = tr.value_of(x) is not None
    return func(x, _bool_indices_to_long(tr, list(indices), valued), *rest, **kwargs)


HANDLERS: dict[Any, Callable[..., Any]] = {
    aten._local_scalar_dense.default: _item,
    aten.masked_select.default: _masked_select,
    aten.nonzero.default: _nonzero,
    aten._ctc_loss.default: _ctc_loss,
    aten._ctc_loss.Tensor: _ctc_loss,
    aten._ctc_loss_backward.default: _ctc_loss_backward,
    aten._ctc_loss_backward.Tensor: _ctc_loss_backward,
    aten.index.Tensor: _index,
    aten.index_put_.default: _index,
    aten.index_put.default: _index,
    aten._index_put_impl_.default: _index,
}
