"""Pre-flight: run the most memory-hungry batches once before training starts.

In the spirit of icefall's ``scan_pessimistic_batches_for_oom``: before the first optimizer
step, :func:`run_preflight` runs a forward and backward pass (no optimizer step; gradients
are zeroed after) on each of

- ``largest bucket at its limit``: the bucket with the largest predicted peak, filled to its
  batch limit with its longest utterances;
- ``longest utterance``: the longest utterance that is trained on, with the longest others
  of its bucket up to the bucket's limit;
- ``longest transcript``: the utterance with the most labels, likewise (when label lengths
  are known).

Each result gives the predicted peak (``plan.predicted_reserved_bytes``) next to the measured
one (CUDA: ``torch.cuda.max_memory_reserved``). Optimizer states do not exist yet at this
point, so the measured peak lacks them; the batch-dependent part is what this checks, like
with like: the bytes the pass held above what was live before it
(:func:`asrfit.train.held_memory.held_bytes`, on CUDA and on the CPU) less the gradients it
left, against the plan's per-utterance bytes (its cost model less the batch-independent
``c0``) plus what its reserved prediction allows for the allocator and library workspaces.
What is measured above that lowers the bucket limits before the first optimizer step
(:mod:`asrfit.train.preflight_limits`). On an out-of-memory error the failing batch is saved
to ``out_dir/preflight_failed_batch.pt`` and :class:`~asrfit.train.oom.BatchTooLargeError` is
raised, saying which knob to turn.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asrfit.train.held_memory import gradient_bytes, held_bytes
from asrfit.train.oom import KNOBS, BatchTooLargeError, describe_batch, free_memory, is_oom
from asrfit.train.protocols import TrainerLike

if TYPE_CHECKING:
    from asrfit.plan.plan import Plan

logger = logging.getLogger(__name__)

GIB = 2**30
MIB = 2**20


@dataclass
class PessimisticBatch:
    """A batch to try before training.

    Attributes:
        name: What makes it pessimistic ("longest utterance", ...).
        indices: Dataset indices (an index may repeat to fill a bucket to its limit).
        bucket: Its bucket in the plan, or None without a plan.
        predicted_bytes: Predicted peak reserved bytes, or None without a plan.
        predicted_batch_bytes: The plan's batch-dependent bytes of it (its cost model less
            ``c0``), or None without a plan.
        predicted_seconds: The plan's step seconds of a full batch of its bucket, or None
            where the plan does not give them.
        allowance_bytes: What the plan's reserved prediction adds to its traced peak
            (allocator rounding and fragmentation, library workspaces), 0 without a plan.
    """

    name: str
    indices: list[int]
    bucket: int | None = None
    predicted_bytes: int | None = None
    predicted_batch_bytes: int | None = None
    predicted_seconds: float | None = None
    allowance_bytes: int = 0


@dataclass
class PreflightResult:
    """One pre-flight batch that ran.

    Attributes:
        name: See :class:`PessimisticBatch`.
        batch_size: Utterances.
        indices: Dataset indices.
        bucket: Bucket index or None.
        predicted_bytes: Predicted peak reserved bytes, or None.
        measured_bytes: ``max_memory_reserved`` over the pass (CUDA), None on CPU.
        seconds: Wall time of the forward and backward.
        held_bytes: Peak bytes the pass held above what was live before it (CUDA: reserved;
            CPU: the allocator's), None where not measured.
        gradient_bytes: Bytes of the gradients the pass left.
        predicted_batch_bytes: See :class:`PessimisticBatch`.
        predicted_seconds: See :class:`PessimisticBatch`.
        allowance_bytes: See :class:`PessimisticBatch`.
    """

    name: str
    batch_size: int
    indices: list[int]
    bucket: int | None
    predicted_bytes: int | None
    measured_bytes: int | None
    seconds: float
    held_bytes: int | None = None
    gradient_bytes: int = 0
    predicted_batch_bytes: int | None = None
    predicted_seconds: float | None = None
    allowance_bytes: int = 0

    @property
    def excess_bytes(self) -> int | None:
        """Measured batch-dependent bytes (held less gradients) above what the plan allowed
        for them: its batch-dependent prediction plus its allocator and workspace allowance.

        Negative when the pass held less; None without both figures.
        """
        if self.held_bytes is None or self.predicted_batch_bytes is None:
            return None
        allowed = self.predicted_batch_bytes + self.allowance_bytes
        return self.held_bytes - self.gradient_bytes - allowed

    def describe(self) -> str:
        """One line, e.g. ``longest utterance: 5 utt., predicted 12.10 GiB, measured 11.80 GiB``."""
        predicted = "-" if self.predicted_bytes is None else f"{self.predicted_bytes / GIB:.2f} GiB"
        measured = "-" if self.measured_bytes is None else f"{self.measured_bytes / GIB:.2f} GiB"
        text = (
            f"{self.name}: {self.batch_size} utt., predicted {predicted}, measured {measured} "
            f"({self.seconds:.2f} s)"
        )
        if self.held_bytes is not None and self.predicted_batch_bytes is not None:
            text += (
                f"; held {self.held_bytes / MIB:.1f} MiB above its start, of which "
                f"{self.gradient_bytes / MIB:.1f} MiB gradients, against "
                f"{self.predicted_batch_bytes / MIB:.1f} MiB predicted for the batch and "
                f"{self.allowance_bytes / MIB:.1f} MiB allowed for the allocator and workspaces"
            )
        return text


def _fill(
    members: list[int], durations: Sequence[float], limit: int, first: int | None
) -> list[int]:
    """``first`` (if given) plus the longest of ``members``, repeated to reach ``limit``."""
    ordered = sorted(members, key=lambda i: -durations[i])
    if first is not None:
        ordered = [first] + [i for i in ordered if i != first]
    if not ordered:
        return []
    out = ordered[:limit]
    while len(out) < limit:
        out.append(ordered[0])
    return out


def _padded_shape(
    plan: Plan,
    indices: Sequence[int],
    durations: Sequence[float],
    label_lengths: Sequence[int] | None,
) -> tuple[int, int, int]:
    """``(batch, longest input, longest label)`` of a padded batch of these utterances."""
    longest_seconds = max(durations[i] for i in indices)
    if label_lengths is not None:
        label_length = max(int(label_lengths[i]) for i in indices)
    else:
        label_length = math.ceil(longest_seconds * plan.labels_per_second)
    return len(indices), plan.input_length(longest_seconds), label_length


def predict_batch_bytes(
    plan: Plan,
    indices: Sequence[int],
    durations: Sequence[float],
    label_lengths: Sequence[int] | None = None,
) -> int:
    """The plan's predicted reserved bytes of a padded batch of these utterances.

    The batch is ``len(indices)`` copies of its longest input and its longest label
    (``ceil(seconds x plan.labels_per_second)`` without label lengths).
    """
    return plan.predicted_reserved_bytes(*_padded_shape(plan, indices, durations, label_lengths))


def predict_batch_dependent_bytes(
    plan: Plan,
    indices: Sequence[int],
    durations: Sequence[float],
    label_lengths: Sequence[int] | None = None,
) -> int:
    """The plan's bytes of a padded batch that grow with it: its cost model less ``c0``.

    ``c0`` holds the parameters, gradients and optimizer state; the rest (activations,
    inputs, per-utterance workspaces) is what a pre-flight pass holds above the model's
    states, its gradients left out.
    """
    shape = _padded_shape(plan, indices, durations, label_lengths)
    return max(0, int(plan.cost_model.predict(*shape) - plan.cost_model.c0_bytes))


def allowance_bytes(
    plan: Plan,
    indices: Sequence[int],
    durations: Sequence[float],
    label_lengths: Sequence[int] | None = None,
) -> int:
    """What the plan's reserved prediction of this batch adds to its traced peak.

    :func:`asrfit.memory.cuda.allocator.reserved_of_fitted_peak`: the allocator's rounding, pages
    and fragmentation, and the library workspaces (cuBLAS) it counts. A pass may hold that
    much above its traced bytes before it holds more than the plan allowed for.
    """
    from asrfit.memory.cuda.allocator import reserved_of_fitted_peak

    shape = _padded_shape(plan, indices, durations, label_lengths)
    traced = int(plan.cost_model.predict(*shape) + plan.model_state_offset_bytes)
    reserved = reserved_of_fitted_peak(
        traced, architecture=plan.architecture, expandable_segments=plan.expandable_segments
    )
    return max(0, reserved - traced)


def pessimistic_batches(
    durations: Sequence[float],
    *,
    plan: Plan | None = None,
    label_lengths: Sequence[int] | None = None,
    batch_limit: Callable[[float], int] | None = None,
) -> list[PessimisticBatch]:
    """The batches :func:`run_preflight` tries (duplicates, by index set, left out).

    Args:
        durations: Seconds per utterance (dataset order).
        plan: Gives the buckets, their limits and the predictions.
        label_lengths: Labels per utterance, for the longest-transcript batch.
        batch_limit: Without a plan: ``batch_limit(seconds) -> batch size``.

    Returns:
        The batches, in the order above.

    Raises:
        ValueError: Without a plan and without ``batch_limit``, or with no durations.
    """
    if not durations:
        raise ValueError("pessimistic_batches: no durations given.")
    if plan is None and batch_limit is None:
        raise ValueError("pessimistic_batches: give a plan or a batch_limit function.")
    max_seconds = plan.buckets[-1].max_seconds if plan is not None else math.inf
    trained = [i for i, d in enumerate(durations) if d <= max_seconds]
    if not trained:
        return []

    def labels_of(i: int) -> int:
        if label_lengths is not None:
            return int(label_lengths[i])
        assert plan is not None
        return math.ceil(durations[i] * plan.labels_per_second)  # as the sampler assumes

    index_of = (
        {i: plan.bucket_index(durations[i], labels_of(i)) for i in trained}
        if plan is not None
        else {}
    )

    def members_and_limit(index: int) -> tuple[list[int], int, int | None]:
        if plan is None:
            assert batch_limit is not None
            return trained, batch_limit(durations[index]), None
        k = index_of[index]
        assert k is not None
        members = [i for i in trained if index_of[i] == k]
        return members, plan.buckets[k].batch_size, k

    candidates: list[tuple[str, int]] = []
    if plan is not None:
        occupied = set(index_of.values())
        ks = [k for k in range(len(plan.buckets)) if k in occupied]
        worst = max(ks, key=lambda k: (plan.buckets[k].predicted_peak_bytes, k))
        in_worst = [i for i in trained if index_of[i] == worst]
        candidates.append(
            ("largest bucket at its limit", max(in_worst, key=lambda i: durations[i]))
        )
    candidates.append(("longest utterance", max(trained, key=lambda i: durations[i])))
    if label_lengths is not None:
        candidates.append(("longest transcript", max(trained, key=lambda i: label_lengths[i])))

    out: list[PessimisticBatch] = []
    seen: set[tuple[int, ...]] = set()
    for name, index in candidates:
        members, limit, k = members_and_limit(index)
        first = index if name == "longest transcript" else None
        indices = _fill(members, durations, limit, first)
        key = tuple(sorted(indices))
        if not indices or key in seen:
            continue
        seen.add(key)
        if plan is None or k is None:
            out.append(PessimisticBatch(name, indices, k))
            continue
        seconds = plan.buckets[k].predicted_step_seconds
        out.append(
            PessimisticBatch(
                name,
                indices,
                k,
                predict_batch_bytes(plan, indices, durations, label_lengths),
                predict_batch_dependent_bytes(plan, indices, durations, label_lengths),
                seconds if seconds > 0 else None,
                allowance_bytes(plan, indices, durations, label_lengths),
            )
        )
    return out


def run_preflight(
    batches: Sequence[PessimisticBatch],
    *,
    collate: Callable[[list[int]], Any],
    forward_backward: Callable[[Any], None],
    zero_grad: Callable[[], None],
    device: torch.device,
    out_dir: Path | None = None,
    count_gradients: Callable[[], int] | None = None,
) -> list[PreflightResult]:
    """Run each batch's forward and backward once, then zero the gradients.

    Args:
        batches: From :func:`pessimistic_batches`.
        collate: ``collate(indices) -> batch`` on the training device's input format.
        forward_backward: One forward and backward pass of a batch (no optimizer step).
        zero_grad: Clears the gradients afterwards.
        device: Where the model is (peaks are measured there, CUDA and CPU).
        out_dir: Where a failing batch is saved (``preflight_failed_batch.pt``).
        count_gradients: Bytes of the gradients after a pass (Default: 0).

    Returns:
        One :class:`PreflightResult` per batch.

    Raises:
        BatchTooLargeError: A batch ran out of memory (after saving it); the message names the
            batch, its shape, its prediction and the knobs to turn.
    """
    results = []
    cuda = device.type == "cuda"
    for item in batches:
        batch = collate(item.indices)
        started = time.perf_counter()
        failure, held, seconds, grads = None, None, 0.0, 0
        try:
            _, held = held_bytes(partial(forward_backward, batch), device)
            seconds = time.perf_counter() - started
            grads = count_gradients() if count_gradients is not None else 0
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
            failure = exc
        zero_grad()
        if failure is not None:
            saved = _save_failed(batch, item, out_dir)
            predicted = (
                "no prediction"
                if item.predicted_bytes is None
                else f"predicted {item.predicted_bytes / GIB:.2f} GiB"
            )
            message = (
                f"pre-flight: the {item.name!r} batch ({len(item.indices)} utterances, "
                f"{describe_batch(batch)}, bucket {item.bucket}, {predicted}) ran out of memory "
                f"({str(failure).splitlines()[0] if str(failure) else type(failure).__name__}). "
                f"To fit it: {KNOBS}."
                + (f" The batch is saved in {saved}." if saved is not None else "")
            )
            del failure, batch
            free_memory()
            logger.error(message)
            raise BatchTooLargeError(message)
        measured = int(torch.cuda.max_memory_reserved(device)) if cuda else None
        result = PreflightResult(
            item.name,
            len(item.indices),
            list(item.indices),
            item.bucket,
            item.predicted_bytes,
            measured,
            seconds,
            held,
            grads,
            item.predicted_batch_bytes,
            item.predicted_seconds,
            item.allowance_bytes,
        )
        logger.info("pre-flight %s", result.describe())
        results.append(result)
        del batch
    return results


def _save_failed(batch: Any, item: PessimisticBatch, out_dir: Path | None) -> Path | None:
    if out_dir is None:
        return None
    dest = Path(out_dir) / "preflight_failed_batch.pt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.save({"name": item.name, "indices": item.indices, "batch": batch}, dest)
    except Exception as exc:  # noqa: BLE001 - saving is best effort; the OOM is the news
        logger.warning("could not save the failing pre-flight batch to %s: %s", dest, exc)
        return None
    return dest


def preflight_trainer(trainer: TrainerLike) -> list[PreflightResult]:
    """Run :func:`run_preflight` on a trainer's dataset, plan and model.

    Skipped (empty list, logged) when the dataset's durations or lengths are not known.
    """
    info, plan, dataset = trainer.info, trainer.plan, trainer.dataset
    if info.lengths is None or dataset is None:
        logger.info("pre-flight skipped: the dataset's durations are not known.")
        return []
    limit = info.batch_limit
    if plan is None and limit is None:
        fixed = trainer.config.per_device_train_batch_size
        limit = lambda seconds: fixed  # noqa: E731
    batches = pessimistic_batches(
        info.lengths, plan=plan, label_lengths=info.label_lengths, batch_limit=limit
    )
    acc = trainer.accelerator

    def forward_backward(batch: Any) -> None:
        from accelerate.utils import send_to_device

        with acc.no_sync(trainer.model):
            loss_sum, units = trainer.loss_fn(trainer.model, send_to_device(batch, acc.device))
            acc.backward(loss_sum / max(1, int(units)))

    return run_preflight(
        batches,
        collate=lambda indices: trainer.collate_fn([dataset[i] for i in indices]),
        forward_backward=forward_backward,
        zero_grad=lambda: trainer.optimizer.zero_grad(set_to_none=True),
        device=acc.device,
        out_dir=trainer.out_dir,
        count_gradients=lambda: gradient_bytes(trainer.model),
    )
