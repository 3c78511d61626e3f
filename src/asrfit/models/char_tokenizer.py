"""asrfit's character CTC tokenizer for Hugging Face: ``Wav2Vec2CTCTokenizer`` that decodes as
:class:`~asrfit.data.text.CharVocabulary` does.

A model folder trained with a character vocabulary carries this file (see
:mod:`asrfit.models.hub`), so that with ``trust_remote_code=True`` the
``automatic-speech-recognition`` pipeline writes the transcript asrfit scores: repeats merged
and blanks dropped (greedy CTC), ``<unk>`` and the other special tokens dropped, the word
delimiter a space, runs of spaces collapsed to one. ``Wav2Vec2CTCTokenizer`` itself (which the
pipeline calls with ``skip_special_tokens=False``) would write ``<unk>`` and keep double
spaces.
"""

from __future__ import annotations

import re
from typing import Any

from transformers import Wav2Vec2CTCTokenizer

from asrfit.models.ctc import ctc_collapse

_SPACES = re.compile(r"\s+")


class CharCTCTokenizer(Wav2Vec2CTCTokenizer):
    """A character CTC tokenizer (see the module docstring); encoding is Wav2Vec2's."""

    def _decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        group_tokens: bool = True,
        spaces_between_special_tokens: bool = False,
        output_word_offsets: bool | None = False,
        output_char_offsets: bool | None = False,
        **kwargs: Any,
    ) -> Any:
        if output_word_offsets or output_char_offsets:  # timestamps: Wav2Vec2's own offsets
            return super()._decode(
                token_ids,
                skip_special_tokens,
                clean_up_tokenization_spaces,
                group_tokens,
                spaces_between_special_tokens,
                output_word_offsets,
                output_char_offsets,
                **kwargs,
            )
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        ids = [int(i) for i in token_ids]
        if group_tokens:
            ids = ctc_collapse(ids, blank_id=self.pad_token_id)
        delimiter, special = self.word_delimiter_token_id, set(self.all_special_ids)
        chars = [
            " " if i == delimiter else self.convert_ids_to_tokens(i)
            for i in ids
            if i == delimiter or i not in special
        ]
        return _SPACES.sub(" ", "".join(chars)).strip()


class CharSeq2SeqTokenizer(CharCTCTokenizer):
    """The character vocabulary for an encoder-decoder (Whisper) trained on it with asrfit.

    Every generated id is one character: repeats are kept (no CTC merging); the end-of-text
    and decoder-start ids, which lie past the vocabulary (``vocab_size = len(vocab) + 2``), and
    the special tokens are dropped. :meth:`_decode_asr` is what the ASR pipeline calls for a
    Whisper model (``WhisperTokenizer`` has it): the text of each chunk, joined.
    """

    def _decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        ids = [int(i) for i in token_ids if 0 <= int(i) < self.vocab_size]
        if len(args) >= 3:  # group_tokens given by position (transformers passes keywords)
            args = (*args[:2], False, *args[3:])
        else:
            kwargs["group_tokens"] = False  # a decoder emits each character once: no merging
        return super()._decode(ids, *args, **kwargs)

    def _decode_asr(
        self,
        model_outputs: list[dict[str, Any]],
        *,
        return_timestamps: Any = None,
        return_language: Any = None,
        time_precision: Any = None,
        **kwargs: Any,
    ) -> tuple[str, dict[str, Any]]:
        if return_timestamps:
            raise ValueError(
                "this model was trained on characters, without Whisper's timestamp tokens: "
                "call the pipeline without return_timestamps."
            )
        texts = []
        for output in model_outputs:
            tokens = output["tokens"]
            ids = tokens.reshape(-1).tolist() if hasattr(tokens, "reshape") else list(tokens)
            texts.append(self.decode(ids))
        return " ".join(t for t in texts if t), {}


__all__ = ["CharCTCTokenizer", "CharSeq2SeqTokenizer"]
