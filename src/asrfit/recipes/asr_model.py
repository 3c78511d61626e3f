"""The model a training run fine-tunes: a CTC model (the built-in Conformer-CTC, wav2vec2,
HuBERT, WavLM, Parakeet-CTC), Whisper (an encoder-decoder) or Parakeet-TDT (a transducer).

A model spec is what the rest of asrfit takes: a bundled name ("conformer-ctc-small",
"wav2vec2-base", "whisper-tiny", "parakeet-tdt-0.6b-v2"), a Hub id or a local folder. Weights
load with ``from_pretrained`` when the spec has them (a Hub id that is cached or reachable, a
folder with weights); bundled configs start from random weights, which is what tests and
offline demos use.

The output layer is sized to the run's character vocabulary (``<pad>`` = 0, ``<unk>`` = 1,
``|`` = 2, then the characters), with the family's special ids placed after the characters,
so none collides with one:

* CTC: ``vocab_size = len(vocab)``, blank = ``<pad>`` = 0.
* Whisper: ``vocab_size = len(vocab) + 2``; end of text = ``len(vocab)``, decoder start =
  ``len(vocab) + 1``, pad = ``<pad>`` = 0. Labels are the transcript's ids then end of text.
* Parakeet-TDT: ``vocab_size = len(vocab) + 1``; blank = ``len(vocab)`` (the last id, as in
  the released checkpoints), pad = ``<pad>`` = 0.

A pretrained Whisper or Parakeet-TDT whose tokenizer loads (``AutoTokenizer``) keeps its own
vocabulary and tokenizer instead (:class:`~asrfit.data.text.PretrainedText`); the log says
which tokenizer a run uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from asrfit.data.features import Frontend, frontend_for
from asrfit.data.text import CharVocabulary, PretrainedText, TextCodec
from asrfit.errors import ConfigError
from asrfit.models.ctc import BLANK_ID
from asrfit.models.decoding import SEQUENCE_FAMILIES
from asrfit.models.losses import LossFn, UnitsFn, loss_functions

logger = logging.getLogger(__name__)

CTC_FAMILIES = ("asrfit_conformer", "wav2vec2", "hubert", "wavlm", "parakeet_ctc")
SUPPORTED_FAMILIES = CTC_FAMILIES + SEQUENCE_FAMILIES

# transformers' class for each family's saved folder (AutoModelForCTC for the rest)
AUTO_CLASSES = {"whisper": "AutoModelForSpeechSeq2Seq", "parakeet_tdt": "AutoModelForTDT"}


@dataclass
class ASRModel:
    """A model ready to train, with what feeds, trains and checks it.

    Attributes:
        model: The ``PreTrainedModel``.
        config: Its config (what the planner and the simulator read).
        family: Its asrfit family.
        frontend: Audio to inputs.
        output_frames: CTC output frames for a number of input frames (None when unknown).
        name: The spec it came from.
        pretrained: Whether weights were loaded.
        vocab: The text codec the datasets encode with: the run's character vocabulary, or
            the checkpoint's own tokenizer. (Default: None, meaning the vocabulary passed in)
        loss_fn: ``loss_fn(model, batch) -> (loss_sum, units)`` for the trainer
            (see :mod:`asrfit.models.losses`).
        units_fn: Counts the units of a batch the way ``loss_fn`` does.
    """

    model: nn.Module
    config: Any
    family: str
    frontend: Frontend
    output_frames: Callable[[int], int] | None
    name: str
    pretrained: bool
    vocab: TextCodec | None = None
    loss_fn: LossFn | None = field(default=None, repr=False)
    units_fn: UnitsFn | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        default_loss, default_units = loss_functions(self.family)
        self.loss_fn = self.loss_fn or default_loss
        self.units_fn = self.units_fn or default_units

    @property
    def num_parameters(self) -> int:
        """All parameters."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def is_ctc(self) -> bool:
        """Whether the model trains with CTC."""
        return self.family in CTC_FAMILIES

    def label_rules(self, *, scoring: bool = False) -> dict[str, Any]:
        """Keyword arguments of :class:`~asrfit.data.dataset.SpeechDataset` that give this
        model's labels: the CTC frame check (not when ``scoring``: every dev and test
        utterance is scored), or Whisper's label prefix, end of text and
        ``max_target_positions``; nothing for Parakeet-TDT (a transducer can emit several
        tokens per frame)."""
        if self.is_ctc:
            return {} if scoring else {"output_frames": self.output_frames}
        if self.family == "whisper":
            return {
                "label_prefix": tuple(getattr(self.vocab, "label_prefix", ())),
                "label_suffix": (int(self.config.eos_token_id),),
                "max_labels": int(self.config.max_target_positions),
            }
        return {}


def _apply_overrides(config: Any, data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Write ``overrides`` into ``data`` (the config as a dict), checking each field exists.

    A key the config lacks goes to its ``encoder_config`` when that has it (Parakeet:
    ``hidden_size``, ``num_hidden_layers``...); ``"encoder_config.hidden_act"`` names a
    sub-config field explicitly.
    """
    sub = getattr(config, "encoder_config", None)
    for key, value in overrides.items():
        head, dot, rest = key.partition(".")
        if dot and isinstance(data.get(head), dict) and hasattr(getattr(config, head), rest):
            target, owner, name = data[head], getattr(config, head), rest
        elif hasattr(config, key):
            target, owner, name = data, config, key
        elif sub is not None and hasattr(sub, key):
            target, owner, name = data["encoder_config"], sub, key
        else:
            raise ConfigError(
                f"model override {key}={value!r}: {type(config).__name__} has no field {key!r}."
            )
        target[name] = value
        _follow_derived(target, owner, name, overrides)


# fields a config derives from another in __post_init__, which to_dict() freezes
_DERIVED = {"num_attention_heads": "num_key_value_heads"}


def _follow_derived(
    target: dict[str, Any], owner: Any, name: str, overrides: dict[str, Any]
) -> None:
    """Keep a derived field equal to its source when it was equal before and is not overridden
    (Parakeet's ``num_key_value_heads`` follows ``num_attention_heads``)."""
    derived = _DERIVED.get(name)
    if derived is None or derived in overrides or derived not in target:
        return
    if getattr(owner, derived, None) == getattr(owner, name, None):
        target[derived] = target[name]


def _config_for(
    config: Any, family: str, vocab: CharVocabulary | None, overrides: dict[str, Any]
) -> Any:
    """A fresh config with the overrides and (unless None) the vocabulary, validated by its class."""
    data = config.to_dict()
    _apply_overrides(config, data, overrides)
    if vocab is not None:
        data.update(_vocab_fields(family, len(vocab), data))
    return type(config).from_dict(data)


def _vocab_fields(family: str, n: int, data: dict[str, Any]) -> dict[str, Any]:
    """Config fields that size the output to ``n`` characters and place the special ids."""
    if family == "whisper":
        eos, start = n, n + 1
        return {
            "vocab_size": n + 2,
            "eos_token_id": eos,
            "decoder_start_token_id": start,
            "bos_token_id": start,
            "pad_token_id": BLANK_ID,
            "begin_suppress_tokens": None,
            "suppress_tokens": None,
        }
    if family == "parakeet_tdt":
        return {"vocab_size": n + 1, "blank_token_id": n, "pad_token_id": BLANK_ID}
    fields: dict[str, Any] = {"vocab_size": n, "pad_token_id": BLANK_ID}
    if family in ("wav2vec2", "hubert", "wavlm"):
        fields.update(ctc_loss_reduction="mean", ctc_zero_infinity=True)
    if family == "parakeet_ctc":
        fields["ctc_zero_infinity"] = True
    if family == "asrfit_conformer" and data.get("decoder_layers"):
        fields.update(bos_token_id=None, eos_token_id=None)  # re-derived from the new vocab_size
    return fields


# a checkpoint's vocab_size may exceed its tokenizer's tokens by a few (Parakeet-TDT: the blank)
_TOKENIZER_SLACK = 8


def _pretrained_tokenizer(
    source: str, family: str, config: Any, vocab: CharVocabulary
) -> PretrainedText | None:
    """The checkpoint's own tokenizer for Whisper / Parakeet-TDT, or None (logged) when none
    loads or the one that loads does not cover the checkpoint's ``vocab_size`` (transformers
    builds an empty tokenizer for a folder without tokenizer files)."""
    from transformers import AutoTokenizer

    fallback = "training the character vocabulary instead"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, ImportError) as err:
        logger.warning("%s: no tokenizer available (%s); %s.", source, err, fallback)
        return None
    if not 0 <= int(config.vocab_size) - len(tokenizer) <= _TOKENIZER_SLACK:
        logger.warning(
            "%s: its tokenizer has %d tokens for the model's vocab_size=%d; %s.",
            source,
            len(tokenizer),
            config.vocab_size,
            fallback,
        )
        return None
    prefix: list[int] = []
    if family == "whisper" and hasattr(tokenizer, "set_prefix_tokens"):
        tokenizer.set_prefix_tokens(task="transcribe", predict_timestamps=False)
        prefix = list(tokenizer.prefix_tokens)[1:]  # the model puts the start token itself
    return PretrainedText(tokenizer, vocab.normalizer, label_prefix=prefix)


def build_asr_model(
    spec: str,
    vocab: CharVocabulary,
    *,
    pretrained: bool = True,
    freeze_feature_encoder: bool = True,
    overrides: dict[str, Any] | None = None,
) -> ASRModel:
    """Build the model for ``spec`` with its output sized to ``vocab`` (see the module docstring).

    Args:
        spec: A bundled name, Hub id or local folder.
        vocab: The run's vocabulary (sets ``vocab_size``; blank = ``<pad>`` = 0 for CTC).
        pretrained: Load weights when the spec has them (Default: True).
        freeze_feature_encoder: Freeze the conv feature encoder of wav2vec2-style models.
        overrides: Config fields to change, e.g. ``{"d_model": 144, "encoder_layers": 4}``.

    Raises:
        ConfigError: For a family asrfit cannot train, or an override the config does not have.
        UnknownModelError: When the spec names no model.
    """
    import asrfit.models.conformer  # noqa: F401  registers the built-in model with transformers
    from asrfit.memory.models.adapters import hf_adapter
    from asrfit.profiles.registry import family_of_config, model_class_for, resolve

    resolved = resolve(spec)
    family = family_of_config(resolved.config)
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(
            f"{spec}: model type {resolved.config.model_type!r} (family {family!r}) is not one "
            f"`asrfit train` can train; use one of the families {', '.join(SUPPORTED_FAMILIES)}."
        )
    source = resolved.hub_id if resolved.source in ("hub", "bundled") else None
    if resolved.source == "local":
        source = str(spec)
    text: TextCodec = vocab
    if pretrained and source is not None and family in SEQUENCE_FAMILIES:
        text = _pretrained_tokenizer(source, family, resolved.config, vocab) or vocab
    own_tokenizer = isinstance(text, PretrainedText)
    config = _config_for(resolved.config, family, None if own_tokenizer else vocab, overrides or {})
    model, loaded = _instantiate(
        model_class_for(config), config, source if pretrained else None, spec
    )
    if freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    if family == "parakeet_tdt":  # so that transformers' generate() runs on the saved model too
        model.generation_config.decoder_start_token_id = int(config.blank_token_id)
        model.generation_config.pad_token_id = config.pad_token_id
    adapter = hf_adapter(config, name=resolved.name)
    frontend = frontend_for(config, family, source if loaded else None)
    logger.info(
        "%s: %s, %.1fM parameters, %s weights; text: %s",
        resolved.name,
        type(model).__name__,
        sum(p.numel() for p in model.parameters()) / 1e6,
        "pretrained" if loaded else "random",
        _describe(text),
    )
    return ASRModel(
        model,
        config,
        family,
        frontend,
        adapter.output_frames if family in CTC_FAMILIES else None,
        resolved.name,
        loaded,
        vocab=text,
    )


def _describe(text: TextCodec) -> str:
    """Which tokenizer a run uses, for the log."""
    if isinstance(text, PretrainedText):
        return f"the checkpoint's own {type(text.tokenizer).__name__} ({len(text)} tokens)"
    return f"the {len(text)}-token character vocabulary"


def _instantiate(
    cls: type[nn.Module], config: Any, source: str | None, spec: str
) -> tuple[nn.Module, bool]:
    """``cls.from_pretrained(source)`` when it has weights (mismatched heads re-initialised),
    else ``cls(config)`` with random weights. Returns the model and whether weights loaded."""
    if source is not None:
        try:
            return cls.from_pretrained(source, config=config, ignore_mismatched_sizes=True), True
        except (OSError, ValueError) as err:
            logger.warning(
                "%s: no weights available (%s); starting from random weights.", spec, err
            )
    return cls(config), False


def auto_class_for(family: str) -> Any:
    """The transformers Auto class that loads a saved model of ``family``."""
    import transformers

    import asrfit.models.conformer  # noqa: F401  AutoModelForCTC knows the built-in model

    return getattr(transformers, AUTO_CLASSES.get(family, "AutoModelForCTC"))
