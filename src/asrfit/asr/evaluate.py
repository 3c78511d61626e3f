"""Greedy CTC decoding and WER / CER (jiwer) on a :class:`~asrfit.asr.dataset.SpeechDataset`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jiwer
import torch
from torch import nn

from asrfit.asr.conformer import ctc_greedy
from asrfit.asr.dataset import SpeechDataset
from asrfit.train.batching import pad_collate
from asrfit.utils.serialization import JsonDataclass


@dataclass
class EvalResult(JsonDataclass):
    """Scores of one evaluation.

    Attributes:
        wer: Word error rate (0-1).
        cer: Character error rate (0-1).
        utterances: Utterances scored.
        loss: Mean CTC loss per utterance.
        examples: A few ``[reference, hypothesis]`` pairs.
    """

    wer: float
    cer: float
    utterances: int
    loss: float
    examples: list[list[str]] = field(default_factory=list)

    def summary_rows(self) -> list[tuple[str, str]]:
        """Readable ``(label, value)`` rows."""
        return [("WER", f"{100 * self.wer:.1f} %"), ("CER", f"{100 * self.cer:.1f} %"),
                ("Utterances", str(self.utterances)), ("Loss", f"{self.loss:.3f}")]


def error_rates(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    """``(WER, CER)`` over a corpus (errors summed over utterances / reference length summed).

    Empty hypotheses count as all deletions; references must not be empty.
    """
    return float(jiwer.wer(references, hypotheses)), float(jiwer.cer(references, hypotheses))


@torch.no_grad()
def transcribe(
    model: nn.Module,
    dataset: SpeechDataset,
    output_frames: Callable[[int], int],
    *,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> tuple[list[str], float]:
    """Greedy CTC transcripts of every sample (in dataset order) and the mean loss.

    Samples are batched in duration order so padding stays small.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(dataset)), key=lambda i: dataset.durations[i])
    hypotheses: list[str] = [""] * len(dataset)
    loss_sum, counted = 0.0, 0
    key = dataset.frontend.input_key
    try:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            samples = [dataset[i] for i in indices]
            lengths = [
                int(s["attention_mask"].sum()) if "attention_mask" in s else s[key].shape[0]
                for s in samples
            ]
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                     for k, v in pad_collate(samples).items()}
            out = model(**batch)
            if out.loss is not None and torch.isfinite(out.loss):
                loss_sum += float(out.loss) * len(indices)
                counted += len(indices)
            frames = torch.tensor([min(output_frames(n), out.logits.shape[1]) for n in lengths])
            for i, ids in zip(indices, ctc_greedy(out.logits.float().cpu(), frames), strict=True):
                hypotheses[i] = dataset.vocab.decode(ids)
    finally:
        model.train(was_training)
    return hypotheses, loss_sum / max(counted, 1)


def evaluate(
    model: nn.Module,
    dataset: SpeechDataset,
    output_frames: Callable[[int], int],
    *,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    num_examples: int = 3,
) -> EvalResult:
    """WER and CER of greedy CTC decoding against the dataset's normalised transcripts."""
    hypotheses, loss = transcribe(model, dataset, output_frames, batch_size=batch_size, device=device)
    wer, cer = error_rates(dataset.texts, hypotheses)
    examples = [[dataset.texts[i], hypotheses[i]] for i in range(min(num_examples, len(dataset)))]
    return EvalResult(wer=wer, cer=cer, utterances=len(dataset), loss=loss, examples=examples)
