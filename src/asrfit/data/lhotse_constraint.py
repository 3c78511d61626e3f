"""asrfit's byte budget as a lhotse ``SamplingConstraint``, for lhotse's own samplers.

Use it where lhotse users already build their batches::

    from lhotse.dataset import DynamicBucketingSampler
    from asrfit.data.lhotse_constraint import LhotseBytesConstraint

    cuts = cuts.filter(lambda c: c.duration <= plan.buckets[-1].max_seconds)
    constraint = LhotseBytesConstraint(plan)
    sampler = DynamicBucketingSampler(
        cuts, constraint=constraint, duration_bins=plan.bucket_duration_bins, shuffle=True
    )

Each batch stays within the plan's bucket limit for its first cut's bucket and within the
plan's usable memory, predicted from the longest cut and transcript seen (padding counts).
To resume mid-epoch, save :func:`sampler_state_dict` with the checkpoint and give it to a
fresh sampler's own ``load_state_dict`` (built the same way, with a new constraint).
With a two-dimensional plan (duration x labels) pass the same ``plan.bucket_duration_bins``:
they are ``[seconds, labels]`` pairs, and the constraint picks each cut's bucket by both.
Needs the ``lhotse`` extra (``pip install asrfit[lhotse]``).
"""

from __future__ import annotations

from typing import Any

from lhotse.dataset.sampling.base import SamplingConstraint

from asrfit.data.constraint import BytesConstraint
from asrfit.errors import ConfigError
from asrfit.plan.plan import Plan

_STATE_KEYS = (
    "budget_bytes",
    "bucket_index",
    "num_utterances",
    "longest_input_length",
    "longest_label_length",
)


class LhotseBytesConstraint(SamplingConstraint):
    """A lhotse ``SamplingConstraint`` that admits cuts while the predicted batch bytes fit.

    Args:
        plan: The plan whose buckets, cost model and usable memory define the budget.
        budget_bytes: Bytes a batch may reach; 0 means ``plan.usable_bytes``. (Default: 0)

    Transcript lengths are the supervisions' characters, or ``plan.labels_per_second`` times
    the duration for a cut without text.
    """

    def __init__(self, plan: Plan, budget_bytes: int = 0) -> None:
        self.plan = plan
        self._budget = BytesConstraint(plan, plan.max_batch_size, budget_bytes=budget_bytes)
        self.bucket_index: int | None = None

    # --- lhotse's interface --------------------------------------------------------------------
    def measure_length(self, example: Any) -> float:
        """A cut's duration in seconds (the unit of the plan's bucket edges)."""
        return float(example.duration)

    def add(self, example: Any) -> None:
        """Count one cut into the current batch (lhotse checks :meth:`exceeded` after it).

        Raises:
            ConfigError: For a cut longer than the plan's largest bucket.
        """
        seconds = self.measure_length(example)
        bucket = self.select_bucket(self.plan.bucket_duration_bins, example=example)
        if bucket >= len(self.plan.buckets):
            raise ConfigError(
                f"cut {getattr(example, 'id', '?')!r} lasts {seconds:g} s, above the plan's largest "
                f"bucket ({self.plan.buckets[-1].max_seconds:g} s): filter such cuts first "
                "(cuts.filter(lambda c: c.duration <= ...)) or re-plan with a larger max_seconds."
            )
        if self.bucket_index is None:
            self.bucket_index = bucket
            self._budget.max_batch_size = self.plan.buckets[bucket].batch_size
        self._budget.add(self.plan.input_length(seconds), self._label_length(example, seconds))

    def select_bucket(self, buckets: Any, example: Any = None, example_len: Any = None) -> int:
        """The plan's bucket of a cut (``len(plan.buckets)`` above the largest).

        One-dimensional plans bisect the duration edges as lhotse does; two-dimensional ones
        (``duration_bins=plan.bucket_duration_bins`` holds ``[seconds, labels]`` pairs) take
        :meth:`asrfit.plan.plan.Plan.bucket_index` of the cut's duration and transcript length.
        """
        if not self.plan.is_two_dimensional:
            return super().select_bucket(buckets, example=example, example_len=example_len)
        if example is None:
            raise ConfigError(
                "LhotseBytesConstraint.select_bucket: a two-dimensional plan needs the cut "
                "(example=), not its length alone."
            )
        seconds = self.measure_length(example)
        k = self.plan.bucket_index(seconds, self._label_length(example, seconds))
        return len(self.plan.buckets) if k is None else k

    def exceeded(self) -> bool:
        """Whether the batch so far is over its bucket's limit or the byte budget."""
        return self._budget.exceeded()

    def close_to_exceeding(self) -> bool:
        """Whether one more cut of this bucket, at its longest, could exceed.

        lhotse yields the batch as soon as this is true, and checks it only *after* adding a
        cut, so the next cut must be assumed as long as the bucket allows (its edge and
        ``max_label_length``): a batch never goes over budget, however long the next cut,
        unless its transcript is longer than the plan assumed.
        """
        if self._budget.num_utterances == 0 or self.bucket_index is None:
            return False
        bucket = self.plan.buckets[self.bucket_index]
        return self._budget.would_exceed(
            self.plan.input_length(bucket.max_seconds),
            max(self._budget.longest_label_length, bucket.max_label_length),
        )

    def reset(self) -> None:
        """Start a new, empty batch."""
        self._budget.reset()
        self._budget.max_batch_size = self.plan.max_batch_size
        self.bucket_index = None

    # --- state ----------------------------------------------------------------------------------
    @property
    def predicted_bytes(self) -> int:
        """Predicted reserved bytes of the batch admitted so far (0 when empty)."""
        return self._budget.predicted_bytes

    def state_dict(self) -> dict[str, Any]:
        """The batch being collected and the budget (the plan is not part of it)."""
        return {
            "budget_bytes": self._budget.budget_bytes,
            "bucket_index": self.bucket_index,
            "num_utterances": self._budget.num_utterances,
            "longest_input_length": self._budget.longest_input_length,
            "longest_label_length": self._budget.longest_label_length,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ConfigError: On an unknown or missing key (named).
        """
        unknown = sorted(set(state_dict) - set(_STATE_KEYS))
        missing = sorted(set(_STATE_KEYS) - set(state_dict))
        if unknown or missing:
            raise ConfigError(
                f"LhotseBytesConstraint.load_state_dict: unknown key(s) {unknown}, missing key(s) "
                f"{missing}; expected {list(_STATE_KEYS)}."
            )
        self.bucket_index = state_dict["bucket_index"]
        self._budget.budget_bytes = int(state_dict["budget_bytes"])
        self._budget.num_utterances = int(state_dict["num_utterances"])
        self._budget.longest_input_length = int(state_dict["longest_input_length"])
        self._budget.longest_label_length = int(state_dict["longest_label_length"])
        limit = self.plan.max_batch_size
        if self.bucket_index is not None:
            limit = self.plan.buckets[self.bucket_index].batch_size
        self._budget.max_batch_size = limit

    def copy(self) -> LhotseBytesConstraint:
        """A fresh constraint with the same plan, budget and state (lhotse copies one per bucket)."""
        other = LhotseBytesConstraint(self.plan, budget_bytes=self._budget.budget_bytes)
        other.load_state_dict(self.state_dict())
        return other

    def _label_length(self, example: Any, seconds: float) -> int:
        texts = [s.text for s in getattr(example, "supervisions", []) if getattr(s, "text", None)]
        if texts:
            return sum(len(t) for t in texts)
        return max(1, round(seconds * self.plan.labels_per_second))


def sampler_state_dict(sampler: Any) -> dict[str, Any]:
    """``sampler.state_dict()`` of a lhotse ``DynamicBucketingSampler`` that uses this constraint.

    lhotse refuses ``state_dict()`` for every custom constraint, because it does not save the
    constraint's state. That state does not matter here: the sampler's ``load_state_dict``
    replays the epoch up to the batches already taken, with the fresh sampler's constraint,
    and a :class:`LhotseBytesConstraint` with the same plan and budget decides as this one did.

    Args:
        sampler: A ``DynamicBucketingSampler`` built with a :class:`LhotseBytesConstraint`.

    Returns:
        The dict lhotse's ``state_dict()`` returns for its built-in constraints; restore it with
        ``load_state_dict`` on a sampler built with the same cuts, seed and plan.

    Raises:
        ConfigError: When the sampler's constraint is not a :class:`LhotseBytesConstraint`.
    """
    constraint = getattr(sampler, "constraint", None)
    if not isinstance(constraint, LhotseBytesConstraint):
        raise ConfigError(
            f"sampler_state_dict: the sampler's constraint is {type(constraint).__name__}, not "
            "LhotseBytesConstraint; call the sampler's own state_dict()."
        )
    sampler.constraint = None  # lhotse's check; its state lists no constraint field
    try:
        return sampler.state_dict()
    finally:
        sampler.constraint = constraint


__all__ = ["LhotseBytesConstraint", "sampler_state_dict"]
