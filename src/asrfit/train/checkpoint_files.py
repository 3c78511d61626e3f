"""Checkpoint files: their names, their SHA-256 checksum files, and reading them as plain data.

One checkpoint is one file, ``<dir>/checkpoint-<step:08d>.pt``, written through a temporary
file in the same folder and renamed (a crash leaves the previous checkpoint whole), then its
SHA-256 in ``checkpoint-<step:08d>.pt.sha256`` (``sha256sum -c`` reads it), also atomically.
Everything in it is plain data (tensors, numbers, strings, lists, dicts), so it loads with
``torch.load(weights_only=True)``.

Resuming from ``"latest"`` (or a folder) takes the newest checkpoint whose checksum matches;
one that does not (a flipped bit, a truncated copy) or that cannot be read is passed over for
the one before it, with a warning naming both. A checkpoint without its checksum file (one
from an older asrfit, or a kill between the two renames) is used when it reads whole.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from asrfit.errors import ConfigError
from asrfit.utils.io import Pathlike, atomic_write_text, atomic_writer

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)\.pt$")
FORMAT_VERSION = 1
CHECKSUM_SUFFIX = ".sha256"
_HASH_CHUNK_BYTES = 1 << 20


def checkpoint_path(directory: Pathlike, step: int) -> Path:
    """The file of the checkpoint at ``step`` in ``directory``."""
    return Path(directory) / f"checkpoint-{step:08d}.pt"


def list_checkpoints(directory: Pathlike) -> list[Path]:
    """Checkpoint files in ``directory``, oldest step first (empty when there is none)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: Pathlike) -> Path | None:
    """The checkpoint of the highest step in ``directory``, or None (not verified; see
    :func:`latest_good_checkpoint`)."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def checksum_path(path: Pathlike) -> Path:
    """The checksum file of a checkpoint file: ``checkpoint-<step>.pt.sha256``."""
    file = Path(path)
    return file.with_name(file.name + CHECKSUM_SUFFIX)


def file_sha256(path: Pathlike) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_problem(path: Pathlike) -> str | None:
    """Why a checkpoint file cannot be trusted, or None when its checksum matches.

    Args:
        path: A checkpoint file.

    Returns:
        None when the file's SHA-256 equals its ``.sha256`` file's, or when there is no
        checksum file and the file reads whole as a checkpoint; otherwise the reason
        (a mismatch, a missing or unreadable file, a file that does not load).
    """
    file = Path(path)
    if not file.is_file():
        return "the file is missing"
    sidecar = checksum_path(file)
    if sidecar.is_file():
        try:
            expected = sidecar.read_text(encoding="utf-8").split()[0]
            actual = file_sha256(file)
        except (OSError, IndexError, UnicodeDecodeError) as exc:
            return f"its checksum could not be read ({exc})"
        if actual != expected:
            size = file.stat().st_size
            return (
                f"its SHA-256 is {actual[:12]}..., {sidecar.name} says {expected[:12]}... "
                f"(the file, {size:,} bytes, is damaged or truncated)"
            )
        return None
    try:
        read_checkpoint(file)
    except ConfigError as exc:
        return f"it has no {sidecar.name} and does not load ({exc})"
    return None


def latest_good_checkpoint(directory: Pathlike) -> Path | None:
    """The newest checkpoint in ``directory`` whose checksum matches (see :func:`checkpoint_problem`).

    A newer one that fails is passed over with a warning naming it, why, and the one used.

    Args:
        directory: A checkpoint folder.

    Returns:
        The file, or None when the folder has no checkpoint.

    Raises:
        ConfigError: When there are checkpoints and none of them is good.
    """
    found = list_checkpoints(directory)
    bad: list[tuple[Path, str]] = []
    for file in reversed(found):
        problem = checkpoint_problem(file)
        if problem is None:
            for skipped, why in bad:
                logger.warning(
                    "%s: passed over: %s; resuming from the previous good checkpoint %s instead",
                    skipped,
                    why,
                    file,
                )
            return file
        bad.append((file, problem))
    if bad:
        listing = "; ".join(f"{file.name}: {why}" for file, why in bad)
        raise ConfigError(
            f"{directory}: no checkpoint to resume from passes its checksum ({listing}). "
            "Restore the files from a copy, or train afresh without --resume in another folder."
        )
    return None


def read_checkpoint(path: Pathlike) -> dict[str, Any]:
    """Read a checkpoint file as plain data, never running code stored in it.

    The file is unpickled with ``torch.load(weights_only=True)``: tensors, numbers, strings,
    lists and dicts load; a pickled callable, class or any other object is refused before it
    can run.

    Args:
        path: A checkpoint file written by :func:`save_checkpoint`.

    Returns:
        The checkpoint's dict (``model``, ``optimizer``, ``step``, ``extra``, ...).

    Raises:
        ConfigError: When the file is unreadable, holds anything but plain data, or is not an
            asrfit checkpoint of this format.
    """
    file = Path(path)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"{file}: refused: it holds objects other than plain data (tensors, numbers, "
            "strings, lists, dicts), and loading them could run code stored in the file. "
            "asrfit never writes such checkpoints; delete the file, or resume from a checkpoint "
            f"you wrote with asrfit.train.save_checkpoint. ({str(exc).splitlines()[0]})"
        ) from exc
    except Exception as exc:
        raise ConfigError(f"{file}: not a readable asrfit checkpoint ({exc}).") from exc
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f"{file}: not an asrfit checkpoint of format {FORMAT_VERSION}; write it with "
            "asrfit.train.save_checkpoint."
        )
    return state


def resolve_checkpoint(path_or_latest: Pathlike, directory: Pathlike | None = None) -> Path:
    """Turn ``"latest"``, a checkpoint folder or a checkpoint file into a file path.

    Args:
        path_or_latest: ``"latest"`` (the newest in ``directory``), a folder (its newest), or a file.
        directory: Where ``"latest"`` looks.

    Returns:
        The checkpoint file.

    Raises:
        ConfigError: When nothing matches.
    """
    if str(path_or_latest) == "latest":
        if directory is None:
            raise ConfigError("resume_from='latest' needs an out_dir whose checkpoints/ to search.")
        found = latest_good_checkpoint(directory)
        if found is None:
            raise ConfigError(
                f"resume_from='latest': no checkpoint-*.pt in {directory}; train without "
                "resume_from, or point it at a checkpoint file."
            )
        return found
    path = Path(path_or_latest)
    if path.is_dir():
        found = latest_good_checkpoint(path)
        if found is None:
            raise ConfigError(f"resume_from={str(path)!r}: the folder has no checkpoint-*.pt.")
        return found
    if not path.is_file():
        raise ConfigError(f"resume_from={str(path)!r}: no such checkpoint file.")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(
            f"resume_from={str(path)!r}: {problem}; resume from another checkpoint (or from "
            "its folder, which picks the newest good one)."
        )
    return path


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested state (about a checkpoint's size on disk)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def write_checkpoint_file(obj: Any, dest: Path) -> None:
    """``torch.save`` streamed to disk through :func:`asrfit.utils.io.atomic_writer`, then its
    SHA-256 written atomically to the checksum file.

    Args:
        obj: The checkpoint's state (plain data).
        dest: The checkpoint file.

    Raises:
        DiskFullError: No room for the file (it names the path and the bytes its tensors
            need); the earlier checkpoints are untouched and no temporary file is left.
    """
    digest = hashlib.sha256()
    checksum_path(dest).unlink(missing_ok=True)  # never a stale checksum beside a new file
    with atomic_writer(dest, needed_bytes=_tensor_bytes(obj), digest=digest) as handle:
        torch.save(obj, handle)
    atomic_write_text(checksum_path(dest), f"{digest.hexdigest()}  {dest.name}\n")


__all__ = [
    "CHECKPOINT_PATTERN",
    "FORMAT_VERSION",
    "checkpoint_path",
    "checkpoint_problem",
    "checksum_path",
    "file_sha256",
    "latest_checkpoint",
    "latest_good_checkpoint",
    "list_checkpoints",
    "read_checkpoint",
    "resolve_checkpoint",
    "write_checkpoint_file",
]
