"""JSON round-trip for dataclasses, validated on load.

Every profile and plan is a dataclass that inherits :class:`JsonDataclass`: ``to_dict``
returns a fresh nested dict (never mutating the object), ``from_dict`` rebuilds it and
names any unknown or missing key, ``save``/``load`` go through an atomic file write.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from asrfit.errors import ConfigError
from asrfit.utils.io import Pathlike, atomic_write_text

T = TypeVar("T", bound="JsonDataclass")


def _to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if hasattr(value, "value") and hasattr(type(value), "__members__"):  # Enum
        return value.value
    return value


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            return True, args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
    return False, tp


def _from_jsonable(tp: Any, value: Any, where: str) -> Any:
    optional, inner = _is_optional(tp)
    if value is None:
        if optional or inner is Any:
            return None
        if inner is float:
            return math.nan
        raise ConfigError(f"{where}: null is not allowed here; give a value of type {inner}.")
    tp = inner
    origin = get_origin(tp)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object for {tp.__name__}, got {value!r}.")
        return _dataclass_from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}.")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return tuple(
                _from_jsonable(a, v, f"{where}[{i}]")
                for i, (a, v) in enumerate(zip(args, value, strict=False))
            )
        item = args[0] if args else Any
        out = [_from_jsonable(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object, got {value!r}.")
        _, val_tp = get_args(tp) or (str, Any)
        return {k: _from_jsonable(val_tp, v, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str) and value in ("inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}.")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}.")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}.")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}.")
        return value
    if isinstance(tp, type) and hasattr(tp, "__members__"):  # Enum
        try:
            return tp(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(f"{where}: {value!r} is not one of {choices}.") from None
    return value


def _dataclass_from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)} for {cls.__name__}; "
            f"known keys are {', '.join(sorted(fields))}."
        )
    hints = get_type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing required key {name!r} for {cls.__name__}.")
            continue
        kwargs[name] = _from_jsonable(hints.get(name, Any), data[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{where}: invalid {cls.__name__}: {exc}") from exc


class JsonDataclass:
    """Mixin for dataclasses that round-trip through JSON and are validated on load."""

    def to_dict(self) -> dict[str, Any]:
        """Return a new JSON-ready dict; the object itself is not changed."""
        return _to_jsonable(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any], where: str | None = None) -> T:
        """Build from a dict, naming any unknown or missing key and any ill-typed value.

        Raises:
            ConfigError: On an unknown key, a missing required key or a wrong type.
        """
        if not isinstance(data, dict):
            raise ConfigError(
                f"{where or cls.__name__}: expected a JSON object, got {type(data).__name__}."
            )
        return _dataclass_from_dict(cls, data, where or cls.__name__)

    def to_json(self, indent: int = 2) -> str:
        """Serialise to a JSON string."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False)

    @classmethod
    def from_json(cls: type[T], text: str, where: str | None = None) -> T:
        """Parse a JSON string made by :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where or cls.__name__}: not valid JSON ({exc}).") from exc
        return cls.from_dict(data, where=where)

    def save(self, path: Pathlike) -> Path:
        """Write as JSON to ``path`` atomically and return the path."""
        return atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def load(cls: type[T], path: Pathlike) -> T:
        """Load and validate a JSON file written by :meth:`save`.

        Raises:
            ConfigError: When the file is missing, not JSON, or does not match the dataclass.
        """
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such file; write one with `.save()` or check the path.")
        return cls.from_json(p.read_text(encoding="utf-8"), where=str(p))


__all__ = ["JsonDataclass"]
