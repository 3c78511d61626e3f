"""Fingerprints of what a plan was made for: the model, the GPU and the data.

A plan is a file a user can edit and reuse, so a run that loads one checks that it is being
used for what it was made for (:func:`check_fingerprints`). Each fingerprint is a short
readable string; only what changes the plan's numbers goes into it:

- model: family, class and parameter counts (a different size or architecture, or another
  frozen part, changes every batch limit);
- gpu: the GPU name and its memory per device as CUDA reports it (``"cpu"`` without GPUs);
- data: utterance count, total and longest duration (rounded to 0.1 s), hashed.

Two differences are not a different model or dataset, and a run keeps the plan for them
(logged): a model whose parameter counts differ by at most :data:`MODEL_TOLERANCE` within the
same family and class (``asrfit train`` sizes the output layer to the training corpus's
characters, ``asrfit plan`` profiles the config's), and data that is the plan's less at most
:data:`DATA_TOLERANCE` of its utterances, none longer (``asrfit train`` plans on the
utterances that pass validation, ``asrfit plan`` profiled the whole manifest).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from asrfit.errors import ConfigError

logger = logging.getLogger(__name__)

FINGERPRINT_KEYS = ("model", "gpu", "data")
"""The fingerprints a plan carries, in the order they are checked."""

MODEL_TOLERANCE = 0.01
"""Share by which parameter counts may differ and still be the plan's model (an output layer
resized to a corpus's vocabulary: a few thousand parameters of millions)."""

DATA_TOLERANCE = 0.05
"""Share of the plan's utterances a run's data may lack (the default ``--max-skipped``)."""

_MODEL = re.compile(r"^(?P<kind>\S+) params=(?P<params>\d+) trainable=(?P<trainable>\d+)$")
_DATA = re.compile(
    r"^(?P<n>\d+) utterances, (?P<hours>[\d.]+) h, (longest (?P<longest>[\d.]+) s, )?sha256:(?P<digest>\w+)$"
)


def model_fingerprint(profile: Any) -> str:
    """``family/class params trainable`` of a :class:`~asrfit.profiles.model.ModelProfile`."""
    return (
        f"{profile.family}/{profile.model_class} params={profile.total_params} "
        f"trainable={profile.trainable_params}"
    )


def gpu_fingerprint(hardware: Any) -> str:
    """The GPU name and memory per device of a :class:`~asrfit.profiles.hardware.HardwareProfile`."""
    if not hardware.gpus and hardware.spec is None:
        return "cpu"
    name = hardware.spec.name if hardware.spec is not None else hardware.source
    mib = hardware.gpu_memory_bytes // 2**20
    return f"{name} {mib} MiB" if mib else name


def data_fingerprint(dataset: Any) -> str:
    """A hash of a :class:`~asrfit.profiles.dataset.DatasetProfile`'s size and durations."""
    text = (
        f"{dataset.num_utterances}|{dataset.total_seconds:.1f}|{dataset.duration_max_seconds:.1f}"
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return (
        f"{dataset.num_utterances} utterances, {dataset.total_seconds / 3600:.2f} h, "
        f"longest {dataset.duration_max_seconds:.1f} s, sha256:{digest}"
    )


def fingerprints(hardware: Any, dataset: Any, model_profile: Any) -> dict[str, str]:
    """All three fingerprints, keyed by :data:`FINGERPRINT_KEYS`."""
    return {
        "model": model_fingerprint(model_profile),
        "gpu": gpu_fingerprint(hardware),
        "data": data_fingerprint(dataset),
    }


def close_enough(key: str, saved: str, current: str) -> bool:
    """Whether two different fingerprints still name what the plan was made for (module doc)."""
    if key == "model":
        a, b = _MODEL.match(saved), _MODEL.match(current)
        if a is None or b is None or a["kind"] != b["kind"]:
            return False
        return all(
            abs(int(a[n]) - int(b[n])) <= MODEL_TOLERANCE * max(int(a[n]), int(b[n]))
            for n in ("params", "trainable")
        )
    if key == "data":
        a, b = _DATA.match(saved), _DATA.match(current)
        if a is None or b is None:
            return False
        if a["digest"] == b["digest"]:  # the same data (a plan written before "longest")
            return True
        if a["longest"] is None or b["longest"] is None:
            return False
        n_saved, n_now = int(a["n"]), int(b["n"])
        return (
            (1 - DATA_TOLERANCE) * n_saved <= n_now <= n_saved
            and float(b["hours"]) <= float(a["hours"])
            and float(b["longest"]) <= float(a["longest"])
        )
    return False


def fingerprint_mismatches(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """One line per fingerprint that differs (a plan without a fingerprint is not checked for
    it; differences :func:`close_enough` allows are logged, not returned)."""
    lines = []
    for key in FINGERPRINT_KEYS:
        if key in saved and key in current and saved[key] != current[key]:
            line = f"{key}: plan made for {saved[key]!r}, this run has {current[key]!r}"
            if close_enough(key, saved[key], current[key]):
                logger.info("%s (kept: %s)", line, _WHY[key])
                continue
            lines.append(line)
    return lines


_WHY = {
    "model": f"the same model within {MODEL_TOLERANCE:.0%} of its parameters, e.g. an output "
    "layer sized to this corpus's vocabulary",
    "data": f"the plan's data less at most {DATA_TOLERANCE:.0%} of its utterances (those "
    "validation skipped), none longer",
}


def check_fingerprints(
    saved: dict[str, str], current: dict[str, str], *, where: str, force: bool = False
) -> list[str]:
    """Refuse a plan made for another model, GPU or dataset, unless ``force``.

    Args:
        saved: The plan's ``fingerprints``.
        current: :func:`fingerprints` of this run.
        where: The plan file, for the message.
        force: Return the mismatches instead of raising.

    Returns:
        The mismatch lines (empty when everything matches).

    Raises:
        ConfigError: On a mismatch without ``force``, naming each one.
    """
    lines = fingerprint_mismatches(saved, current)
    if lines and not force:
        raise ConfigError(
            f"{where}: this plan was made for something else:\n  "
            + "\n  ".join(lines)
            + "\nRe-plan (drop --plan), or pass --force-plan to train with it anyway."
        )
    return lines


__all__ = [
    "DATA_TOLERANCE",
    "FINGERPRINT_KEYS",
    "MODEL_TOLERANCE",
    "check_fingerprints",
    "close_enough",
    "data_fingerprint",
    "fingerprint_mismatches",
    "fingerprints",
    "gpu_fingerprint",
    "model_fingerprint",
]
