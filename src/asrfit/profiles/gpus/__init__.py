"""GPU knowledge: the catalog (``catalog.json``, :mod:`.catalog`) and machine probing (:mod:`.probe`)."""

from __future__ import annotations

from asrfit.profiles.gpus.catalog import (
    PRECISIONS,
    GPUCatalog,
    GPUFamily,
    GPUSource,
    GPUSpec,
    catalog_notes,
    find_gpu,
    list_gpus,
    match_detected_gpu,
    normalize_gpu_name,
    resolve_gpu_name,
)

__all__ = [
    "GPUCatalog",
    "GPUFamily",
    "GPUSource",
    "GPUSpec",
    "PRECISIONS",
    "catalog_notes",
    "find_gpu",
    "list_gpus",
    "match_detected_gpu",
    "normalize_gpu_name",
    "resolve_gpu_name",
]
