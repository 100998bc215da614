"""Configuration plumbing shared by every component.

Each component declares its settings as a *frozen* dataclass whose field names
carry their unit (``timeout_ms``, ``max_frame_bytes``).  :func:`load_config`
builds one from an optional TOML file (a table named like the component, or
top-level keys) and then applies overrides (typically CLI flags), checking
every value's type so that a typo fails at start-up with a clear
:class:`~quire.errors.ConfigError` instead of deep inside the server.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Path``,
``tuple[str, ...]`` and ``tuple[Path, ...]`` (a TOML list, or a comma
separated string on the command line).
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from quire.errors import ConfigError

T = TypeVar("T")


def _convert(name: str, hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(hint)
        if isinstance(value, str):
            value = [v for v in (p.strip() for p in value.split(",")) if v]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return tuple(_convert(name, item_type, v) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if hint is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{name}: expected a path, got {value!r}")
        return Path(value)
    raise ConfigError(f"{name}: unsupported setting type {hint!r}")


def field_types(cls: type[Any]) -> dict[str, Any]:
    """The resolved type of every field of a config dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def load_config(
    cls: type[T],
    path: Path | str | None = None,
    overrides: Mapping[str, Any] | None = None,
    section: str | None = None,
) -> T:
    """Build ``cls`` from defaults, then the TOML file, then ``overrides``.

    ``overrides`` entries whose value is ``None`` are ignored (an unset CLI
    flag).  Unknown keys in the file or the overrides are an error.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    types = field_types(cls)
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
        if section is not None and isinstance(data.get(section), dict):
            data = data[section]
        for key, value in data.items():
            if key not in types:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            values[key] = _convert(key, types[key], value)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in types:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = _convert(key, types[key], value)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e
