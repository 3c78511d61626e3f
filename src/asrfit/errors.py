"""Exceptions raised by asrfit. Every message names the file, field or value and says what to do."""

from __future__ import annotations


class AsrfitError(Exception):
    """Base class for every error asrfit raises on bad input."""


class MissingDependencyError(AsrfitError, ImportError):
    """An optional package the requested setup needs is not installed."""


class ConfigError(AsrfitError, ValueError):
    """A saved profile, plan or config is malformed (unknown key, wrong type, bad value)."""


class ManifestError(AsrfitError, ValueError):
    """A dataset manifest is missing or malformed."""


class AudioError(AsrfitError, OSError):
    """An audio file cannot be read."""


class UnknownGPUError(AsrfitError, KeyError):
    """A GPU name is not in the catalog."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else ""


class UnknownModelError(AsrfitError, KeyError):
    """A model id is neither bundled, cached, nor reachable."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnsupportedModelError(AsrfitError, TypeError):
    """A model class asrfit cannot simulate or train."""


class ShapeError(AsrfitError, ValueError):
    """A batch shape cannot run (for example labels longer than the CTC frames allow)."""


class CheckpointWriteError(AsrfitError, OSError):
    """Another process (the main one, which writes checkpoints) failed to write one."""


class DiskFullError(AsrfitError, OSError):
    """A file could not be written: the disk is full, or a quota or file-size limit was hit.

    Attributes:
        path: The file that was being written (the files written before it are intact).
        needed_bytes: Bytes the file needs (None where not known beforehand).
        written_bytes: Bytes that had been written when the write failed.
        reason: The system's words (``"No space left on device"``, ``"File too large"``).
    """

    def __init__(
        self, path: str, needed_bytes: int | None, written_bytes: int, reason: str
    ) -> None:
        self.path, self.needed_bytes, self.written_bytes = path, needed_bytes, written_bytes
        self.reason = reason
        need = (
            f"it needs {needed_bytes:,} bytes"
            if needed_bytes is not None
            else f"it needs more than the {written_bytes:,} bytes written"
        )
        super().__init__(
            f"{path}: not written: the disk is full or a file-size limit was reached ({reason}) "
            f"after {written_bytes:,} bytes; {need}. Free at least that much space on its "
            "filesystem (or raise the limit: ulimit -f, the quota), then run the same command "
            "with --resume; the files written before are intact."
        )

    def __reduce__(self) -> tuple:  # pickles across processes (data-loader workers)
        return (type(self), (self.path, self.needed_bytes, self.written_bytes, self.reason))
