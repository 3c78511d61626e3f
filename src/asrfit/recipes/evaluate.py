"""Greedy decoding and WER / CER (jiwer) on a :class:`~asrfit.data.dataset.SpeechDataset`.

Greedy CTC for the CTC families; Whisper and Parakeet-TDT decode with :mod:`asrfit.models.decoding`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jiwer
import torch
from torch import nn

from asrfit.data.dataset import SpeechDataset
from asrfit.models.conformer import ctc_greedy
from asrfit.models.decoding import SEQUENCE_FAMILIES, greedy_decode
from asrfit.models.losses import loss_functions
from asrfit.train.batching import pad_collate
from asrfit.utils.serialization import JsonDataclass


@dataclass
class EvalResult(JsonDataclass):
    """Scores of one evaluation.

    Attributes:
        wer: Word error rate (0-1).
        cer: Character error rate (0-1).
        utterances: Utterances scored.
        loss: Mean loss per unit of the family's training loss (per utterance for CTC and
            Parakeet-TDT, per label token for Whisper).
        examples: A few ``[reference, hypothesis]`` pairs.
    """

    wer: float
    cer: float
    utterances: int
    loss: float
    examples: list[list[str]] = field(default_factory=list)

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows."""
        return [
            ("WER", f"{100 * self.wer:.1f} %"),
            ("CER", f"{100 * self.cer:.1f} %"),
            ("Utterances", str(self.utterances)),
            ("Loss", f"{self.loss:.3f}"),
        ]


def error_rates(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    """``(WER, CER)`` over a corpus (errors summed over utterances / reference length summed).

    Empty hypotheses count as all deletions; references must not be empty.
    """
    return float(jiwer.wer(references, hypotheses)), float(jiwer.cer(references, hypotheses))


@torch.no_grad()
def transcribe(
    model: nn.Module,
    dataset: SpeechDataset,
    output_frames: Callable[[int], int] | None = None,
    *,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> tuple[list[str], float]:
    """Greedy transcripts of every sample (in dataset order) and the mean loss per unit.

    The model's family (from its config) picks the decoding: greedy CTC for the CTC
    families, :mod:`asrfit.models.decoding` for Whisper and Parakeet-TDT. The loss is the
    family's training loss (:mod:`asrfit.models.losses`) averaged over its units (utterances,
    or label tokens for Whisper). Samples are batched in duration order so padding stays small.

    Args:
        model: The model.
        dataset: The samples.
        output_frames: CTC output frames for a number of input frames (CTC families; ignored
            by the others, and when the model reports ``output_lengths``).
        batch_size: Utterances per batch.
        device: Where to run.
    """
    from asrfit.profiles.registry import family_of_config

    family = family_of_config(model.config)
    loss_fn, _ = loss_functions(family)
    was_training = model.training
    model.eval()
    order = sorted(range(len(dataset)), key=lambda i: dataset.durations[i])
    hypotheses: list[str] = [""] * len(dataset)
    loss_sum, units = 0.0, 0
    try:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            samples = [dataset[i] for i in indices]
            batch = {
                k: v.to(device) if isinstance(v, torch.Tensor) else v
                for k, v in pad_collate(samples).items()
            }
            if family in SEQUENCE_FAMILIES:
                loss, n = loss_fn(model, batch)
                ids = greedy_decode(model, family, batch, _prompt(model, dataset))
            else:
                loss, n, ids = _ctc_batch(
                    model, batch, samples, dataset.frontend.input_key, output_frames
                )
            if torch.isfinite(loss):
                loss_sum, units = loss_sum + float(loss), units + int(n)
            for i, row in zip(indices, ids, strict=True):
                hypotheses[i] = dataset.vocab.decode(row)
    finally:
        model.train(was_training)
    return hypotheses, loss_sum / max(units, 1)


def _ctc_batch(
    model: nn.Module,
    batch: dict[str, Any],
    samples: list[dict[str, Any]],
    key: str,
    output_frames: Callable[[int], int] | None,
) -> tuple[torch.Tensor, int, list[list[int]]]:
    """One CTC forward: ``(loss x utterances, utterances, greedy ids)``."""
    out = model(**batch)
    lengths = [
        int(s["attention_mask"].sum()) if "attention_mask" in s else s[key].shape[0]
        for s in samples
    ]
    if output_frames is None:
        raise ValueError(
            "transcribe: a CTC model needs output_frames (input frames -> CTC frames)."
        )
    frames = torch.tensor([min(output_frames(n), out.logits.shape[1]) for n in lengths])
    loss = out.loss if out.loss is not None else torch.tensor(float("nan"))
    return loss.detach() * len(samples), len(samples), ctc_greedy(out.logits.float().cpu(), frames)


def _prompt(model: nn.Module, dataset: SpeechDataset) -> list[int] | None:
    """Whisper's forced first tokens: the decoder start token, then the dataset's label prefix."""
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None or not dataset.label_prefix:
        return None
    return [int(start), *dataset.label_prefix]


def evaluate(
    model: nn.Module,
    dataset: SpeechDataset,
    output_frames: Callable[[int], int] | None = None,
    *,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    num_examples: int = 3,
) -> EvalResult:
    """WER and CER of greedy decoding (see :func:`transcribe`) against the dataset's
    normalised transcripts."""
    hypotheses, loss = transcribe(
        model, dataset, output_frames, batch_size=batch_size, device=device
    )
    wer, cer = error_rates(dataset.texts, hypotheses)
    examples = [[dataset.texts[i], hypotheses[i]] for i in range(min(num_examples, len(dataset)))]
    return EvalResult(wer=wer, cer=cer, utterances=len(dataset), loss=loss, examples=examples)
