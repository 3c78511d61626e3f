"""The loss of each trainable family as ``loss_fn(model, batch) -> (loss_sum, units)``.

:class:`~asrfit.train.trainer.MemoryEfficientTrainer` divides the summed losses of an
accumulation window by the window's total units, so the units must be what the model's own
loss averages over; otherwise micro-batches of different sizes would be weighted wrongly:

* CTC (Hugging Face ``"mean"`` reduction: each utterance's loss over its target length, then
  the batch mean): units are utterances (:func:`default_loss_fn`).
* Whisper (cross-entropy averaged over the label tokens that are not -100): units are label
  tokens, so ``loss_fn`` returns ``(loss x tokens, tokens)``.
* Parakeet-TDT (``transformers.loss.loss_tdt.tdt_loss`` with its default ``"mean"``
  reduction: each utterance's loss over its target length, then the batch mean): units are
  utterances. The batch's labels are padded with -100 by
  :func:`~asrfit.train.batching.pad_collate`; the model wants them padded with its
  ``pad_token_id`` and the prediction network fed ``blank + labels``
  (:func:`transducer_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from asrfit.errors import ConfigError

IGNORE_INDEX = -100

LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]]
UnitsFn = Callable[[Any], int]


def batch_size_of(batch: Any) -> int:
    """Utterances in a collated batch: the first dimension of its first tensor.

    Args:
        batch: A tensor, a mapping or sequence holding tensors, or a list of samples.

    Returns:
        The batch size.

    Raises:
        TypeError: When the batch holds no tensor and is not a list.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values: Sequence[Any] = ()
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = batch
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim():
            return int(value.shape[0])
    for value in values:
        if isinstance(value, (Mapping, tuple)):
            try:
                return batch_size_of(value)
            except TypeError:
                continue
    if isinstance(batch, list):
        return len(batch)
    raise TypeError(
        f"cannot tell the batch size of a {type(batch).__name__}: give batches as tensors, or "
        "dicts/tuples of tensors whose first dimension is the batch."
    )


def default_loss_fn(model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
    """Loss of a model that computes its own mean loss (Hugging Face style), per utterance.

    Calls ``model(**batch)`` for a dict batch, else ``model(batch)``, takes ``.loss`` (or
    ``["loss"]``, or the output itself when it is a scalar) and returns ``(loss x n, n)``
    with ``n`` the utterances in the batch: the mean is taken over utterances.
    """
    out = model(**batch) if isinstance(batch, Mapping) else model(batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is None and isinstance(out, torch.Tensor) and out.dim() == 0:
        loss = out
    if loss is None:
        raise ConfigError(
            f"{type(model).__name__} returned no loss; pass loss_fn(model, batch) -> "
            "(loss_sum, units) to MemoryEfficientTrainer, or give the batch its labels."
        )
    n = batch_size_of(batch)
    return loss * n, n


def label_tokens(batch: Mapping[str, Any]) -> int:
    """Label tokens in a batch: entries of ``labels`` that are not -100."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def seq2seq_loss_fn(model: torch.nn.Module, batch: Mapping[str, Any]) -> tuple[torch.Tensor, int]:
    """Whisper: the model's token-mean cross-entropy times the batch's label tokens.

    Args:
        model: A ``WhisperForConditionalGeneration`` (possibly wrapped by DDP).
        batch: ``input_features`` (B, mels, frames) and ``labels`` (B, U) padded with -100.

    Returns:
        ``(loss x tokens, tokens)``.
    """
    tokens = label_tokens(batch)
    return model(**batch).loss * tokens, tokens


def transducer_inputs(batch: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """The batch as a Parakeet transducer's ``forward`` takes it for training.

    Args:
        batch: ``input_features``, ``attention_mask`` and ``labels`` (B, U) padded with -100.
        config: The model's config (``blank_token_id``, ``pad_token_id``).

    Returns:
        The batch with ``labels`` padded with ``pad_token_id`` and ``decoder_input_ids``
        (B, U + 1) = blank, then the labels.

    Raises:
        ConfigError: When a label is the pad or the blank id (it would be miscounted).
    """
    labels = batch["labels"]
    real = labels != IGNORE_INDEX
    clash = real & ((labels == config.pad_token_id) | (labels == config.blank_token_id))
    if bool(clash.any()):
        raise ConfigError(
            f"labels hold pad_token_id={config.pad_token_id} or blank_token_id={config.blank_token_id}; "
            "the transducer would miscount them. Build the model with asrfit's build_asr_model, "
            "which keeps both outside the vocabulary's characters."
        )
    padded = labels.masked_fill(~real, config.pad_token_id)
    start = torch.full_like(padded[:, :1], config.blank_token_id)
    return {**batch, "labels": padded, "decoder_input_ids": torch.cat([start, padded], dim=1)}


def transducer_loss_fn(
    model: torch.nn.Module, batch: Mapping[str, Any]
) -> tuple[torch.Tensor, int]:
    """Parakeet-TDT: the model's per-utterance mean loss times the batch's utterances.

    Returns:
        ``(loss x utterances, utterances)``.
    """
    config = getattr(model, "module", model).config
    n = batch_size_of(batch)
    return model(**transducer_inputs(batch, config)).loss * n, n


def loss_functions(family: str) -> tuple[LossFn, UnitsFn]:
    """``(loss_fn, units_fn)`` for a family (see the module docstring)."""
    if family == "whisper":
        return seq2seq_loss_fn, label_tokens
    if family == "parakeet_tdt":
        return transducer_loss_fn, batch_size_of
    return default_loss_fn, batch_size_of


__all__ = [
    "IGNORE_INDEX",
    "batch_size_of",
    "default_loss_fn",
    "label_tokens",
    "loss_functions",
    "seq2seq_loss_fn",
    "transducer_inputs",
    "transducer_loss_fn",
]
