"""Helpers for tests: factories that make tiny manifests, audio folders and datasets on disk
(:mod:`asrfit.testing.dummies`), and hand-made plans (:mod:`asrfit.testing.plans`)."""

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
from asrfit.testing.plans import make_bucket, make_plan, reference_cost_model

__all__ = [
    "dummy_audio_folder",
    "dummy_cutset",
    "dummy_hf_dataset",
    "dummy_manifest",
    "dummy_texts",
    "make_bucket",
    "make_plan",
    "reference_cost_model",
    "write_dummy_audio",
    "write_manifest",
]
