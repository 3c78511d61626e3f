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
import functools
import importlib
import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from asrfit.errors import ConfigError, UnknownModelError, UnsupportedModelError

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

_META_KEY = "asrfit_meta"
_REQUIRED_META = (
    "name",
    "hub_id",
    "model_class",
    "family",
    "published_params",
    "published_params_source",
)
_OPTIONAL_META = (
    "aliases",
    "published_params_tolerance",
    "vocab_size_is_placeholder",
    "notes",
)
DEFAULT_PUBLISHED_PARAMS_TOLERANCE = 0.03


@dataclass(frozen=True)
class BundledModel:
    """One bundled model: its ``asrfit_meta`` and its Hub ``config.json`` content.

    Attributes:
        name: Short name, also the file stem (``"xls-r-1b"``).
        hub_id: The Hugging Face Hub id (``"facebook/wav2vec2-xls-r-1b"``); None for asrfit's
            own models.
        aliases: Other names that resolve to this model.
        model_class: The transformers class asrfit builds (``"Wav2Vec2ForCTC"``).
        family: One of the families of :mod:`asrfit.profiles.model`.
        published_params: Parameter count given by the model card or paper; None for asrfit's
            own models (their count is whatever the built model has).
        published_params_source: Where ``published_params`` comes from.
        published_params_tolerance: Relative gap between the built model's count and
            ``published_params`` that is explained (rounded figures, a head the published
            figure leaves out); 0.03 unless the file says otherwise, with a reason in ``notes``.
        vocab_size_is_placeholder: True when the checkpoint has no CTC head and the
            config's ``vocab_size`` is a typical fine-tuning vocabulary, not the model's.
        notes: Free text: what the published figure counts, what was left out.
        source_file: The JSON file this entry was read from.
    """

    name: str
    hub_id: str | None
    aliases: tuple[str, ...]
    model_class: str
    family: str
    published_params: int | None
    published_params_source: str
    published_params_tolerance: float
    vocab_size_is_placeholder: bool
    notes: str
    source_file: str
    _config: dict[str, Any] = field(repr=False, compare=False)

    def config_dict(self) -> dict[str, Any]:
        """Return a fresh copy of the model's config dict (``model_type`` included).

        Returns:
            The ``config.json`` content without ``asrfit_meta``; safe to modify.
        """
        return copy.deepcopy(self._config)

    def names(self) -> tuple[str, ...]:
        """Return every name that resolves to this model: short name, Hub id, aliases."""
        hub = (self.hub_id,) if self.hub_id is not None else ()
        return (self.name, *hub, *self.aliases)


def _parse_entry(stem: str, text: str, where: str) -> BundledModel:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc}).") from exc
    if not isinstance(data, dict) or not isinstance(data.get(_META_KEY), dict):
        raise ConfigError(f"{where}: expected a JSON object with an {_META_KEY!r} object.")
    meta = data.pop(_META_KEY)
    missing = [k for k in _REQUIRED_META if k not in meta]
    unknown = sorted(set(meta) - set(_REQUIRED_META) - set(_OPTIONAL_META))
    if missing or unknown:
        raise ConfigError(
            f"{where}: {_META_KEY} has missing key(s) {missing} and unknown key(s) {unknown}; "
            f"known keys are {sorted(_REQUIRED_META + _OPTIONAL_META)}."
        )
    if meta["name"] != stem:
        raise ConfigError(
            f"{where}: {_META_KEY}.name is {meta['name']!r}; it must equal the file stem."
        )
    if "model_type" not in data:
        raise ConfigError(
            f"{where}: the config has no 'model_type'; add the Hub config's model_type."
        )
    if meta["family"] not in FAMILIES:
        raise ConfigError(
            f"{where}: {_META_KEY}.family {meta['family']!r} is not one of {FAMILIES}."
        )
    published = meta["published_params"]
    own_model = meta["family"] in _OWN_FAMILIES
    if own_model and (published is not None or meta["hub_id"] is not None):
        raise ConfigError(
            f"{where}: {meta['family']} is asrfit's own model; set {_META_KEY}.hub_id and "
            f"{_META_KEY}.published_params to null (it has no Hub checkpoint or published count)."
        )
    if not own_model and (
        isinstance(published, bool) or not isinstance(published, int) or published <= 0
    ):
        raise ConfigError(f"{where}: {_META_KEY}.published_params must be a positive integer.")
    if not own_model and not isinstance(meta["hub_id"], str):
        raise ConfigError(f"{where}: {_META_KEY}.hub_id must be the model's Hub id (a string).")
    return BundledModel(
        name=meta["name"],
        hub_id=meta["hub_id"],
        aliases=tuple(meta.get("aliases", ())),
        model_class=meta["model_class"],
        family=meta["family"],
        published_params=published,
        published_params_source=meta["published_params_source"],
        published_params_tolerance=float(
            meta.get("published_params_tolerance", DEFAULT_PUBLISHED_PARAMS_TOLERANCE)
        ),
        vocab_size_is_placeholder=bool(meta.get("vocab_size_is_placeholder", False)),
        notes=meta.get("notes", ""),
        source_file=where,
        _config=data,
    )


@functools.lru_cache(maxsize=1)
def _load_all() -> tuple[dict[str, BundledModel], dict[str, str]]:
    folder = resources.files("asrfit.profiles") / "configs"
    entries: dict[str, BundledModel] = {}
    lookup: dict[str, str] = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        stem = item.name[: -len(".json")]
        entry = _parse_entry(
            stem, item.read_text(encoding="utf-8"), f"asrfit/profiles/configs/{item.name}"
        )
        entries[entry.name] = entry
        for alias in entry.names():
            key = alias.lower()
            if lookup.get(key, entry.name) != entry.name:
                raise ConfigError(
                    f"{entry.source_file}: name {alias!r} already belongs to bundled model "
                    f"{lookup[key]!r}; give each alias to one model only."
                )
            lookup[key] = entry.name
    return entries, lookup


def list_bundled_models() -> list[str]:
    """Return the short names of all bundled models, sorted.

    Returns:
        For example ``["hubert-large", "parakeet-ctc-0.6b", ...]``.
    """
    return sorted(_load_all()[0])


def find_bundled(name: str) -> BundledModel | None:
    """Look a model up by short name, Hub id or alias (case-insensitive).

    Args:
        name: ``"xls-r-1b"``, ``"facebook/wav2vec2-xls-r-1b"``, ...

    Returns:
        The bundled entry, or None when ``name`` is not bundled.
    """
    entries, lookup = _load_all()
    key = lookup.get(name.strip().lower())
    return entries[key] if key is not None else None


def get_bundled(name: str) -> BundledModel:
    """Like :func:`find_bundled`, but raise when the model is not bundled.

    Args:
        name: Short name, Hub id or alias.

    Returns:
        The bundled entry.

    Raises:
        UnknownModelError: When ``name`` is not bundled; the message lists the bundled names.
    """
    entry = find_bundled(name)
    if entry is None:
        raise UnknownModelError(
            f"{name!r} is not a bundled model. Bundled models: {', '.join(list_bundled_models())}."
        )
    return entry


# ---------------------------------------------------------------------- families and classes

FAMILIES = (
    "wav2vec2",
    "hubert",
    "wavlm",
    "whisper",
    "parakeet_ctc",
    "parakeet_tdt",
    "asrfit_conformer",
    "custom",
)
_OWN_FAMILIES = ("asrfit_conformer",)  # asrfit's models: no Hub checkpoint, no published count

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
_BUILTIN_MODULES: dict[str, str] = {"asrfit_conformer": "asrfit.asr.conformer"}
_BUILTIN_CLASSES: dict[str, str] = {"ConformerForCTC": "asrfit.asr.conformer"}


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

    data = {k: v for k, v in data.items() if k != _META_KEY}
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
    return UnknownModelError(
        f"{spec!r}: {reason} Bundled models (work offline): {', '.join(list_bundled_models())}. "
        "Otherwise pass a local folder that holds the model's config.json, or go online (unset "
        "HF_HUB_OFFLINE) so that its config.json can be fetched; weights are never downloaded."
    )


def _resolve_path(path: Path, spec: str) -> Resolved:
    from transformers import AutoConfig

    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _unknown(spec, f"the folder {path} has no config.json.")
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
        raise _unknown(spec, "no such folder or file.")
    offline = _hub_offline() if local_files_only is None else local_files_only
    try:
        config = AutoConfig.from_pretrained(spec, local_files_only=offline)
    except (OSError, ValueError, KeyError) as exc:
        where = "the Hugging Face Hub cache (offline)" if offline else "the Hugging Face Hub"
        raise _unknown(
            spec, f"not bundled, not a local path, and not loadable from {where} ({exc})."
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
