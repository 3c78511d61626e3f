"""Transcripts: normalisation, the character vocabulary (a Hugging Face CTC tokenizer) and a
wrapper for a pretrained checkpoint's own tokenizer (:class:`PretrainedText`).

The vocabulary follows ``Wav2Vec2CTCTokenizer``'s conventions, so a trained model loads with
``AutoTokenizer.from_pretrained``: id 0 is ``<pad>`` (also the CTC blank), id 1 ``<unk>``,
id 2 the word delimiter ``|`` (a space), then the characters seen in training, sorted.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from asrfit.errors import ConfigError
from asrfit.models.ctc import ctc_collapse
from asrfit.utils.io import Pathlike, atomic_write_text
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

PAD_TOKEN, UNK_TOKEN, WORD_DELIMITER = "<pad>", "<unk>", "|"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, WORD_DELIMITER)
UNK_ID, DELIMITER_ID = 1, 2  # BLANK_ID (0) is the CTC blank, from asrfit.models.ctc
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class TextNormalizer(JsonDataclass):
    """How transcripts are normalised before they become labels (and before scoring).

    Attributes:
        lowercase: Fold case.
        remove_punctuation: Drop Unicode punctuation (categories ``P*``), keeping apostrophes
            inside words ("don't").
    """

    lowercase: bool = True
    remove_punctuation: bool = True

    def __call__(self, text: str) -> str:
        """Normalise one transcript: NFKC, case, punctuation, collapsed whitespace."""
        text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.remove_punctuation:
            kept = []
            for i, ch in enumerate(text):
                if unicodedata.category(ch).startswith("P"):
                    inner = (
                        0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()
                    )
                    if ch in "'’" and inner:
                        kept.append("'")
                    else:
                        kept.append(" ")
                else:
                    kept.append(ch)
            text = "".join(kept)
        return _SPACES.sub(" ", text).strip()


class CharVocabulary:
    """A character vocabulary for CTC, saved as a Hugging Face ``Wav2Vec2CTCTokenizer``.

    Args:
        characters: The characters (space excluded; it is the word delimiter).
        normalizer: Applied to every transcript before encoding.

    Raises:
        ConfigError: When a character is repeated, is whitespace, or is a special token.
    """

    def __init__(self, characters: Sequence[str], normalizer: TextNormalizer | None = None) -> None:
        chars = list(characters)
        for ch in chars:
            if len(ch) != 1 or ch.isspace() or ch in SPECIAL_TOKENS:
                raise ConfigError(
                    f"vocabulary character {ch!r}: use single non-space characters other than "
                    f"{', '.join(SPECIAL_TOKENS)}."
                )
        if len(set(chars)) != len(chars):
            raise ConfigError(f"vocabulary characters repeat: {chars}; list each once.")
        self.normalizer = normalizer or TextNormalizer()
        self.tokens: list[str] = [*SPECIAL_TOKENS, *chars]
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}

    @classmethod
    def build(
        cls,
        transcripts: Iterable[str],
        normalizer: TextNormalizer | None = None,
        min_count: int = 1,
    ) -> CharVocabulary:
        """Build the vocabulary of the characters in ``transcripts`` (after normalisation).

        Args:
            transcripts: Training transcripts.
            normalizer: Normalisation. (Default: lowercase, no punctuation)
            min_count: Characters seen fewer times become ``<unk>``. (Default: 1)

        Raises:
            ConfigError: When the transcripts hold no characters.
        """
        normalizer = normalizer or TextNormalizer()
        counts: Counter[str] = Counter()
        for text in transcripts:
            counts.update(normalizer(text))
        chars = sorted(ch for ch, n in counts.items() if n >= min_count and not ch.isspace())
        if not chars:
            raise ConfigError(
                "the training transcripts hold no characters; check the 'text' field."
            )
        rare = sorted(ch for ch, n in counts.items() if n < min_count and not ch.isspace())
        if rare:
            logger.info("vocabulary: %d rare characters map to <unk>: %s", len(rare), "".join(rare))
        return cls(chars, normalizer)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def characters(self) -> list[str]:
        """The characters after the special tokens."""
        return self.tokens[len(SPECIAL_TOKENS) :]

    def encode(self, text: str) -> tuple[list[int], int]:
        """Normalise and encode ``text``.

        Returns:
            ``(ids, unknown)``: the label ids (spaces become the delimiter) and how many
            characters were outside the vocabulary (encoded as ``<unk>``).
        """
        ids, unknown = [], 0
        for ch in self.normalizer(text):
            if ch == " ":
                ids.append(DELIMITER_ID)
                continue
            token_id = self._ids.get(ch)
            if token_id is None:
                unknown += 1
                token_id = UNK_ID
            ids.append(token_id)
        return ids, unknown

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text: specials other than the delimiter are dropped, delimiters become spaces."""
        out = []
        for i in ids:
            i = int(i)
            if i == DELIMITER_ID:
                out.append(" ")
            elif len(SPECIAL_TOKENS) <= i < len(self.tokens):
                out.append(self.tokens[i])
        return _SPACES.sub(" ", "".join(out)).strip()

    def ctc_decode(self, ids: Iterable[int]) -> str:
        """Greedy CTC: collapse repeats, drop blanks (:func:`ctc_collapse`), then :meth:`decode`."""
        return self.decode(ctc_collapse(ids))

    def save(self, folder: Pathlike) -> Path:
        """Write ``vocab.json``, ``tokenizer_config.json`` and ``asrfit_text.json`` to ``folder``.

        ``AutoTokenizer.from_pretrained(folder)`` then gives a ``Wav2Vec2CTCTokenizer`` with
        these ids; :meth:`load` gives this vocabulary back with its normaliser.
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "vocab.json", json.dumps(self._ids, ensure_ascii=False, indent=1))
        config = {
            "tokenizer_class": "Wav2Vec2CTCTokenizer",
            "unk_token": UNK_TOKEN,
            "pad_token": PAD_TOKEN,
            "word_delimiter_token": WORD_DELIMITER,
            "bos_token": None,
            "eos_token": None,
            "do_lower_case": False,
        }
        atomic_write_text(out / "tokenizer_config.json", json.dumps(config, indent=1))
        atomic_write_text(out / "asrfit_text.json", self.normalizer.to_json())
        return out / "vocab.json"

    @classmethod
    def load(cls, folder: Pathlike) -> CharVocabulary:
        """Read a vocabulary written by :meth:`save` (or any ``Wav2Vec2CTCTokenizer`` vocab
        with ``<pad>``, ``<unk>``, ``|`` as ids 0-2).

        Raises:
            ConfigError: When ``vocab.json`` is missing or has other special ids.
        """
        root = Path(folder)
        path = root / "vocab.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no vocabulary here; train a model or pass its folder.")
        ids = json.loads(path.read_text(encoding="utf-8"))
        tokens = [tok for tok, _ in sorted(ids.items(), key=lambda kv: kv[1])]
        if tokens[: len(SPECIAL_TOKENS)] != list(SPECIAL_TOKENS) or sorted(ids.values()) != list(
            range(len(ids))
        ):
            raise ConfigError(
                f"{path}: ids must run 0..{len(ids) - 1} with {', '.join(SPECIAL_TOKENS)} first."
            )
        normalizer = TextNormalizer()
        text_config = root / "asrfit_text.json"
        if text_config.is_file():
            normalizer = TextNormalizer.from_json(text_config.read_text(encoding="utf-8"))
        return cls(tokens[len(SPECIAL_TOKENS) :], normalizer)


class TextCodec(Protocol):
    """What datasets, scoring and saving need from a vocabulary: :class:`CharVocabulary`, or
    :class:`PretrainedText` for a checkpoint that brings its own tokenizer."""

    normalizer: TextNormalizer

    def __len__(self) -> int: ...

    def encode(self, text: str) -> tuple[list[int], int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, folder: Pathlike) -> Path: ...


class PretrainedText:
    """A pretrained checkpoint's own tokenizer (Whisper, Parakeet) behind :class:`TextCodec`.

    Transcripts are normalised by ``normalizer`` before tokenizing, and hypotheses after
    decoding, so scores compare like with like.

    Args:
        tokenizer: A transformers tokenizer (``AutoTokenizer.from_pretrained``).
        normalizer: The run's normalisation. (Default: lowercase, no punctuation)
        label_prefix: Ids every label sequence starts with (Whisper: language, task and
            no-timestamps tokens; the decoder start token is added by the model). (Default: none)
    """

    def __init__(
        self,
        tokenizer: Any,
        normalizer: TextNormalizer | None = None,
        label_prefix: Sequence[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.normalizer = normalizer or TextNormalizer()
        self.label_prefix = tuple(int(i) for i in label_prefix)
        # ParakeetTokenizer merges repeated ids by default (CTC decoding); a transducer's or a
        # decoder's output must be decoded as it is
        decode = getattr(tokenizer, "_decode", None)
        grouping = decode is not None and "group_tokens" in inspect.signature(decode).parameters
        self._decode_kwargs: dict[str, Any] = {"group_tokens": False} if grouping else {}

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> tuple[list[int], int]:
        """Normalise and tokenize ``text`` (no special tokens); ``unknown`` counts ``unk`` ids."""
        ids = list(self.tokenizer(self.normalizer(text), add_special_tokens=False)["input_ids"])
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return ids, sum(1 for i in ids if unk is not None and i == unk)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to normalised text, special tokens dropped."""
        text = self.tokenizer.decode(
            [int(i) for i in ids], skip_special_tokens=True, **self._decode_kwargs
        )
        return self.normalizer(text)

    def save(self, folder: Pathlike) -> Path:
        """Write the tokenizer (``save_pretrained``) and ``asrfit_text.json`` to ``folder``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(out)
        atomic_write_text(out / "asrfit_text.json", self.normalizer.to_json())
        return out
