"""Model inputs from audio: log-mel for the built-in model, the Hugging Face feature extractor
of the model's family otherwise (Wav2Vec2 / HuBERT / WavLM waveforms, Whisper and Parakeet
log-mels; Whisper's padded to the encoder's fixed window, ``2 * max_source_positions`` frames).
:class:`~asrfit.models.logmel.LogMel` lives with the models (a saved Conformer carries it) and
is re-exported here.

A :class:`Frontend` turns one utterance's 16 kHz mono audio into the tensors of one sample
(the keys the model's ``forward`` takes); :func:`~asrfit.train.batching.pad_collate` pads them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrfit.errors import ConfigError
from asrfit.models.logmel import SAMPLE_RATE_HZ, LogMel, mel_filterbank
from asrfit.utils.io import Pathlike, atomic_write_text


class Frontend:
    """Audio to one model sample.

    Attributes:
        family: The model family (see :mod:`asrfit.profiles.model`).
        sample_rate: The rate audio must have.
        input_key: The model's main input (``input_features`` or ``input_values``).
        window_frames: Whisper: every sample is padded (or cut) to exactly this many frames,
            the encoder's ``2 * max_source_positions``; None for the other families.
    """

    def __init__(
        self,
        family: str,
        extractor: Any,
        *,
        use_attention_mask: bool = True,
        window_frames: int | None = None,
    ) -> None:
        self.family, self.extractor = family, extractor
        self.sample_rate = int(
            getattr(extractor, "sampling_rate", None)
            or getattr(extractor, "sample_rate", SAMPLE_RATE_HZ)
        )
        self.use_attention_mask = use_attention_mask
        self.input_key = (
            "input_values" if family in ("wav2vec2", "hubert", "wavlm") else "input_features"
        )
        self.window_frames = window_frames
        if window_frames is not None:
            _fit_window(extractor, window_frames)

    @property
    def max_seconds(self) -> float | None:
        """The longest audio the model takes (Whisper's fixed window), or None (no limit)."""
        if self.window_frames is None:
            return None
        return self.window_frames / self.frames_per_second

    @property
    def frames_per_second(self) -> float:
        """Input frames (or samples) per second of audio."""
        if self.input_key == "input_values":
            return float(self.sample_rate)
        return self.sample_rate / float(getattr(self.extractor, "hop_length", 160))

    def __call__(self, audio: np.ndarray) -> dict[str, torch.Tensor]:
        """The sample's input tensors (without labels)."""
        if isinstance(self.extractor, LogMel):
            feats = self.extractor(audio)
            return {
                "input_features": feats,
                "attention_mask": torch.ones(len(feats), dtype=torch.long),
            }
        if self.window_frames is not None:
            return {self.input_key: self._window(audio)}
        out = self.extractor(
            audio, sampling_rate=self.sample_rate, return_tensors="pt", return_attention_mask=True
        )
        sample = {self.input_key: out[self.input_key][0]}
        if (
            self.family.startswith("parakeet")
            and sample[self.input_key].shape[0] != out["attention_mask"].shape[-1]
        ):
            sample[self.input_key] = sample[self.input_key].T
        mask = out.get("attention_mask")
        if self.use_attention_mask:
            sample["attention_mask"] = (
                mask[0].long()
                if mask is not None
                else torch.ones(sample[self.input_key].shape[0], dtype=torch.long)
            )
        return sample

    def _window(self, audio: np.ndarray) -> torch.Tensor:
        """Whisper's ``[mels, window_frames]`` features: audio padded (or cut) to the window."""
        samples = self.window_frames * int(self.extractor.hop_length)
        out = self.extractor(
            audio,
            sampling_rate=self.sample_rate,
            return_tensors="pt",
            padding="max_length",
            max_length=samples,
            truncation=True,
        )
        feats = out[self.input_key][0][:, : self.window_frames]
        if feats.shape[-1] < self.window_frames:
            feats = torch.nn.functional.pad(feats, (0, self.window_frames - feats.shape[-1]))
        return feats

    def save(self, folder: Pathlike) -> None:
        """Write the extractor's ``preprocessor_config.json`` beside the model."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        if isinstance(self.extractor, LogMel):  # the built-in Conformer's own extractor
            from asrfit.models.conformer.feature_extraction import ConformerFeatureExtractor

            extractor = ConformerFeatureExtractor(**self.extractor.to_dict())
            atomic_write_text(out / "preprocessor_config.json", extractor.to_json_string())
        else:
            self.extractor.save_pretrained(out)


def frontend_for(config: Any, family: str, source: str | None = None) -> Frontend:
    """The frontend for a model config.

    Args:
        config: The model's ``PretrainedConfig``.
        family: Its asrfit family.
        source: A Hub id or folder to load the feature extractor from (falls back to the
            family's default extractor, configured from ``config``, when it has none).

    Raises:
        ConfigError: For a family asrfit has no frontend for.
    """
    if family == "asrfit_conformer":
        return Frontend(family, LogMel(n_mels=int(config.num_mel_bins)))
    import transformers

    window = 2 * int(config.max_source_positions) if family == "whisper" else None
    if source is not None:
        try:
            extractor = transformers.AutoFeatureExtractor.from_pretrained(source)
            return Frontend(
                family,
                extractor,
                use_attention_mask=_wants_mask(config, family),
                window_frames=window,
            )
        except (OSError, ValueError, KeyError):
            pass  # a bundled config or an offline machine: build the family default below
    if family in ("wav2vec2", "hubert", "wavlm"):
        layer_norm = getattr(config, "feat_extract_norm", "layer") == "layer"
        extractor = transformers.Wav2Vec2FeatureExtractor(
            feature_size=1,
            sampling_rate=SAMPLE_RATE_HZ,
            do_normalize=True,
            return_attention_mask=layer_norm,
        )
        return Frontend(family, extractor, use_attention_mask=layer_norm)
    if family == "whisper":
        extractor = transformers.WhisperFeatureExtractor(feature_size=int(config.num_mel_bins))
        return Frontend(family, extractor, use_attention_mask=False, window_frames=window)
    if family in ("parakeet_ctc", "parakeet_tdt"):
        enc = getattr(config, "encoder_config", config)
        return Frontend(
            family, transformers.ParakeetFeatureExtractor(feature_size=int(enc.num_mel_bins))
        )
    raise ConfigError(
        f"model family {family!r}: asrfit has no audio frontend for it; use a supported model."
    )


def _fit_window(extractor: Any, frames: int) -> None:
    """Set a ``WhisperFeatureExtractor``'s window to ``frames`` (the encoder's
    ``2 * max_source_positions``), so it pads to that and its saved config says so."""
    hop, rate = int(extractor.hop_length), int(extractor.sampling_rate)
    extractor.n_samples = frames * hop
    extractor.nb_max_frames = frames
    seconds = frames * hop / rate
    extractor.chunk_length = int(seconds) if float(seconds).is_integer() else seconds


def _wants_mask(config: Any, family: str) -> bool:
    if family in ("wav2vec2", "hubert", "wavlm"):
        return getattr(config, "feat_extract_norm", "layer") == "layer"
    return family != "whisper"


def seconds_to_frames(seconds: float, frames_per_second: float) -> int:
    """Input frames in ``seconds`` of audio (rounded up)."""
    return int(math.ceil(seconds * frames_per_second))


__all__ = [
    "SAMPLE_RATE_HZ",
    "Frontend",
    "LogMel",
    "frontend_for",
    "mel_filterbank",
    "seconds_to_frames",
]
