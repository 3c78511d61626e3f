"""Atomic file writes: nothing the user made is left half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

Pathlike = str | os.PathLike


def atomic_write_bytes(path: Pathlike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    Args:
        path: Destination file. Its parent folder is created when missing.
        data: The bytes to write.

    Returns:
        The destination as a ``Path``.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def atomic_write_text(path: Pathlike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. See :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))
