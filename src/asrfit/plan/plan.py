"""The ``Plan``: the chosen setup, its duration buckets and accumulation, with reasons.

A plan is the only thing the runtime needs from the planning side. It is a JSON file a
user can read, diff, edit and reload (:meth:`Plan.save` / :meth:`Plan.load`, validated,
unknown keys named). Every prediction in it says what it rests on (``Plan.rests_on``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from asrfit.errors import ConfigError
from asrfit.memory.fit.costmodel import PeakModel
from asrfit.memory.setup import Setup
from asrfit.utils.serialization import JsonDataclass

PLAN_FORMAT_VERSION = 1
"""The plan file format this asrfit writes and reads. A file without ``format_version`` is 1."""

_TARGET_UTTERANCES = re.compile(r"^\s*(\d+)\s+utterances?\s*$")


@dataclass
class Bucket(JsonDataclass):
    """A duration range (and, in two-dimensional plans, a label range) and the largest batch that fits.

    A plan's buckets are one-dimensional (duration ranges; every ``min_label_length`` is 0)
    or two-dimensional: each duration range split into label ranges
    ``(min_label_length, max_label_length]``, the last one open above (a longer transcript
    goes there, and the byte budget, not the bucket's label edge, sizes its batch).

    Attributes:
        min_seconds: Shortest utterance of the bucket (exclusive, except for the first).
        max_seconds: Longest utterance (inclusive); every batch is padded to at most this.
        batch_size: Largest micro-batch whose predicted peak fits usable memory.
        max_input_length: ``max_seconds`` in model-input units (samples or feature frames).
        max_label_length: Longest label the limit was computed for (the label range's
            upper edge in a two-dimensional plan).
        predicted_peak_bytes: Predicted reserved bytes of a full batch of this bucket.
        utterance_fraction: Share of the dataset's utterances in this bucket.
        throughput_seconds_per_second: Predicted audio seconds trained per wall second here.
        min_label_length: Labels above which an utterance of this duration range belongs
            here (exclusive; 0 for the first label range and in one-dimensional plans).
        predicted_step_seconds: Predicted seconds of one step of a full batch of this bucket
            (0: not known, a plan written before this figure was kept).
    """

    min_seconds: float
    max_seconds: float
    batch_size: int
    max_input_length: int
    max_label_length: int
    predicted_peak_bytes: int
    utterance_fraction: float
    throughput_seconds_per_second: float
    min_label_length: int = 0
    predicted_step_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_seconds < self.max_seconds:
            raise ConfigError(
                f"Bucket: min_seconds={self.min_seconds} must be >= 0 and below max_seconds={self.max_seconds}."
            )
        if self.batch_size < 1:
            raise ConfigError(
                f"Bucket {self.max_seconds:g} s: batch_size={self.batch_size} must be at least 1."
            )
        if not 0 <= self.min_label_length < self.max_label_length:
            raise ConfigError(
                f"Bucket {self.max_seconds:g} s: min_label_length={self.min_label_length} must be "
                f">= 0 and below max_label_length={self.max_label_length}."
            )


@dataclass
class DataDecisions(JsonDataclass):
    """How the data side runs, each decision with its reason.

    Attributes:
        streaming: Read the dataset lazily instead of loading it (too big for host RAM).
        cache_decoded_audio: Keep decoded audio in memory after the first epoch.
        long_utterances: "chunk" or "filter" for utterances above the largest bucket.
        max_seconds: Longest utterance trained on (the largest bucket's edge).
        long_utterance_fraction: Share of utterances above ``max_seconds``.
        num_workers: Data-loader worker processes.
        reasons: One sentence per decision.
    """

    streaming: bool
    cache_decoded_audio: bool
    long_utterances: str
    max_seconds: float
    long_utterance_fraction: float
    num_workers: int
    reasons: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.long_utterances not in ("chunk", "filter"):
            raise ConfigError(f"long_utterances={self.long_utterances!r}: use 'chunk' or 'filter'.")


@dataclass
class Plan(JsonDataclass):
    """The fastest setup that fits, with per-bucket batch limits and accumulation.

    Attributes:
        model: Model name (bundled name, Hub id or path).
        gpu: GPU name the plan is for.
        usable_bytes: Usable memory per GPU (memory x safety margin).
        setup: Precision, checkpointing, optimizer, ZeRO stage, offload, world size.
        buckets: Duration buckets in increasing order.
        gradient_accumulation_steps: Micro-batches per optimizer step on each process.
        target_effective_batch: What was asked for, e.g. "32 utterances" or "0.5 hours".
        effective_batch_utterances: Mean utterances per optimizer step over all processes.
        effective_batch_hours: Mean audio hours per optimizer step over all processes.
        predicted_throughput_seconds_per_second: Audio seconds trained per wall second (all GPUs).
        predicted_epoch_seconds: Wall seconds for one epoch.
        cost_model: The fitted peak-memory model the bucket limits come from.
        data: Data-side decisions.
        expandable_segments: Whether the run sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
        input_frames_per_second: Model-input steps per audio second (samples or feature frames).
        labels_per_second: Labels per audio second assumed when a transcript's length is unknown.
        model_state_offset_bytes: Sharded minus unsharded model states (ZeRO/DDP), added to ``cost_model``.
        optimizer_peak_bytes: The optimizer phase's peak (batch-independent), unsharded; 0
            where the optimizer state is offloaded (the step runs on the host).
        architecture: GPU architecture (for the allocator model's cuBLAS workspace).
        alternatives: Other setups considered, one line each, fastest first.
        warnings: Things the user should know (unreachable targets, filtered data).
        rests_on: What each prediction is based on.
        rejected: Setups that do not fit, each with the memory it needs.
        num_nodes: Machines the ``world_size`` processes run on (``world_size`` must be a
            multiple); exports name the GPUs per node as ``world_size / num_nodes``.
        fingerprints: What the plan was made for ("model", "gpu", "data"; see
            :mod:`asrfit.plan.fingerprint`), checked when a run loads the plan.
        checkpointing_reason: Why the setup checkpoints the layers it does, when it
            checkpoints only some (:mod:`asrfit.plan.checkpointing`); empty otherwise.
        bucketing: ``"1d"`` (duration buckets) or ``"2d"`` (duration x label buckets,
            :mod:`asrfit.plan.label_buckets`).
        bucketing_reason: Why the plan buckets as it does (predicted throughput of both).
        format_version: The file format (:data:`PLAN_FORMAT_VERSION`); written first.
    """

    model: str
    gpu: str
    usable_bytes: int
    setup: Setup
    buckets: list[Bucket]
    gradient_accumulation_steps: int
    target_effective_batch: str
    effective_batch_utterances: float
    effective_batch_hours: float
    predicted_throughput_seconds_per_second: float
    predicted_epoch_seconds: float
    cost_model: PeakModel
    data: DataDecisions
    expandable_segments: bool = True
    input_frames_per_second: float = 16000.0
    labels_per_second: float = 15.0
    model_state_offset_bytes: int = 0
    optimizer_peak_bytes: int = 0
    architecture: str | None = None
    alternatives: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rests_on: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    num_nodes: int = 1
    fingerprints: dict[str, str] = field(default_factory=dict)
    checkpointing_reason: str = ""
    bucketing: str = "1d"
    bucketing_reason: str = ""
    format_version: int = PLAN_FORMAT_VERSION

    def __post_init__(self) -> None:
        _check_format_version(self.format_version, "Plan")
        if not self.buckets:
            raise ConfigError("Plan.buckets: a plan needs at least one bucket.")
        edges = [b.max_seconds for b in self.buckets]
        if edges != sorted(edges):
            raise ConfigError(f"Plan.buckets: max_seconds must increase, got {edges}.")
        if self.bucketing not in ("1d", "2d"):
            raise ConfigError(f"Plan.bucketing={self.bucketing!r}: use '1d' or '2d'.")
        _check_label_ranges(self.buckets, self.bucketing)
        if self.num_nodes < 1 or self.setup.world_size % self.num_nodes:
            raise ConfigError(
                f"Plan.num_nodes={self.num_nodes}: use 1 or more nodes that divide "
                f"world_size={self.setup.world_size} (the same GPUs on every node)."
            )
        if self.gradient_accumulation_steps < 1:
            raise ConfigError(
                f"Plan.gradient_accumulation_steps={self.gradient_accumulation_steps}: use 1 or more."
            )

    def to_dict(self) -> dict[str, Any]:
        """A new JSON-ready dict with ``format_version`` first (the object is not changed)."""
        data = super().to_dict()
        return {"format_version": data.pop("format_version"), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str | None = None) -> Plan:
        """Build a plan from a dict, checking ``format_version`` before any other key.

        Raises:
            ConfigError: On an unknown format version (saying which ones this asrfit reads),
                an unknown or missing key, or a value that fails validation.
        """
        if isinstance(data, dict) and "format_version" in data:
            _check_format_version(data["format_version"], where or "Plan")
        return super().from_dict(data, where=where)

    @property
    def on_cpu(self) -> bool:
        """Whether the plan is for training on the CPU (planned where no GPU was found)."""
        return self.gpu == "cpu-only" or self.fingerprints.get("gpu") == "cpu"

    @property
    def gpus_per_node(self) -> int:
        """Processes (GPUs) on each node: ``world_size / num_nodes``."""
        return self.setup.world_size // self.num_nodes

    @property
    def target_batch_utterances(self) -> float:
        """Utterances per optimizer step the plan aims at, over all processes.

        The number asked for when the target was in utterances ("32 utterances"); for a
        target in hours, the plan's own :attr:`effective_batch_utterances`.
        """
        match = _TARGET_UTTERANCES.match(self.target_effective_batch)
        if match:
            return float(match.group(1))
        return float(self.effective_batch_utterances)

    @property
    def batch_cap(self) -> int | None:
        """The largest micro-batch per process a target in utterances allows: its share
        per process, rounded up (:func:`asrfit.plan.inputs.plan_inputs`' cap); None for a
        target in hours, which caps no batch."""
        match = _TARGET_UTTERANCES.match(self.target_effective_batch)
        if not match:
            return None
        return max(1, math.ceil(int(match.group(1)) / self.setup.world_size))

    def fixed_batch_accumulation_steps(self, batch_size: int | None = None) -> int:
        """Accumulation that keeps the target effective batch with one fixed micro-batch.

        The plan's :attr:`gradient_accumulation_steps` is for its bucketed batches, which are
        larger on short utterances. A trainer that uses one batch size for every step (the
        Hugging Face ``Trainer``, Lightning, DeepSpeed) needs more micro-batches per step:
        ``round(target / (batch_size x world_size))``, at least 1, so that
        ``batch_size x accumulation x world_size`` is within half a micro-batch per process of
        :attr:`target_batch_utterances` (or one micro-batch when the target is below it).

        Args:
            batch_size: The fixed micro-batch per process (Default: :attr:`min_batch_size`).

        Returns:
            Micro-batches per optimizer step on each process.
        """
        batch = self.min_batch_size if batch_size is None else int(batch_size)
        if batch < 1:
            raise ConfigError(f"fixed_batch_accumulation_steps: batch_size={batch}; use 1 or more.")
        per_step = batch * self.setup.world_size
        return max(1, math.floor(self.target_batch_utterances / per_step + 0.5))

    @property
    def is_two_dimensional(self) -> bool:
        """Whether the buckets split each duration range by label length."""
        return self.bucketing == "2d"

    @property
    def bucket_duration_bins(self) -> list[float] | list[list[float]]:
        """NeMo's ``bucket_duration_bins``: upper edges in seconds, one per bucket.

        In a two-dimensional plan, ``[seconds, labels]`` pairs (NeMo's and lhotse's 2-D form,
        sorted as the buckets are).
        """
        if self.is_two_dimensional:
            return [[b.max_seconds, b.max_label_length] for b in self.buckets]
        return [b.max_seconds for b in self.buckets]

    def duration_limits(self) -> tuple[list[float], list[int]]:
        """``(duration edges, batch limits)``, one per duration range.

        In a two-dimensional plan each duration range keeps its smallest label range's limit
        (the one for its longest transcripts): a duration-only sampler stays within memory.
        """
        edges: list[float] = []
        sizes: list[int] = []
        for b in self.buckets:
            if edges and edges[-1] == b.max_seconds:
                sizes[-1] = min(sizes[-1], b.batch_size)
            else:
                edges.append(b.max_seconds)
                sizes.append(b.batch_size)
        return edges, sizes

    def bucket_index(self, seconds: float, labels: int | None = None) -> int | None:
        """Index of the bucket an utterance belongs to, or None above the largest duration.

        The first duration range whose edge is at least ``seconds``; in a two-dimensional plan,
        within it the first label range whose edge is at least ``labels`` (the last range when
        ``labels`` is longer than every edge, or unknown).
        """
        group = [k for k, b in enumerate(self.buckets) if seconds <= b.max_seconds]
        if not group:
            return None
        first = self.buckets[group[0]].max_seconds
        same = [k for k in group if self.buckets[k].max_seconds == first]
        if labels is None:
            return same[-1]
        return next((k for k in same if labels <= self.buckets[k].max_label_length), same[-1])

    @property
    def bucket_batch_sizes(self) -> list[int]:
        """Batch limit per bucket (NeMo's ``bucket_batch_size``)."""
        return [b.batch_size for b in self.buckets]

    @property
    def max_batch_size(self) -> int:
        """The largest per-bucket batch (short utterances)."""
        return max(b.batch_size for b in self.buckets)

    @property
    def min_batch_size(self) -> int:
        """The smallest per-bucket batch (the longest bucket): what a fixed-batch trainer can use."""
        return min(b.batch_size for b in self.buckets)

    def predicted_reserved_bytes(
        self, batch_size: int, input_length: int, label_length: int
    ) -> int:
        """Predicted ``max_memory_reserved`` of a padded batch on this plan's setup and GPU."""
        from asrfit.memory.cuda.allocator import reserved_of_fitted_peak

        traced = max(
            self.cost_model.predict(batch_size, input_length, label_length),
            float(self.optimizer_peak_bytes),
        )
        peak = int(traced + self.model_state_offset_bytes)
        return reserved_of_fitted_peak(
            peak, architecture=self.architecture, expandable_segments=self.expandable_segments
        )

    def input_length(self, seconds: float) -> int:
        """Model-input length of ``seconds`` of audio."""
        return max(1, round(seconds * self.input_frames_per_second))

    def bucket_for(self, seconds: float, labels: int | None = None) -> Bucket | None:
        """The bucket an utterance falls in (:meth:`bucket_index`), or None above the largest."""
        k = self.bucket_index(seconds, labels)
        return None if k is None else self.buckets[k]

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows for a table."""
        gib = 2**30
        rows = [
            ("Model / GPU", f"{self.model} on {self.setup.world_size} x {self.gpu}"),
            ("Setup", self.setup.describe()),
            ("Usable memory", f"{self.usable_bytes / gib:.2f} GiB per GPU"),
            (
                "Buckets",
                f"{len(self.buckets)} ({self.buckets[0].max_seconds:g}-{self.buckets[-1].max_seconds:g} s"
                + (", by duration x labels)" if self.is_two_dimensional else ")"),
            ),
            ("Gradient accumulation", f"{self.gradient_accumulation_steps} micro-batches per step"),
            (
                "Effective batch",
                f"{self.effective_batch_utterances:.1f} utterances, {self.effective_batch_hours * 60:.2f} min of audio"
                f" (target {self.target_effective_batch})",
            ),
            (
                "Predicted throughput",
                f"{self.predicted_throughput_seconds_per_second:,.1f} audio s/s",
            ),
            ("Predicted epoch", duration_words(self.predicted_epoch_seconds)),
            ("Data", ", ".join(self.data.reasons)),
        ]
        if self.bucketing_reason:
            rows.append(("Bucketing", self.bucketing_reason))
        rows += [("Warning", w) for w in self.warnings]
        return rows

    def bucket_rows(self) -> list[tuple[str, str, str, str, str]]:
        """Per-bucket ``(range, batch, predicted peak, headroom, throughput)`` rows."""
        gib = 2**30
        out = []
        for b in self.buckets:
            headroom = (self.usable_bytes - b.predicted_peak_bytes) / gib
            labels = (
                f", {b.min_label_length}-{b.max_label_length} labels"
                if self.is_two_dimensional
                else ""
            )
            out.append(
                (
                    f"{b.min_seconds:.1f}-{b.max_seconds:.1f} s{labels}",
                    str(b.batch_size),
                    f"{b.predicted_peak_bytes / gib:.2f} GiB",
                    f"{headroom:.2f} GiB",
                    f"{b.throughput_seconds_per_second:,.1f}",
                )
            )
        return out


def _check_label_ranges(buckets: list[Bucket], bucketing: str) -> None:
    """One-dimensional: no label ranges. Two-dimensional: contiguous label ranges per duration."""
    if bucketing == "1d":
        bad = [b for b in buckets if b.min_label_length]
        if bad:
            raise ConfigError(
                f"Plan.buckets: bucket {bad[0].max_seconds:g} s has min_label_length="
                f"{bad[0].min_label_length} in a '1d' plan; set bucketing to '2d' or drop it."
            )
        if len({b.max_seconds for b in buckets}) != len(buckets):
            raise ConfigError(
                "Plan.buckets: duration edges repeat in a '1d' plan; use bucketing '2d'."
            )
        return
    previous: Bucket | None = None
    for b in buckets:
        same = previous is not None and previous.max_seconds == b.max_seconds
        want = previous.max_label_length if same and previous is not None else 0
        if b.min_label_length != want or (
            same and previous is not None and previous.min_seconds != b.min_seconds
        ):
            raise ConfigError(
                f"Plan.buckets: bucket {b.min_seconds:g}-{b.max_seconds:g} s, labels "
                f"{b.min_label_length}-{b.max_label_length}: label ranges of one duration range must "
                f"start at 0 and follow each other (expected min_label_length={want})."
            )
        previous = b


def duration_words(seconds: float) -> str:
    """A duration as a person says it: ``"under a second"``, ``"42 s"``, ``"3.4 min"``, ``"2.1 h"``.

    Args:
        seconds: The duration.

    Returns:
        The phrase.
    """
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _check_format_version(version: Any, where: str) -> None:
    if version != PLAN_FORMAT_VERSION:
        raise ConfigError(
            f"{where}: format_version={version!r} is not one this asrfit reads (it reads "
            f"{PLAN_FORMAT_VERSION}). Re-create the plan with this asrfit (`asrfit plan ... --out PLAN.json`), "
            "or install the asrfit version that wrote it."
        )
