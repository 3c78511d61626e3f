"""A length-aware batch sampler whose batches fit a memory budget in *predicted bytes*.

Utterances are grouped into the plan's duration buckets (duration x label ranges in a
two-dimensional plan, :meth:`asrfit.plan.plan.Plan.bucket_index`). Each epoch (seed ``seed + epoch``)
every bucket is shuffled; each run of ``sort_pool_batches`` batch limits of it is sorted by
length (like the mega-batches of Hugging Face's ``group_by_length``: a wide bucket pads
little); then it is packed greedily under a :class:`BytesConstraint`. A batch of ``n``
utterances costs ``plan.predicted_reserved_bytes(n, longest input, longest label)``
(padding counts) and holds at most the bucket's batch limit. The constraint is checked
*before* an utterance is admitted, so no batch is ever over budget (a check after adding
lets one last long utterance push a batch past the limit). A bucket's
partial last batch starts the next bucket's packing (its utterances are shorter, so it
fits there too), which saves one small batch per bucket. The batches of all buckets are
then shuffled together.

Distributed training: each global step takes ``num_replicas`` consecutive batches of one
bucket and rank ``r`` takes the ``r``-th, so all ranks are in the same bucket at every step
and their data are disjoint. When a bucket's batch count is not a multiple of
``num_replicas``, its tail batches are, with ``drop_last=False`` (the default), split
(the largest halved, repeatedly; a part of a batch that fits also fits) until each rank
has one: nothing is dropped or repeated, except when a tail has fewer utterances than
ranks, where some are repeated (counted in ``num_repeated``). With ``drop_last=True``
tails are dropped (counted in ``num_dropped``). Partial batches are not carried between
buckets when ``num_replicas > 1``.

Utterances longer than the largest bucket, or over budget on their own, are skipped with a
logged reason and counted in ``skipped`` (long audio is chunked by the dataset, not here).

Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=...)``. With the Hugging
Face ``Trainer``, build it with ``num_replicas=args.world_size, rank=args.process_index``
and override ``get_train_dataloader``::

    class BudgetTrainer(Trainer):
        def get_train_dataloader(self):
            return hf_train_dataloader(self, sampler)  # asrfit.data.hf_loader

An epoch that ends without ``set_epoch`` being called is followed by the next epoch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from asrfit.data.constraint import BytesConstraint
from asrfit.errors import ConfigError

if TYPE_CHECKING:
    from asrfit.plan.plan import Plan

logger = logging.getLogger(__name__)

STATE_VERSION = 1
_STATE_KEYS = frozenset(
    ("version", "seed", "epoch", "batches_yielded", "finished", "num_utterances")
    + ("bucket_utterances", "num_replicas", "shuffle", "drop_last", "sort_pool_batches")
    + ("epoch_limits", "limits", "lowerings")
)

Batch = list[int]
Group = list[Batch]  # one batch per rank, all from one bucket


def _chunks(batch: Batch, limit: int) -> list[Batch]:
    """Split ``batch`` into the fewest near-equal consecutive pieces of at most ``limit``."""
    pieces = math.ceil(len(batch) / limit)
    base, extra = divmod(len(batch), pieces)
    out, start = [], 0
    for k in range(pieces):
        stop = start + base + (1 if k < extra else 0)
        out.append(batch[start:stop])
        start = stop
    return out


def _bucket_ids(plan: Plan, seconds: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each utterance's bucket (``plan.bucket_index``, vectorised); ``len(buckets)`` above the largest.

    The first duration range whose edge is at least the duration; in a two-dimensional plan,
    within it the first label range whose edge is at least the labels (the last range for
    longer transcripts).
    """
    buckets = plan.buckets
    edges = np.array([b.max_seconds for b in buckets])
    first = np.searchsorted(edges, seconds, side="left").astype(np.int64)
    if not plan.is_two_dimensional:
        return first
    ids = np.full(seconds.shape, len(buckets), dtype=np.int64)
    for start in np.unique(first[first < len(buckets)]).tolist():
        stop = int(np.searchsorted(edges, edges[start], side="right"))
        label_edges = np.array([b.max_label_length for b in buckets[start:stop]])
        rows = first == start
        offset = np.searchsorted(label_edges, labels[rows], side="left")
        ids[rows] = start + np.minimum(offset, stop - start - 1)
    return ids


def _halve_to(batches: list[Batch], count: int) -> list[Batch] | None:
    """Halve the largest batch until there are ``count``; None if too few utterances."""
    out = [list(b) for b in batches]
    while len(out) < count:
        i = max(range(len(out)), key=lambda j: len(out[j]))
        if len(out[i]) < 2:
            return None
        half = (len(out[i]) + 1) // 2
        out[i : i + 1] = [out[i][:half], out[i][half:]]
    return out


class MemoryBudgetSampler:
    """Yield lists of dataset indices, each a micro-batch whose predicted bytes fit the plan.

    Args:
        durations: Seconds of each utterance, in dataset order.
        plan: The plan (buckets, cost model, usable bytes, input and label rates).
        label_lengths: Labels per utterance (Default: ``ceil(duration * plan.labels_per_second)``).
        seed: Shuffling seed; epoch ``e`` uses ``seed + e``. (Default: 0)
        shuffle: Shuffle within buckets and mix the buckets' batches. (Default: True)
        num_replicas: Data-parallel processes. (Default: 1)
        rank: This process's index in ``[0, num_replicas)``. (Default: 0)
        drop_last: Drop each bucket's tail batches that cannot give every rank one, instead of
            splitting them. (Default: False)
        sort_pool_batches: Sort each run of this many batch limits of a shuffled bucket by
            length before packing; 0 packs in shuffled order. (Default: 4)

    Raises:
        ConfigError: On a bad duration, label length, seed or rank.
    """

    def __init__(
        self,
        durations: Sequence[float],
        plan: Plan,
        *,
        label_lengths: Sequence[int] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
        sort_pool_batches: int = 4,
    ) -> None:
        seconds = np.asarray(durations, dtype=float).reshape(-1)
        bad = np.flatnonzero(~np.isfinite(seconds) | (seconds <= 0))
        if bad.size:
            raise ConfigError(
                f"MemoryBudgetSampler: durations[{bad[0]}] = {seconds[bad[0]]!r}; every duration must be "
                "a positive number of seconds (fix or drop that utterance)."
            )
        if label_lengths is None:
            labels = np.ceil(seconds * plan.labels_per_second).astype(np.int64)
        else:
            labels = np.asarray(label_lengths).reshape(-1)
            if labels.shape != seconds.shape:
                raise ConfigError(
                    f"MemoryBudgetSampler: {labels.size} label_lengths for {seconds.size} durations; "
                    "give one per utterance."
                )
            wrong = np.flatnonzero((labels < 0) | (labels != np.round(labels)))
            if wrong.size:
                raise ConfigError(
                    f"MemoryBudgetSampler: label_lengths[{wrong[0]}] = {labels[wrong[0]]!r}; use a "
                    "non-negative whole number."
                )
            labels = labels.astype(np.int64)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"MemoryBudgetSampler: seed={seed!r}; use a non-negative integer.")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ConfigError(
                f"MemoryBudgetSampler: rank={rank}, num_replicas={num_replicas}; need "
                "num_replicas >= 1 and 0 <= rank < num_replicas."
            )
        if sort_pool_batches < 0:
            raise ConfigError(
                f"MemoryBudgetSampler: sort_pool_batches={sort_pool_batches}; use 0 (off) or more."
            )
        self.plan = plan
        self.sort_pool_batches = int(sort_pool_batches)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._inputs = np.array([plan.input_length(s) for s in seconds], dtype=np.int64)
        self._labels = labels
        self._limits = [b.batch_size for b in plan.buckets]
        self._bucket_ids, self._members, self.skipped = self._assign(seconds)
        self.skipped_indices = np.flatnonzero(self._bucket_ids < 0).tolist()
        self._epoch_limits = list(self._limits)
        self._lowerings: list[list[int]] = []
        self._groups: list[Group] | None = None
        self._position = 0
        self._resume_pending = False
        self._finished = False
        self.num_dropped = 0
        self.num_repeated = 0

    # --- setup -------------------------------------------------------------------------------
    def _assign(self, seconds: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], dict[str, int]]:
        edges = np.array([b.max_seconds for b in self.plan.buckets])
        ids = _bucket_ids(self.plan, seconds, self._labels)
        skipped: dict[str, int] = {}
        too_long = ids >= len(edges)
        if too_long.any():
            reason = f"longer than the largest bucket ({edges[-1]:g} s)"
            skipped[reason] = int(too_long.sum())
        ids[too_long] = -1
        alone = BytesConstraint(self.plan, 1)
        over = [
            i
            for i in np.flatnonzero(ids >= 0).tolist()
            if alone.would_exceed(int(self._inputs[i]), int(self._labels[i]))
        ]
        if over:
            skipped["over the memory budget on its own"] = len(over)
            ids[over] = -1
        for reason, count in skipped.items():
            logger.warning("MemoryBudgetSampler: skipping %d utterance(s): %s.", count, reason)
        members = [np.flatnonzero(ids == b) for b in range(len(edges))]
        return ids, members, skipped

    # --- building an epoch -------------------------------------------------------------------
    def _pack(self, order: Sequence[int], limit: int) -> list[Batch]:
        """Greedy batches of ``order`` under the byte budget and ``limit``."""
        constraint = BytesConstraint(self.plan, limit)
        batches: list[Batch] = []
        current: Batch = []
        for i in order:
            t, u = int(self._inputs[i]), int(self._labels[i])
            if not constraint.try_add(t, u):
                batches.append(current)
                constraint.reset()
                current = []
                constraint.add(t, u)  # fits alone: checked in _assign
            current.append(int(i))
        if current:
            batches.append(current)
        return batches

    def _to_groups(self, batches: list[Batch], drop_tail: bool) -> list[Group]:
        """Cut one bucket's batches into groups of ``num_replicas``, handling the tail."""
        r = self.num_replicas
        full = len(batches) // r * r
        groups = [batches[i : i + r] for i in range(0, full, r)]
        tail = batches[full:]
        if not tail:
            return groups
        if drop_tail:
            self.num_dropped += sum(len(b) for b in tail)
            return groups
        split = _halve_to(tail, r)
        if split is None:  # fewer utterances than ranks: repeat some (documented)
            utterances = [i for b in tail for i in b]
            split = [[utterances[k % len(utterances)]] for k in range(r)]
            self.num_repeated += r - len(utterances)
        groups.append(split)
        return groups

    def _order(self, members: np.ndarray, limit: int, rng: np.random.Generator) -> list[int]:
        """A bucket's utterances: shuffled, then sorted by length within pools."""
        order = members.copy()
        if self.shuffle:
            rng.shuffle(order)
        if self.sort_pool_batches:
            pool = self.sort_pool_batches * limit
            runs = np.split(order, np.arange(pool, order.size, pool))
            order = np.concatenate(
                [run[np.argsort(self._inputs[run], kind="stable")] for run in runs]
            )
        return order.tolist()

    def _is_open(self, batch: Batch, limit: int) -> bool:
        """Whether one more utterance as long as the batch's longest would still fit."""
        constraint = BytesConstraint(self.plan, limit)
        for i in batch:
            constraint.add(int(self._inputs[i]), int(self._labels[i]))
        return not constraint.close_to_exceeding()

    def _build(self, epoch: int, limits: list[int]) -> list[Group]:
        self.num_dropped = 0
        self.num_repeated = 0
        rng = np.random.default_rng(self.seed + epoch)
        groups: list[Group] = []
        carry: Batch = []
        last = len(self._members) - 1
        for b, members in enumerate(self._members):
            batches = self._pack(carry + self._order(members, limits[b], rng), limits[b])
            carry = []
            if (
                self.num_replicas == 1
                and b < last
                and batches
                and len(batches[-1]) <= limits[b + 1]
                and self._is_open(batches[-1], limits[b])
            ):
                carry = batches.pop()  # a partial last batch starts the next bucket's first
            groups += self._to_groups(batches, self.drop_last)
        if self.shuffle:
            groups = [groups[i] for i in rng.permutation(len(groups))]
        return groups

    def _apply_lowering(self, start_group: int, bucket: int, limit: int) -> None:
        """Split the not-yet-started groups of ``bucket`` whose batches exceed ``limit``."""
        assert self._groups is not None
        out = self._groups[:start_group]
        for group in self._groups[start_group:]:
            if self._bucket_ids[group[0]].max() != bucket or max(len(b) for b in group) <= limit:
                out.append(group)
                continue
            pieces = [piece for batch in group for piece in _chunks(batch, limit)]
            out += self._to_groups(pieces, drop_tail=False)
        self._groups = out

    def _schedule(self) -> list[Group]:
        if self._groups is None:
            self._groups = self._build(self.epoch, self._epoch_limits)
            for start, bucket, limit in self._lowerings:
                self._apply_lowering(start, bucket, limit)
        return self._groups

    # --- the sampler protocol ----------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its shuffle uses ``seed + epoch``) from its first batch."""
        if epoch < 0:
            raise ConfigError(f"MemoryBudgetSampler.set_epoch({epoch}): use a non-negative epoch.")
        self.epoch = int(epoch)
        self._epoch_limits = list(self._limits)
        self._lowerings = []
        self._groups = None
        self._position = 0
        self._resume_pending = False
        self._finished = False

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch."""
        return len(self._schedule())

    def __iter__(self) -> Iterator[Batch]:
        """Yield this rank's batches; a finished epoch without ``set_epoch`` moves to the next."""
        if self._finished:
            self.set_epoch(self.epoch + 1)
        if not self._resume_pending:
            self._position = 0
        self._resume_pending = False
        while self._position < len(self._schedule()):
            batch = self._schedule()[self._position][self.rank]
            self._position += 1
            yield list(batch)
        self._finished = True

    # --- feedback from the trainer -------------------------------------------------------------
    def bucket_of(self, batch: Sequence[int]) -> int:
        """Index into ``plan.buckets`` of a batch (of its longest utterance).

        Raises:
            ConfigError: On an empty batch or an index that is skipped or out of range.
        """
        if len(batch) == 0:
            raise ConfigError("MemoryBudgetSampler.bucket_of: the batch is empty.")
        index = np.asarray(batch, dtype=np.int64)
        if index.min() < 0 or index.max() >= self._bucket_ids.size:
            raise ConfigError(
                f"MemoryBudgetSampler.bucket_of: indices must be in [0, {self._bucket_ids.size}), got {list(batch)}."
            )
        ids = self._bucket_ids[index]
        if (ids < 0).any():
            raise ConfigError(
                f"MemoryBudgetSampler.bucket_of: index {int(index[ids < 0][0])} was skipped (in no bucket)."
            )
        return int(ids.max())

    def limit(self, bucket_index: int) -> int:
        """The current batch limit of a bucket."""
        return self._limits[bucket_index]

    def lower_limit(self, bucket_index: int, new_batch_size: int) -> None:
        """Lower a bucket's batch limit from the next batch not yet handed out, for good.

        Batches of that bucket still to come are split to the new limit (in a way that keeps
        every rank at the same bucket, so call it on every rank at the same step). A
        prefetching ``DataLoader`` may already hold a few batches made under the old limit.

        Raises:
            ConfigError: On an unknown bucket or a limit below 1.
        """
        if not 0 <= bucket_index < len(self._limits):
            raise ConfigError(
                f"lower_limit: bucket_index={bucket_index}; the plan has {len(self._limits)} buckets."
            )
        if new_batch_size < 1:
            raise ConfigError(f"lower_limit: new_batch_size={new_batch_size}; use 1 or more.")
        if new_batch_size >= self._limits[bucket_index]:
            logger.debug(
                "lower_limit: bucket %d already at %d.", bucket_index, self._limits[bucket_index]
            )
            return
        logger.info(
            "MemoryBudgetSampler: bucket %d limit %d -> %d.",
            bucket_index,
            self._limits[bucket_index],
            new_batch_size,
        )
        self._limits[bucket_index] = int(new_batch_size)
        if self._groups is None:
            self._epoch_limits[bucket_index] = int(new_batch_size)
            return
        event = [self._position, bucket_index, int(new_batch_size)]
        self._lowerings.append(event)
        self._apply_lowering(*event)

    # --- resume ------------------------------------------------------------------------------
    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:
        """Everything needed to resume mid-epoch with exactly the remaining batches.

        Args:
            batches_consumed: Batches of this epoch the training loop has used (a prefetching
                ``DataLoader`` runs ahead of it). (Default: the batches this sampler yielded)

        Raises:
            ConfigError: When ``batches_consumed`` is negative or more than were yielded.
        """
        position = self._position if batches_consumed is None else int(batches_consumed)
        if not 0 <= position <= self._position:
            raise ConfigError(
                f"state_dict: batches_consumed={batches_consumed}; the sampler has yielded "
                f"{self._position} batches this epoch."
            )
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_yielded": position,
            "finished": self._finished and position == self._position,
            **self._identity(),
            "epoch_limits": list(self._epoch_limits),
            "limits": list(self._limits),
            "lowerings": [list(e) for e in self._lowerings],
        }

    def _identity(self) -> dict[str, Any]:
        """What a saved state must share with this sampler to resume it (dataset, plan, ranks)."""
        return {
            "num_utterances": int(self._bucket_ids.size),
            "bucket_utterances": [int(m.size) for m in self._members],
            "num_replicas": self.num_replicas,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "sort_pool_batches": self.sort_pool_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the next iteration yields exactly the remaining batches.

        Raises:
            ConfigError: On unknown or missing keys, or a state from a different dataset, plan
                or replica count.
        """
        unknown = sorted(set(state) - _STATE_KEYS)
        if unknown:
            raise ConfigError(f"MemoryBudgetSampler state: unknown key(s) {unknown}.")
        missing = sorted(_STATE_KEYS - set(state))
        if missing:
            raise ConfigError(f"MemoryBudgetSampler state: missing key(s) {missing}.")
        if state["version"] != STATE_VERSION:
            raise ConfigError(
                f"MemoryBudgetSampler state: version {state['version']}, this asrfit reads {STATE_VERSION}."
            )
        for key, value in self._identity().items():
            if state[key] != value:
                raise ConfigError(
                    f"MemoryBudgetSampler state: {key}={state[key]!r}, but this sampler has {value!r}; "
                    "resume with the same dataset, plan and settings."
                )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._epoch_limits = [int(v) for v in state["epoch_limits"]]
        self._limits = [int(v) for v in state["limits"]]
        self._lowerings = [[int(v) for v in e] for e in state["lowerings"]]
        self._groups = None
        total = len(self._schedule())
        position = int(state["batches_yielded"])
        if not 0 <= position <= total:
            raise ConfigError(
                f"MemoryBudgetSampler state: batches_yielded={position}, but the epoch has {total}."
            )
        self._position = position
        self._finished = bool(state["finished"])
        self._resume_pending = not self._finished


__all__ = ["MemoryBudgetSampler"]
