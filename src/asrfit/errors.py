"""Exceptions raised by asrfit. Every message names the file, field or value and says what to do."""

from __future__ import annotations


class AsrfitError(Exception):
    """Base class for every error asrfit raises on bad input."""


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
