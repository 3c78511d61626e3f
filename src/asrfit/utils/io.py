"""Atomic file writes: nothing the user made is left half-written, and a full disk is named."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asrfit.errors import DiskFullError

Pathlike = str | os.PathLike

# no space left, file too large (RLIMIT_FSIZE), disk quota exceeded
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
_OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)")  # how Rust libraries (safetensors) report it


def disk_full_reason(exc: BaseException) -> str | None:
    """The system's words when ``exc`` (or an error it came from) is a full disk, else None.

    Recognises an ``OSError`` with ``ENOSPC``, ``EFBIG`` or ``EDQUOT``, also one reported as
    text by a library (safetensors: ``"I/O error: File too large (os error 27)"``).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return os.strerror(current.errno)
        match = _OS_ERROR_IN_TEXT.search(str(current))
        if match and int(match.group(1)) in DISK_FULL_ERRNOS:
            return os.strerror(int(match.group(1)))
        current = current.__cause__ or current.__context__
    return None


class _TrackedWriter:
    """A binary file handle that counts (and optionally hashes) what is written, and keeps
    the first ``OSError``: ``torch.save`` turns it into an unrelated ``RuntimeError``."""

    def __init__(self, handle: Any, digest: Any = None) -> None:
        self.handle, self.digest = handle, digest
        self.written_bytes = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            count = self.handle.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        if self.digest is not None:
            self.digest.update(memoryview(data)[:count] if count is not None else data)
        self.written_bytes += count if count is not None else len(data)
        return count

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as exc:
            self.error = self.error or exc
            raise

    def fileno(self) -> int:
        return self.handle.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def _file_mode(dest: Path) -> int:
    """The mode ``dest`` keeps (when it exists) or a new file gets under the umask."""
    with contextlib.suppress(FileNotFoundError):
        return dest.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_writer(
    path: Pathlike, *, needed_bytes: int | None = None, digest: Any = None
) -> Iterator[Any]:
    """Open a temporary file next to ``path`` for writing; on success fsync it and rename it
    over ``path``, on any error remove it (``path`` is never half-written).

    Streams to disk, so the content need not fit in memory (a checkpoint). The parent folder
    is created when missing. The file gets the mode an ordinary ``open(path, "w")`` would
    give it (an existing file keeps its own).

    Args:
        path: The destination file.
        needed_bytes: The file's expected size, named in the error when the disk is full.
        digest: A ``hashlib`` object updated with every byte written (a checksum).

    Yields:
        A binary file handle (``write``, ``flush``, ``fileno``).

    Raises:
        DiskFullError: The disk, a quota or the file-size limit was full (``ENOSPC``,
            ``EDQUOT``, ``EFBIG``); it names the path and the bytes needed.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    writer: _TrackedWriter | None = None
    try:
        os.fchmod(fd, _file_mode(dest))  # mkstemp makes 0600; give the file its normal mode
        with os.fdopen(fd, "wb") as handle:
            writer = _TrackedWriter(handle, digest)
            yield writer
            writer.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        cause = writer.error if writer is not None and writer.error is not None else exc
        reason = disk_full_reason(cause)
        if reason is not None:
            written = writer.written_bytes if writer is not None else 0
            raise DiskFullError(str(dest), needed_bytes, written, reason) from cause
        raise


def atomic_write_bytes(path: Pathlike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename.

    Args:
        path: Destination file. Its parent folder is created when missing.
        data: The bytes to write.

    Returns:
        The destination as a ``Path``.
    """
    with atomic_writer(path, needed_bytes=len(data)) as handle:
        handle.write(data)
    return Path(path)


def atomic_write_text(path: Pathlike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. See :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def remove_stale_temporaries(folder: Pathlike) -> list[Path]:
    """Delete the temporary files :func:`atomic_writer` leaves when a process is killed mid-write
    (``.NAME.XXXXXXXX.tmp``), anywhere under ``folder``.

    Call it only when no other process writes there (at the start of a run).

    Returns:
        The files removed.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    removed = []
    for path in root.rglob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
