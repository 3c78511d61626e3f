"""Collating dict samples, and choosing the batch sampler of a map-style dataset.

:func:`pad_collate` turns a list of dict samples into one padded batch.
:func:`build_batch_sampler` picks the sampler: with a plan,
:class:`asrfit.data.sampler.MemoryBudgetSampler` (batches sized by the simulator's
predictions); without one, :class:`AnalyticBatchSampler`, sized by the seed trainer's
``alpha_constant`` rule (:func:`analytic_batch_limit`), the fallback.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from asrfit.errors import ConfigError
from asrfit.train.records import MicroBatch

if TYPE_CHECKING:
    from asrfit.plan.plan import Plan
    from asrfit.train.config import TrainingConfig

GIB = 2**30

logger = logging.getLogger(__name__)

#: Padding value per key; every other key pads with 0 (``labels`` -100 is what
#: Hugging Face CTC and seq2seq losses ignore).
PAD_VALUES = {"labels": -100}


def pad_collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Collate dict samples into a batch, padding variable-length values to the longest.

    Per key: tensors, NumPy arrays and lists of numbers become one tensor; when their
    first dimensions differ they are right-padded to the longest with ``PAD_VALUES[key]``
    (``labels``: -100) or 0, and the other dimensions must agree. Python numbers become a
    1-D tensor; strings and anything else stay a list. No key is added: pass lengths or an
    ``attention_mask`` in the samples when the model needs them (every key is padded the same
    way, so an ``attention_mask`` of ones pads with zeros).

    Args:
        samples: Dicts with the same keys.

    Returns:
        The batch, keyed like the samples.

    Raises:
        ConfigError: When samples have different keys or shapes that cannot be padded.
    """
    if not samples:
        raise ConfigError("pad_collate: got an empty list of samples.")
    keys = list(samples[0])
    batch: dict[str, Any] = {}
    for i, sample in enumerate(samples):
        if list(sample) != keys and set(sample) != set(keys):
            raise ConfigError(
                f"pad_collate: sample {i} has keys {sorted(sample)}, sample 0 has {sorted(keys)}; "
                "every sample needs the same keys."
            )
    for key in keys:
        values = [sample[key] for sample in samples]
        batch[key] = _collate_values(key, values)
    return batch


def _collate_values(key: str, values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, (bool, int, float)):
        return torch.tensor(values)
    if not isinstance(first, (torch.Tensor, np.ndarray, list, tuple)):
        return list(values)
    try:
        tensors = [torch.as_tensor(v) for v in values]
    except (TypeError, ValueError, RuntimeError):  # strings, ragged nesting: keep as a list
        return list(values)
    if any(t.dim() == 0 for t in tensors):
        return torch.stack(tensors)
    trailing = {tuple(t.shape[1:]) for t in tensors}
    if len(trailing) > 1:
        raise ConfigError(
            f"pad_collate: {key!r} has shapes {[tuple(t.shape) for t in tensors]}; only the "
            "first dimension may differ between samples."
        )
    longest = max(t.shape[0] for t in tensors)
    pad_value = PAD_VALUES.get(key, 0)
    out = tensors[0].new_full((len(tensors), longest, *tensors[0].shape[1:]), pad_value)
    for row, tensor in enumerate(tensors):
        out[row, : tensor.shape[0]] = tensor
    return out


def sample_length(sample: Any) -> int:
    """Input length of a sample: its ``input_values``/``input_features``/``audio`` length, else
    the longest first dimension among its array values (1 for a sample without arrays)."""
    if not isinstance(sample, Mapping):
        return len(sample) if hasattr(sample, "__len__") else 1
    for key in ("input_values", "input_features", "audio"):
        value = sample.get(key)
        if value is not None and hasattr(value, "__len__"):
            return len(value)
    lengths = [
        len(v)
        for v in sample.values()
        if isinstance(v, (torch.Tensor, np.ndarray, list)) and getattr(v, "ndim", 1) >= 1
    ]
    return max(lengths, default=1)


def analytic_batch_limit(
    length: float,
    *,
    percentile_length: float,
    base_batch_size: int,
    alpha_constant: float,
    parameter_bytes: int,
    budget_bytes: int | None,
) -> int:
    """The seed trainer's batch size for utterances of ``length`` (the no-plan fallback).

    Two rules, the smaller wins:

    - constant padded length per batch: ``base_batch_size`` utterances at the
      ``sequence_length_percentile`` length, so ``base_batch_size x percentile_length / length``;
    - memory: activation bytes per utterance ~ ``alpha_constant x parameter_bytes x length /
      percentile_length``, and the model states (weights, gradients, two AdamW moments:
      ``4 x parameter_bytes``) come off the budget first.

    The ``alpha_constant`` rule is a rough analytic guess kept from the seed; where a plan
    exists, the simulator's per-bucket prediction (``MemoryBudgetSampler``) replaces it.

    Args:
        length: Utterance length (any unit, the same as ``percentile_length``).
        percentile_length: Length at the config's ``sequence_length_percentile``.
        base_batch_size: ``per_device_train_batch_size``.
        alpha_constant: Activation bytes per parameter byte at the percentile length.
        parameter_bytes: Bytes of the model's parameters.
        budget_bytes: Memory budget (``max_memory_gb``), or None for no memory rule.

    Returns:
        The batch size, at least 1.
    """
    ratio = max(float(length), 1e-9) / max(float(percentile_length), 1e-9)
    limit = math.floor(base_batch_size / ratio)
    if budget_bytes is not None:
        free_bytes = budget_bytes - 4 * parameter_bytes
        per_utterance_bytes = alpha_constant * parameter_bytes * ratio
        limit = min(limit, math.floor(free_bytes / max(per_utterance_bytes, 1.0)))
    return max(1, limit)


class AnalyticBatchSampler:
    """Length-grouped batches sized by :func:`analytic_batch_limit` (no plan needed).

    Utterances are shuffled (seeded by ``seed + epoch``), cut into groups of
    ``group_batches x base_batch_size``, each group sorted by length, then packed greedily:
    a batch takes utterances while ``batch size <= limit(longest so far)``.

    Args:
        lengths: Length of each utterance (same unit as the percentile).
        limit: ``limit(length) -> batch size`` (see :func:`analytic_batch_limit`).
        base_batch_size: Group size unit. (Default: 8)
        seed: Shuffle seed. (Default: 0)
        shuffle: Shuffle before grouping. (Default: True)
        num_replicas: Data-parallel processes. (Default: 1)
        rank: This process. (Default: 0)
        group_batches: Batches per sorted group. (Default: 50)
    """

    def __init__(
        self,
        lengths: Sequence[float],
        limit: Callable[[float], int],
        *,
        base_batch_size: int = 8,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        group_batches: int = 50,
    ) -> None:
        if not lengths:
            raise ConfigError("AnalyticBatchSampler: the dataset is empty.")
        self.lengths = [float(x) for x in lengths]
        self.limit = limit
        self.base_batch_size = base_batch_size
        self.seed, self.shuffle = seed, shuffle
        self.num_replicas, self.rank = num_replicas, rank
        self.group_batches = group_batches
        self.epoch = 0
        self.batches_done = 0

    def _all_batches(self) -> list[list[int]]:
        order = np.arange(len(self.lengths))
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(order)
        group = max(1, self.group_batches * self.base_batch_size)
        batches: list[list[int]] = []
        for start in range(0, len(order), group):
            chunk = sorted(order[start : start + group].tolist(), key=lambda i: -self.lengths[i])
            current: list[int] = []
            for index in chunk:
                longest = self.lengths[current[0]] if current else self.lengths[index]
                if current and len(current) + 1 > self.limit(longest):
                    batches.append(current)
                    current = []
                current.append(index)
            if current:
                batches.append(current)
        # Same number of batches on every rank: drop the tail that does not divide.
        usable = len(batches) - len(batches) % self.num_replicas
        return batches[self.rank : usable : self.num_replicas]

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._all_batches()
        while self.batches_done < len(batches):
            batch = batches[self.batches_done]
            self.batches_done += 1
            yield batch

    def __len__(self) -> int:
        return len(self._all_batches())

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a new shuffle)."""
        self.epoch, self.batches_done = epoch, 0

    def state_dict(self) -> dict[str, int]:
        """``epoch``, ``batches_done`` and ``seed``."""
        return {"epoch": self.epoch, "batches_done": self.batches_done, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore :meth:`state_dict`; unknown keys are an error."""
        unknown = set(state) - {"epoch", "batches_done", "seed"}
        if unknown:
            raise ConfigError(
                f"AnalyticBatchSampler.load_state_dict: unknown keys {sorted(unknown)}."
            )
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])
        self.seed = int(state["seed"])


class IndexedDataset(torch.utils.data.Dataset):
    """Wraps a map-style dataset so a batch remembers its indices: item ``i`` is ``(i, dataset[i])``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)


class IndexedCollate:
    """Collate ``(index, sample)`` pairs: returns ``(indices, collate(samples))`` (picklable)."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, pairs: list[tuple[int, Any]]) -> tuple[list[int], Any]:
        return [i for i, _ in pairs], self.collate([s for _, s in pairs])


def load_batches(
    dataset: Any,
    batch_sampler: Any,
    collate: Callable[[list[Any]], Any],
    *,
    num_workers: int = 0,
) -> Iterator[tuple[list[int], Any, int | None]]:
    """Load the batches of a batch sampler: ``(indices, collated batch, bucket or None)``.

    A ``DataLoader`` with its own ``torch.Generator``, so that starting an epoch does not
    draw from the global RNG (an exact resume needs that); the bucket comes from the
    sampler's ``bucket_of`` when it has one.
    """
    from torch.utils.data import DataLoader

    loader = DataLoader(
        IndexedDataset(dataset),
        batch_sampler=batch_sampler,
        collate_fn=IndexedCollate(collate),
        num_workers=num_workers,
        generator=torch.Generator(),
    )
    inner = getattr(batch_sampler, "batch_sampler", batch_sampler)
    bucket_of = getattr(inner, "bucket_of", None)
    for indices, batch in loader:
        yield indices, batch, bucket_of(indices) if callable(bucket_of) else None


class SkipFirst:
    """A batch sampler that leaves out the first ``skip`` batches of another (no data loaded)."""

    def __init__(self, batch_sampler: Any, skip: int) -> None:
        self.batch_sampler, self.skip = batch_sampler, skip

    def __iter__(self) -> Iterator[list[int]]:
        for position, batch in enumerate(self.batch_sampler):
            if position >= self.skip:
                yield list(batch)

    def __len__(self) -> int:
        return max(0, len(self.batch_sampler) - self.skip)


@dataclass
class DataInfo:
    """What the trainer knows about a batch sampler's utterances.

    Attributes:
        durations: Seconds per utterance (predictions, audio seconds per second), or None.
        label_lengths: Labels per utterance, or None.
        lengths: What the sampler sorts by (``durations``, or input lengths without them).
        batch_limit: ``batch_limit(length) -> batch size`` without a plan, for the pre-flight.
    """

    durations: Sequence[float] | None = None
    label_lengths: Sequence[int] | None = None
    lengths: Sequence[float] | None = None
    batch_limit: Callable[[float], int] | None = None


def sampler_info(
    sampler: Any,
    known: DataInfo,
    durations: Sequence[float] | None,
    label_lengths: Sequence[int] | None,
) -> DataInfo:
    """What is known of a batch sampler's utterances: what is given, else what was recorded
    when the sampler was built (``known``), else the sampler's own attributes."""
    durations = first_given(durations, known.durations, getattr(sampler, "durations", None))
    label_lengths = first_given(
        label_lengths, known.label_lengths, getattr(sampler, "label_lengths", None)
    )
    lengths = known.lengths if known.lengths is not None else durations
    return DataInfo(durations, label_lengths, lengths, known.batch_limit)


def length_of(data: Any) -> int | None:
    """``len(data)``, or None for data without a length."""
    try:
        return len(data)
    except TypeError:
        return None


def first_given(*values: Any) -> Any:
    """The first value that is not None (None when all are)."""
    return next((v for v in values if v is not None), None)


def skip_batches(data: Iterable[Any], skip: int) -> Iterator[MicroBatch]:
    """The batches of ``data`` after its first ``skip``, as micro-batches."""
    for position, batch in enumerate(data):
        if position >= skip:
            yield MicroBatch(batch)


def set_dataset_epoch(dataset: Any, epoch: int) -> None:
    """``dataset.set_epoch(epoch)`` when it (or the dataset a ``Subset`` wraps) has it."""
    while dataset is not None:
        method = getattr(dataset, "set_epoch", None)
        if callable(method):
            method(epoch)
            return
        dataset = getattr(dataset, "dataset", None)


def build_batch_sampler(
    dataset: Any,
    *,
    plan: Plan | None,
    config: TrainingConfig,
    parameter_bytes: int,
    durations: Sequence[float] | None = None,
    label_lengths: Sequence[int] | None = None,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> tuple[Any, DataInfo]:
    """The batch sampler of a map-style dataset, sharded for ``rank`` of ``num_replicas``.

    With a plan: a ``MemoryBudgetSampler`` over ``durations`` (without them, each sample's
    input length / ``plan.input_frames_per_second``). Without a plan: an
    :class:`AnalyticBatchSampler` over the durations (else the input lengths), sized by
    :func:`analytic_batch_limit` when ``config.adaptive_batching``, else a fixed
    ``per_device_train_batch_size``.

    Args:
        dataset: A map-style dataset (``len`` and ``[i]``).
        plan: The plan, or None.
        config: The training config.
        parameter_bytes: Bytes of the model's parameters (the analytic rule).
        durations: Seconds per utterance; else read from the samples (logged).
        label_lengths: Labels per utterance.
        seed: Shuffle seed.
        num_replicas: Data-parallel processes.
        rank: This process.

    Returns:
        The sampler and its :class:`DataInfo`.
    """
    lengths: list[float] | None = None
    if durations is None:
        logger.info(
            "reading %d samples to measure their lengths (pass durations= to skip)", len(dataset)
        )
        lengths = [float(sample_length(dataset[i])) for i in range(len(dataset))]
    if plan is not None:
        from asrfit.data.sampler import MemoryBudgetSampler

        if durations is None:
            durations = [n / plan.input_frames_per_second for n in lengths]
        sampler = MemoryBudgetSampler(
            durations,
            plan,
            label_lengths=label_lengths,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
        )
        return sampler, DataInfo(durations, label_lengths, durations)
    lengths = list(durations) if lengths is None else lengths
    base = config.per_device_train_batch_size
    if config.adaptive_batching:
        percentile_length = float(np.percentile(lengths, config.sequence_length_percentile))
        budget = None if config.max_memory_gb is None else int(config.max_memory_gb * GIB)

        def limit(length: float) -> int:
            return analytic_batch_limit(
                length,
                percentile_length=percentile_length,
                base_batch_size=base,
                alpha_constant=config.alpha_constant,
                parameter_bytes=parameter_bytes,
                budget_bytes=budget,
            )
    else:

        def limit(length: float) -> int:
            return base

    sampler = AnalyticBatchSampler(
        lengths, limit, base_batch_size=base, seed=seed, num_replicas=num_replicas, rank=rank
    )
    return sampler, DataInfo(durations, label_lengths, lengths, limit)


def is_map_style(data: Any) -> bool:
    """Whether ``data`` is a map-style dataset (indexable and sized), not a ``DataLoader``
    or a list of batches."""
    from torch.utils.data import DataLoader

    if isinstance(data, (DataLoader, list, tuple)):
        return False
    return hasattr(data, "__getitem__") and hasattr(data, "__len__")
