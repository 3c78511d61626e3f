"""Greedy decoding of the families that are not CTC (CTC: :func:`asrfit.models.conformer.ctc_greedy`).

* Whisper (:func:`whisper_greedy`): the encoder runs once; the decoder starts from the
  prompt (the decoder start token, then any forced tokens such as language and task) and
  takes the arg-max token one step at a time with its key/value cache, until end of text or
  ``max_target_positions``. ``WhisperForConditionalGeneration.generate`` is not used: it
  expects Whisper's own multilingual vocabulary (language, task and timestamp tokens) in the
  generation config, which a model with asrfit's character vocabulary does not have.
* Parakeet-TDT (:func:`transducer_greedy`): a batched greedy TDT search written out here,
  the prediction network started from the blank symbol as in training. Not
  ``ParakeetForTDT.generate``: in transformers 5.23 its greedy step takes the arg-max over the
  joint output's token *and* duration logits together, so it can emit a duration index as a
  token id (out of the vocabulary) when a duration logit is the largest, as happens with
  random or briefly trained weights.

Both return token ids with every special id removed (start, end, pad, blank).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SEQUENCE_FAMILIES = ("whisper", "parakeet_tdt")
"""Families that decode with this module rather than greedy CTC."""


@torch.no_grad()
def whisper_greedy(
    model: nn.Module,
    input_features: torch.Tensor,
    prompt: list[int] | None = None,
    *,
    max_length: int | None = None,
) -> list[list[int]]:
    """Greedy transcripts of a batch with a Whisper-style encoder-decoder.

    Args:
        model: A ``WhisperForConditionalGeneration`` (in eval mode).
        input_features: (B, mels, 2 x max_source_positions) features.
        prompt: Forced first decoder tokens. (Default: ``[decoder_start_token_id]``)
        max_length: Decoder positions at most, prompt included.
            (Default: ``config.max_target_positions``)

    Returns:
        Per utterance, the ids after the prompt up to (not including) the end token, with
        the start, end and pad ids removed.
    """
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    config = model.config
    prompt = list(prompt) if prompt else [int(config.decoder_start_token_id)]
    limit = int(max_length or config.max_target_positions)
    eos, pad = int(config.eos_token_id), config.pad_token_id
    never = [int(config.decoder_start_token_id)] + (
        [int(pad)] if pad is not None and pad != eos else []
    )
    batch = input_features.shape[0]
    encoder_outputs = model.get_encoder()(input_features)
    tokens = torch.tensor(prompt, device=input_features.device).repeat(batch, 1)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    finished = torch.zeros(batch, dtype=torch.bool, device=input_features.device)
    step = tokens
    while tokens.shape[1] < limit and not bool(finished.all()):
        out = model(
            encoder_outputs=encoder_outputs,
            decoder_input_ids=step,
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1].float()
        logits[:, never] = float("-inf")  # tokens that are never output
        nxt = logits.argmax(-1).masked_fill(finished, eos)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        finished |= nxt == eos
        step = nxt[:, None]
    return [_until(row[len(prompt) :], eos, set(never)) for row in tokens.tolist()]


@torch.no_grad()
def transducer_greedy(
    model: nn.Module, input_features: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[list[int]]:
    """Greedy TDT search over a batch, every utterance with its own frame pointer.

    At each step the joint network scores the pointer's encoder frame against the prediction
    network's output for the tokens emitted so far: the arg-max token is emitted unless it is
    the blank, and the pointer advances by the arg-max duration (at least one frame after a
    blank, and one frame after ``max_symbols_per_step`` emissions without advancing), as in
    NeMo's greedy TDT decoding. The prediction network runs only for the utterances that
    emitted (transformers' decoder cache updates the rows whose input is not the blank).

    Args:
        model: A ``ParakeetForTDT`` (in eval mode).
        input_features: (B, T, mels) features.
        attention_mask: (B, T), 1 at real frames. (Default: all real)

    Returns:
        Per utterance, the emitted token ids (no blanks).
    """
    from transformers.models.parakeet.generation_parakeet import ParakeetRNNTDecoderCache

    config = model.config
    vocab, blank = int(config.vocab_size), int(config.blank_token_id)
    durations = torch.tensor(list(config.durations), device=input_features.device)
    encoded = model.get_audio_features(input_features=input_features, attention_mask=attention_mask)
    frames = encoded.pooler_output  # (B, T', H)
    batch, total = frames.shape[0], frames.shape[1]
    lengths = (
        encoded.attention_mask.sum(-1).long()
        if encoded.attention_mask is not None
        else torch.full((batch,), total, device=frames.device)
    )
    rows = torch.arange(batch, device=frames.device)
    cache = ParakeetRNNTDecoderCache(config)
    state = model.decoder(
        torch.full((batch, 1), blank, device=frames.device), cache=cache
    )  # (B, 1, H)
    pointer = torch.zeros(batch, dtype=torch.long, device=frames.device)
    symbols = torch.zeros_like(pointer)
    hypotheses: list[list[int]] = [[] for _ in range(batch)]
    active = pointer < lengths
    while bool(active.any()):
        frame = frames[rows, pointer.clamp(max=total - 1)]  # (B, H)
        logits = model.joint(decoder_hidden_states=state[:, 0], encoder_hidden_states=frame)
        token = logits[:, :vocab].argmax(-1)
        step = durations[logits[:, vocab:].argmax(-1)]
        emit = active & (token != blank)
        symbols = torch.where(emit, symbols + 1, symbols)
        stuck = (step == 0) & ((token == blank) | (symbols >= int(config.max_symbols_per_step)))
        step = torch.where(stuck, torch.ones_like(step), step)
        symbols = torch.where(step > 0, torch.zeros_like(symbols), symbols)
        for b in emit.nonzero().flatten().tolist():
            hypotheses[b].append(int(token[b]))
        if bool(emit.any()):
            state = model.decoder(torch.where(emit, token, blank)[:, None], cache=cache)
        pointer = torch.where(active, pointer + step, pointer)
        active = pointer < lengths
    return hypotheses


def greedy_decode(
    model: nn.Module, family: str, batch: dict[str, Any], prompt: list[int] | None = None
) -> list[list[int]]:
    """Greedy token ids of a collated batch for a Whisper or Parakeet-TDT model.

    Args:
        model: The model (in eval mode).
        family: ``"whisper"`` or ``"parakeet_tdt"``.
        batch: The collated batch (on the model's device); ``labels`` are ignored.
        prompt: Whisper's forced first tokens (see :func:`whisper_greedy`).

    Raises:
        ValueError: For another family (CTC models decode with ``ctc_greedy``).
    """
    if family == "whisper":
        return whisper_greedy(model, batch["input_features"], prompt)
    if family == "parakeet_tdt":
        return transducer_greedy(model, batch["input_features"], batch.get("attention_mask"))
    raise ValueError(
        f"greedy_decode: family {family!r} is not a sequence family; CTC models use ctc_greedy."
    )


def _until(ids: list[int], eos: int, drop: set[int]) -> list[int]:
    """``ids`` up to the first ``eos``, without the ids in ``drop``."""
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return [i for i in ids if i not in drop]


__all__ = ["SEQUENCE_FAMILIES", "greedy_decode", "transducer_greedy", "whisper_greedy"]
