"""The Hugging Face ``Trainer`` route: asrfit's plan, sampler and audio loading inside it.

What users of ``transformers`` already run, with three pieces from asrfit::

    config, manager = create_optimal_config(train_ds, model, audio_column="audio", gpu="L4")
    args = TrainingArguments(output_dir="out", **config.to_training_arguments(memory_budget_sampler=True))
    trainer = MemoryBudgetTrainer(
        model=model, args=args, train_dataset=prepare_audio_dataset(train_ds),
        data_collator=SpeechCollator(feature_extractor, tokenizer), plan=manager.plan,
        callbacks=[AdaptiveMemoryCallback(...)],
    )
    trainer.train()

- :func:`prepare_audio_dataset` keeps the audio column undecoded (``Audio(decode=False)``):
  ``datasets`` 4+ decodes through ``torchcodec``, which a CPU-only or pinned torch often
  cannot load, so :class:`SpeechCollator` decodes with asrfit's own loader (``soundfile``
  plus ``scipy`` resampling) instead.
- :class:`MemoryBudgetTrainer` batches with :class:`~asrfit.data.sampler.MemoryBudgetSampler`
  (per-bucket batches under the plan's byte budget, sharded over ranks) through
  :func:`~asrfit.data.hf_loader.hf_train_dataloader`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import soundfile as sf
import torch
from transformers import Trainer

from asrfit.data.audio import resample, to_mono
from asrfit.data.dataset import utterances_from
from asrfit.data.hf_loader import hf_train_dataloader
from asrfit.data.sampler import MemoryBudgetSampler
from asrfit.errors import AudioError, ConfigError
from asrfit.plan.plan import Plan
from asrfit.profiles.dataset_stats import text_column_of

IGNORE_LABEL = -100
"""The label value CTC and cross-entropy losses in transformers skip (padding)."""


def prepare_audio_dataset(dataset: Any, audio_column: str = "audio") -> Any:
    """The dataset with its ``Audio`` column left undecoded (paths or bytes, no torchcodec).

    Args:
        dataset: A ``datasets.Dataset``.
        audio_column: The audio column's name.

    Returns:
        A new dataset (the argument is not changed).

    Raises:
        ConfigError: When the column is missing (naming the columns there are).
    """
    import datasets

    if audio_column not in dataset.column_names:
        raise ConfigError(
            f"dataset columns {dataset.column_names} have no audio column {audio_column!r}; "
            "pass audio_column= with its name."
        )
    if isinstance(dataset.features.get(audio_column), datasets.Audio):
        return dataset.cast_column(audio_column, datasets.Audio(decode=False))
    return dataset


def add_length_column(dataset: Any, audio_column: str = "audio", name: str = "input_length") -> Any:
    """The dataset with a column of utterance lengths in seconds, for the Trainer's
    length-grouped batches (``TrainingConfig.to_training_arguments(length_column=name)``).

    Lengths come from a ``duration`` column when there is one, else from each audio file's
    header (``soundfile.info``: nothing is decoded), or from a decoded array's length.

    Raises:
        ConfigError: When the audio column is missing, or an audio cell cannot be read
            (naming the row).
    """
    if "duration" in dataset.column_names:
        seconds = [float(d) for d in dataset["duration"]]
    else:
        cells = prepare_audio_dataset(dataset, audio_column)[audio_column]
        seconds = [_seconds(cell, row) for row, cell in enumerate(cells)]
    if name in dataset.column_names:
        dataset = dataset.remove_columns(name)
    return dataset.add_column(name, seconds)


def _seconds(cell: Any, row: int) -> float:
    """One audio cell's length in seconds (header only for files and bytes)."""
    if isinstance(cell, dict) and cell.get("array") is not None:
        return len(cell["array"]) / float(cell["sampling_rate"])
    source = (cell.get("bytes") or cell.get("path")) if isinstance(cell, dict) else cell
    try:
        info = sf.info(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source)
    except (sf.LibsndfileError, RuntimeError, TypeError, OSError) as err:
        raise ConfigError(
            f"audio of row {row} ({str(source)[:80]!r}) cannot be read: {err}"
        ) from err
    return info.frames / float(info.samplerate)


def decode_audio(value: Any, sample_rate: int) -> np.ndarray:
    """Decode one audio cell (``{"path", "bytes"}``, ``{"array", "sampling_rate"}`` or a path).

    Returns:
        Mono float32 samples at ``sample_rate``.

    Raises:
        AudioError: When the cell holds nothing decodable (naming what it holds).
    """
    if isinstance(value, dict) and value.get("array") is not None:
        audio = to_mono(np.asarray(value["array"], dtype=np.float32))
        return resample(audio, int(value.get("sampling_rate") or sample_rate), sample_rate)
    source = (value.get("bytes") or value.get("path")) if isinstance(value, dict) else value
    if source is None:
        raise AudioError(f"audio cell {value!r} has neither bytes, a path nor an array.")
    try:
        audio, rate = sf.read(
            io.BytesIO(source) if isinstance(source, bytes) else str(source), dtype="float32"
        )
    except (sf.LibsndfileError, RuntimeError, OSError) as exc:
        name = "<bytes>" if isinstance(source, bytes) else source
        raise AudioError(f"cannot decode audio {name}: {exc}") from exc
    return resample(to_mono(audio), int(rate), sample_rate)


class SpeechCollator:
    """Batch rows of an audio dataset for a CTC model: features, attention mask and labels.

    Args:
        feature_extractor: A transformers feature extractor (``Wav2Vec2FeatureExtractor``...).
        tokenizer: A tokenizer whose ``__call__`` gives ``input_ids`` for the transcripts.
        audio_column: The (undecoded) audio column. (Default: "audio")
        text_column: The transcript column. (Default: the first of the usual names a row has,
            ``text``, ``sentence``, ..., as the dataset profile finds it)
    """

    def __init__(
        self,
        feature_extractor: Any,
        tokenizer: Any,
        *,
        audio_column: str = "audio",
        text_column: str | None = None,
    ) -> None:
        self.feature_extractor = feature_extractor
        self.tokenizer = tokenizer
        self.audio_column = audio_column
        self.text_column = text_column

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Decode, extract and pad; label padding is :data:`IGNORE_LABEL`."""
        rate = int(self.feature_extractor.sampling_rate)
        audio = [decode_audio(row[self.audio_column], rate) for row in rows]
        batch = self.feature_extractor(
            audio, sampling_rate=rate, padding=True, return_attention_mask=True, return_tensors="pt"
        )
        if self.text_column is None or self.text_column not in rows[0]:
            self.text_column = text_column_of(list(rows[0]), self.text_column, "a collated row")
        labels = self.tokenizer(
            [str(row[self.text_column]) for row in rows],
            padding=True,
            return_tensors="pt",
            return_attention_mask=True,
        )
        ids = labels["input_ids"].masked_fill(labels["attention_mask"] == 0, IGNORE_LABEL)
        return {**batch, "labels": ids}


class MemoryBudgetTrainer(Trainer):
    """A ``transformers.Trainer`` whose training batches come from asrfit's memory-budget sampler.

    Every other argument is the ``Trainer``'s. Use ``TrainingArguments`` from
    ``TrainingConfig.to_training_arguments(memory_budget_sampler=True)``: the plan's
    accumulation belongs to its bucketed batches. The sampler is rebuilt for each
    ``get_train_dataloader`` call with ``args.seed``, ``args.world_size`` and
    ``args.process_index``, so every rank gets its own share of the same batches.

    Args:
        *args: The ``Trainer``'s positional arguments.
        plan: The plan (buckets, byte budget).
        durations: Seconds per training row (Default: read from the audio headers).
        label_lengths: Labels per row (Default: transcript characters).
        audio_column: The audio column, for the durations. (Default: "audio")
        text_column: The transcript column, for the label lengths. (Default: the first of the
            usual names present, as for :class:`SpeechCollator`)
        **kwargs: The ``Trainer``'s keyword arguments.
    """

    def __init__(
        self,
        *args: Any,
        plan: Plan,
        durations: Sequence[float] | None = None,
        label_lengths: Sequence[int] | None = None,
        audio_column: str = "audio",
        text_column: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        if durations is None:
            utterances = utterances_from(
                self.train_dataset, audio_column=audio_column, text_column=text_column
            )
            durations = [u.duration_seconds for u in utterances]
            if label_lengths is None:
                label_lengths = [max(1, len(u.text)) for u in utterances]
        self.durations = list(durations)
        self.label_lengths = None if label_lengths is None else list(label_lengths)

    def memory_budget_sampler(self) -> MemoryBudgetSampler:
        """The sampler for this rank (``args.seed``, ``world_size``, ``process_index``)."""
        return MemoryBudgetSampler(
            self.durations,
            self.plan,
            label_lengths=self.label_lengths,
            seed=int(self.args.seed),
            num_replicas=int(self.args.world_size),
            rank=int(self.args.process_index),
        )

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        """The ``Trainer``'s training loader, batched by :meth:`memory_budget_sampler`."""
        if self.train_dataset is None:
            raise ConfigError("MemoryBudgetTrainer: pass train_dataset=.")
        return hf_train_dataloader(self, self.memory_budget_sampler())


__all__ = [
    "IGNORE_LABEL",
    "MemoryBudgetTrainer",
    "SpeechCollator",
    "decode_audio",
    "prepare_audio_dataset",
]
