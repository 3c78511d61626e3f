"""The model a training run fine-tunes: the built-in Conformer-CTC or a Hugging Face CTC model.

A model spec is what the rest of asrfit takes: a bundled name ("conformer-ctc-small",
"wav2vec2-base", "parakeet-ctc-0.6b"), a Hub id or a local folder. Its CTC head is sized to the
run's character vocabulary with the blank at id 0. Weights load with ``from_pretrained`` when
the spec has them (a Hub id that is cached or reachable, a folder with weights); bundled
configs start from random weights, which is what tests and offline demos use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from asrfit.asr.features import Frontend, frontend_for
from asrfit.asr.text import BLANK_ID, CharVocabulary
from asrfit.errors import ConfigError

logger = logging.getLogger(__name__)

CTC_FAMILIES = ("asrfit_conformer", "wav2vec2", "hubert", "wavlm", "parakeet_ctc")


@dataclass
class ASRModel:
    """A model ready to train, with what feeds and checks it.

    Attributes:
        model: The ``PreTrainedModel``.
        config: Its config (what the planner and the simulator read).
        family: Its asrfit family.
        frontend: Audio to inputs.
        output_frames: CTC output frames for a number of input frames.
        name: The spec it came from.
        pretrained: Whether weights were loaded.
    """

    model: nn.Module
    config: Any
    family: str
    frontend: Frontend
    output_frames: Callable[[int], int] | None
    name: str
    pretrained: bool

    @property
    def num_parameters(self) -> int:
        """All parameters."""
        return sum(p.numel() for p in self.model.parameters())


def _ctc_config(config: Any, family: str, vocab: CharVocabulary, overrides: dict[str, Any]) -> Any:
    """A fresh config with the overrides and the vocabulary, validated by its class."""
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ConfigError(f"model override {key}={value!r}: {type(config).__name__} has no field {key!r}.")
    data = {**config.to_dict(), **overrides, "vocab_size": len(vocab), "pad_token_id": BLANK_ID}
    if family in ("wav2vec2", "hubert", "wavlm"):
        data.update(ctc_loss_reduction="mean", ctc_zero_infinity=True)
    if family == "parakeet_ctc":
        data["ctc_zero_infinity"] = True
    if family == "asrfit_conformer" and data.get("decoder_layers"):
        data.update(bos_token_id=None, eos_token_id=None)  # re-derived from the new vocab_size
    return type(config).from_dict(data)


def build_asr_model(
    spec: str,
    vocab: CharVocabulary,
    *,
    pretrained: bool = True,
    freeze_feature_encoder: bool = True,
    overrides: dict[str, Any] | None = None,
) -> ASRModel:
    """Build the model for ``spec`` with a CTC head over ``vocab``.

    Args:
        spec: A bundled name, Hub id or local folder.
        vocab: The run's vocabulary (sets ``vocab_size``; blank = ``<pad>`` = 0).
        pretrained: Load weights when the spec has them (Default: True).
        freeze_feature_encoder: Freeze the conv feature encoder of wav2vec2-style models.
        overrides: Config fields to change, e.g. ``{"d_model": 144, "encoder_layers": 4}``.

    Raises:
        ConfigError: For a family asrfit cannot train with a character CTC head, or an
            override the config does not have.
        UnknownModelError: When the spec names no model.
    """
    import asrfit.asr.conformer  # noqa: F401  registers the built-in model with transformers
    from asrfit.memory.adapters import hf_adapter
    from asrfit.profiles.registry import family_of_config, model_class_for, resolve

    resolved = resolve(spec)
    config = resolved.config
    family = family_of_config(config)
    if family not in CTC_FAMILIES:
        raise ConfigError(
            f"{spec}: family {family!r} trains with a subword tokenizer and sequence decoding, "
            f"which `asrfit train` does not do yet; train one of the CTC families: {', '.join(CTC_FAMILIES)}."
        )
    config = _ctc_config(config, family, vocab, overrides or {})
    cls = model_class_for(config)
    model, loaded = None, False
    source = resolved.hub_id if resolved.source in ("hub", "bundled") else None
    if resolved.source == "local":
        source = str(spec)
    if pretrained and source is not None:
        try:
            model = cls.from_pretrained(source, config=config, ignore_mismatched_sizes=True)
            loaded = True
        except (OSError, ValueError) as err:
            logger.warning("%s: no weights available (%s); starting from random weights.", spec, err)
    if model is None:
        model = cls(config)
    if freeze_feature_encoder and hasattr(model, "freeze_feature_encoder"):
        model.freeze_feature_encoder()
    adapter = hf_adapter(config, name=resolved.name)
    frontend = frontend_for(config, family, source if loaded else None)
    logger.info("%s: %s, %.1fM parameters, %s weights", resolved.name, cls.__name__,
                sum(p.numel() for p in model.parameters()) / 1e6, "pretrained" if loaded else "random")
    return ASRModel(model, config, family, frontend, adapter.output_frames, resolved.name, loaded)
