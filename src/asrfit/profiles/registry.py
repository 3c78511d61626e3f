"""Names to configs: the bundled configs of well-known ASR models, local folders, the Hub cache.

Each ``configs/<name>.json`` is the model's ``config.json`` as published on the Hugging Face
Hub, reduced to the keys its transformers config class defines, plus one extra key,
``asrfit_meta``: the Hub id, extra aliases, the model class asrfit trains, the family, the
published parameter count with its source, and whether the CTC vocabulary size is a
placeholder (pretrained-only checkpoints ship no CTC head). asrfit's own models (the built-in
Conformer-CTC, ``conformer-ctc-*``) have no Hub id and no published count: both are null.

A bundled model resolves by its short name (``"xls-r-1b"``), its Hub id
(``"facebook/wav2vec2-xls-r-1b"``) or any alias, case-insensitively. :func:`load_config` also
takes a local folder with ``config.json``, a config dict, a ``PretrainedConfig`` or any Hub id
whose config is cached (or reachable when online); it never downloads weights. The family
table (:func:`family_of_config`, :func:`model_class_for`) says which class asrfit trains.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from asrfit.errors import ConfigError, UnknownModelError, UnsupportedModelError
from asrfit.profiles.bundled import (
    DEFAULT_PUBLISHED_PARAMS_TOLERANCE,
    FAMILIES,
    META_KEY,
    BundledModel,
    find_bundled,
    get_bundled,
    list_bundled_models,
)

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

# ---------------------------------------------------------------------- families and classes

# model_type -> (family, the class asrfit builds: the ASR head of the family)
_FAMILY_BY_MODEL_TYPE: dict[str, tuple[str, str]] = {
    "wav2vec2": ("wav2vec2", "Wav2Vec2ForCTC"),
    "hubert": ("hubert", "HubertForCTC"),
    "wavlm": ("wavlm", "WavLMForCTC"),
    "whisper": ("whisper", "WhisperForConditionalGeneration"),
    "parakeet_ctc": ("parakeet_ctc", "ParakeetForCTC"),
    "parakeet_tdt": ("parakeet_tdt", "ParakeetForTDT"),
    "asrfit_conformer": ("asrfit_conformer", "ConformerForCTC"),
}

# asrfit's own model types -> the module that defines and registers them with transformers'
# Auto classes. Imported only when such a config is met: it loads transformers' modeling code.
_BUILTIN_MODULES: dict[str, str] = {"asrfit_conformer": "asrfit.models.conformer"}
_BUILTIN_CLASSES: dict[str, str] = {"ConformerForCTC": "asrfit.models.conformer"}


def ensure_registered(model_type: str | None) -> None:
    """Import the asrfit module that registers ``model_type`` with transformers, if it is ours.

    Args:
        model_type: A config's ``model_type``; anything not asrfit's own is ignored.
    """
    module = _BUILTIN_MODULES.get(model_type or "")
    if module is not None:
        importlib.import_module(module)


def family_of_config(config: PretrainedConfig | dict[str, Any]) -> str:
    """Return the asrfit family of a transformers config (``"custom"`` when not a known one).

    Args:
        config: A ``PretrainedConfig`` or a config dict with ``model_type``.

    Returns:
        One of :data:`FAMILIES`.
    """
    model_type = (
        config.get("model_type")
        if isinstance(config, dict)
        else getattr(config, "model_type", None)
    )
    return _FAMILY_BY_MODEL_TYPE.get(model_type or "", ("custom", ""))[0]


def model_class_for(config: PretrainedConfig) -> type[nn.Module]:
    """Return the transformers class asrfit builds for ``config``.

    Known families get their ASR head (``Wav2Vec2ForCTC``, ``WhisperForConditionalGeneration``,
    ``ParakeetForCTC``, ...) whatever the checkpoint's ``architectures`` say, because asrfit
    fine-tunes for speech recognition. Other model types use ``architectures[0]``.

    Args:
        config: The model config.

    Returns:
        The model class.

    Raises:
        UnsupportedModelError: When the model type is unknown and ``architectures`` names no
            class transformers has.
    """
    import transformers

    known = _FAMILY_BY_MODEL_TYPE.get(config.model_type)
    candidates = [known[1]] if known else list(config.architectures or [])
    for class_name in candidates:
        module = _BUILTIN_CLASSES.get(class_name)
        source = importlib.import_module(module) if module is not None else transformers
        cls = getattr(source, class_name, None)
        if cls is not None:
            return cls
    raise UnsupportedModelError(
        f"model_type {config.model_type!r} with architectures {config.architectures} has no class "
        f"asrfit can build; supported model types: {', '.join(_FAMILY_BY_MODEL_TYPE)}, or any "
        "config whose 'architectures' names a transformers class."
    )


# ---------------------------------------------------------------------- resolution


class Resolved(NamedTuple):
    """A config plus where it came from."""

    config: PretrainedConfig
    name: str
    hub_id: str | None
    source: str  # "bundled" | "local" | "hub" | "config"


def _hub_offline() -> bool:
    return any(
        os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def config_from_dict(data: dict[str, Any], where: str = "config") -> PretrainedConfig:
    """Build a ``PretrainedConfig`` from a ``config.json``-style dict.

    Args:
        data: The dict; it must hold ``model_type``. An ``asrfit_meta`` key is ignored.
        where: What to name in error messages (a file, a field).

    Returns:
        The config.

    Raises:
        ConfigError: When ``model_type`` is missing or unknown, or a value is rejected.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    data = {k: v for k, v in data.items() if k != META_KEY}
    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError(
            f"{where}: no 'model_type'; a transformers config.json names its model type."
        )
    ensure_registered(model_type)
    if model_type not in CONFIG_MAPPING:
        raise ConfigError(
            f"{where}: model_type {model_type!r} is not known to the installed transformers; "
            "upgrade transformers or check the config."
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid {model_type} config: {exc}") from exc


def config_to_dict(config: PretrainedConfig) -> dict[str, Any]:
    """Return the config's non-default keys as plain JSON data (``model_type`` included).

    Args:
        config: The config.

    Returns:
        A dict that :func:`config_from_dict` turns back into an equal config.
    """
    return json.loads(json.dumps(config.to_diff_dict(), default=str))


def _unknown(spec: str, reason: str) -> UnknownModelError:
    from asrfit.profiles.hub_lookup import unknown_model_error

    return unknown_model_error(spec, reason)


def _resolve_path(path: Path, spec: str) -> Resolved:
    from transformers import AutoConfig

    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _unknown(spec, f"the folder {path} has no config.json")
        try:
            peek = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"{path / 'config.json'}: not a readable JSON config ({exc})."
            ) from exc
        ensure_registered(peek.get("model_type") if isinstance(peek, dict) else None)
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{path / 'config.json'}: cannot be read as a transformers config: {exc}"
            ) from exc
        return Resolved(config, path.resolve().name, None, "local")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable JSON config ({exc}).") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object.")
    return Resolved(config_from_dict(data, str(path)), path.stem, None, "local")


def resolve(spec: Any, *, local_files_only: bool | None = None) -> Resolved:
    """Turn a name, path, dict, config or profile into a config, saying where it came from.

    Args:
        spec: A bundled name, Hub id or alias; a local folder with ``config.json`` or a JSON
            config file; a config dict; a ``PretrainedConfig``; or any object with a ``config``
            dict attribute and a ``name`` (a ``ModelProfile``).
        local_files_only: Never touch the network (Default: None, meaning True when
            ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set).

    Returns:
        The config (a fresh copy; the caller may modify it), its name, Hub id and source.

    Raises:
        UnknownModelError: When a name resolves nowhere.
        ConfigError: When a config file or dict is malformed.
        UnsupportedModelError: When ``spec`` is of a type that holds no config.
    """
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(spec, PretrainedConfig):
        name = getattr(spec, "_name_or_path", "") or spec.model_type
        return Resolved(copy.deepcopy(spec), name, None, "config")
    if isinstance(spec, dict):
        config = config_from_dict(spec)
        return Resolved(config, config.model_type, None, "config")
    if not isinstance(spec, str):
        profile_config = getattr(spec, "config", None)
        if isinstance(profile_config, dict) and profile_config:
            name = getattr(spec, "name", "config")
            return Resolved(
                config_from_dict(profile_config, f"{name}.config"),
                name,
                getattr(spec, "hub_id", None),
                getattr(spec, "source", "config"),
            )
        raise UnsupportedModelError(
            f"cannot get a model config from a {type(spec).__name__}; pass a model name or path, "
            "a transformers PretrainedConfig or a config dict."
        )
    bundled = find_bundled(spec)
    if bundled is not None:
        config = config_from_dict(bundled.config_dict(), bundled.source_file)
        return Resolved(config, bundled.name, bundled.hub_id, "bundled")
    path = Path(spec).expanduser()
    if path.exists():
        return _resolve_path(path, spec)
    if spec.startswith((".", "/", "~")) or "\\" in spec or spec.count("/") > 1:
        raise _unknown(spec, "no such folder or file")
    offline = _hub_offline() if local_files_only is None else local_files_only
    try:  # the local cache first: no network, no retries
        config = AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError, KeyError):
        config = None
    if config is None:
        from asrfit.profiles.hub_lookup import check_model_spec

        check_model_spec(spec, local_files_only=offline)  # raises, in a second or two
        if offline:
            raise _unknown(spec, "in the Hugging Face cache without a readable config.json")
        try:
            config = AutoConfig.from_pretrained(spec)
        except (OSError, ValueError, KeyError) as exc:
            raise _unknown(
                spec, f"its config.json could not be loaded from the Hub ({exc})"
            ) from exc
    return Resolved(config, spec.rsplit("/", 1)[-1], spec, "hub")


def load_config(spec: Any, *, local_files_only: bool | None = None) -> PretrainedConfig:
    """Return the transformers config for a name, path, dict, config or profile.

    Args:
        spec: See :func:`resolve`.
        local_files_only: See :func:`resolve`.

    Returns:
        A fresh ``PretrainedConfig`` (never the caller's object).

    Raises:
        UnknownModelError: When a name resolves nowhere.
        ConfigError: When a config file or dict is malformed.
    """
    return resolve(spec, local_files_only=local_files_only).config


__all__ = [
    "DEFAULT_PUBLISHED_PARAMS_TOLERANCE",
    "FAMILIES",
    "BundledModel",
    "Resolved",
    "config_from_dict",
    "config_to_dict",
    "ensure_registered",
    "family_of_config",
    "find_bundled",
    "get_bundled",
    "list_bundled_models",
    "load_config",
    "model_class_for",
    "resolve",
]
