"""Helpers for tests: factories that make tiny manifests, audio folders and datasets on disk."""

from __future__ import annotations

from asrfit.testing.dummies import (
    dummy_audio_folder,
    dummy_cutset,
    dummy_hf_dataset,
    dummy_manifest,
    dummy_texts,
    write_dummy_audio,
    write_manifest,
)

__all__ = [
    "dummy_audio_folder",
    "dummy_cutset",
    "dummy_hf_dataset",
    "dummy_manifest",
    "dummy_texts",
    "write_dummy_audio",
    "write_manifest",
]
