"""Configuration plumbing shared by every component.

Each component declares its settings as a *frozen* dataclass whose field names
carry their unit (``timeout_ms``, ``max_frame_bytes``).  :func:`load_config`
builds one from an optional TOML file (a table named like the component, or
top-level keys) and then applies overrides (typically CLI flags), checking
every value's type so that a typo fails at start-up with a clear
:class:`~quire.errors.ConfigError` instead of deep inside the server.

A field whose type is a config dataclass itself (``BookieConfig.storage``)
contributes its fields as flat keys (see :func:`settings_of`).

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Path``,
``tuple[str, ...]`` and ``tuple[Path, ...]`` (a TOML list, or a comma
separated string on the command line).

Every server's config derives from :class:`ServerAddressConfig`: the keys
``host``, ``listen_host`` and ``advertised_host``, where it listens and
what it tells the others.
"""

from __future__ import annotations

import dataclasses
import ipaddress
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


@dataclasses.dataclass(frozen=True)
class Setting:
    """One flat key of a config dataclass (a TOML key, a CLI flag)."""

    name: str
    hint: Any
    """Its resolved type."""
    default: Any
    """Its default value (``dataclasses.MISSING`` if it has none)."""
    path: tuple[str, ...]
    """The fields leading from the top dataclass to the nested one holding
    it: ``()`` for a top-level field, ``("storage",)`` for a field of
    ``BookieConfig.storage``."""


def _is_config_class(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def settings_of(cls: type[Any]) -> dict[str, Setting]:
    """Every flat key of a config dataclass.  A field whose type is itself a
    config dataclass (``BookieConfig.storage``) is not a key: its own fields
    are, at the same flat level, so each knob is declared once, in the
    dataclass that uses it, and still set as ``write_cache_max_bytes = ...``.
    Two fields with one flat name are a programming error (TypeError)."""
    out: dict[str, Setting] = {}

    def walk(owner: type[Any], default_owner: Any, path: tuple[str, ...]) -> None:
        hints = typing.get_type_hints(owner)
        for field in dataclasses.fields(owner):
            hint = hints[field.name]
            default = (getattr(default_owner, field.name)
                       if default_owner is not dataclasses.MISSING else _default_of(field))
            if _is_config_class(hint):
                walk(hint, default, (*path, field.name))
                continue
            if field.name in out:
                raise TypeError(f"{cls.__name__}: setting {field.name!r} is declared twice")
            out[field.name] = Setting(field.name, hint, default, path)

    walk(cls, dataclasses.MISSING, ())
    return out


def _build(cls: type[T], values: Mapping[tuple[str, ...], dict[str, Any]],
           path: tuple[str, ...] = (), base: Any = dataclasses.MISSING) -> T:
    """``cls`` from the values given for it (``values[path]``) and for its
    nested config dataclasses; a nested one given no value keeps its
    default, one given some is its default with those replaced."""
    own = dict(values.get(path, {}))
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        hint = hints[field.name]
        sub = (*path, field.name)
        if not _is_config_class(hint) or not any(p[:len(sub)] == sub for p in values):
            continue
        nested_base = (getattr(base, field.name) if base is not dataclasses.MISSING
                       else _default_of(field))
        own[field.name] = _build(hint, values, sub, nested_base)
    if base is not dataclasses.MISSING:
        built: T = dataclasses.replace(base, **own)
        return built
    return cls(**own)


def load_config(
    cls: type[T],
    path: Path | str | None = None,
    overrides: Mapping[str, Any] | None = None,
    section: str | None = None,
) -> T:
    """Build ``cls`` from defaults, then the TOML file, then ``overrides``.

    Keys are flat (see :func:`settings_of`): a field of a nested config
    dataclass is set by its own name.  ``overrides`` entries whose value is
    ``None`` are ignored (an unset CLI flag).  Unknown keys in the file or
    the overrides are an error.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    settings = settings_of(cls)
    values: dict[tuple[str, ...], dict[str, Any]] = {}

    def put(key: str, value: Any, where: str) -> None:
        setting = settings.get(key)
        if setting is None:
            raise ConfigError(f"{where}unknown setting {key!r}")
        values.setdefault(setting.path, {})[key] = _convert(key, setting.hint, value)

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
            put(key, value, f"{path}: ")
    for key, value in (overrides or {}).items():
        if value is not None:
            put(key, value, "")
    try:
        return _build(cls, values)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from e


def is_wildcard_host(host: str) -> bool:
    """Whether ``host`` stands for every interface rather than one address
    (``0.0.0.0``, ``::``, ``[::]``, ``*``, or nothing)."""
    bare = host.strip().removeprefix("[").removesuffix("]")
    if bare in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(bare).is_unspecified
    except ValueError:
        return False  # a name


@dataclasses.dataclass(frozen=True)
class ServerAddressConfig:
    """Where a server listens and what it tells the others: the base of every
    server's config (the bookie's, the segment store's, the controller's),
    so the three keys are the same everywhere (BookKeeper's
    ``listeningInterface`` and ``advertisedAddress``, Pravega's listening
    and published addresses).

    The server binds :attr:`resolved_listen_host` (its wire or gRPC port
    and its HTTP port alike); everything that tells another process where
    to reach it carries :attr:`resolved_advertised_host`: a bookie's
    registration (and its default bookie id), a segment store's host record
    (so the controller's ``getURI``), the HTTP ``metrics`` addresses
    registered, a controller's member record, the ready line.  Under TLS
    the server's certificate must cover the advertised name."""

    host: str = "127.0.0.1"
    """Both the listen and the advertised host, for whichever of
    ``listen_host`` and ``advertised_host`` is not set."""
    listen_host: str = ""
    """The address the server's sockets bind ("" : ``host``); may be a
    wildcard (``0.0.0.0``, ``::``: every interface)."""
    advertised_host: str = ""
    """The name or address the others reach the server at ("" : ``host``);
    never a wildcard (a ConfigError)."""

    def __post_init__(self) -> None:
        advertised = self.resolved_advertised_host
        if not is_wildcard_host(advertised):
            return
        if self.advertised_host:
            raise ConfigError(f"advertised_host {advertised!r} is a wildcard address: "
                              "advertise the name or address others reach this server at")
        raise ConfigError(f"host {advertised!r} is a wildcard address, which cannot be "
                          f"advertised: set listen_host = {advertised!r} to listen on every "
                          "interface, and advertised_host (or host) to the name or address "
                          "others reach this server at")

    @property
    def resolved_listen_host(self) -> str:
        """What the server binds: ``listen_host``, else ``host``."""
        return self.listen_host or self.host

    @property
    def resolved_advertised_host(self) -> str:
        """What the server tells the others: ``advertised_host``, else ``host``."""
        return self.advertised_host or self.host

    def advertised_address(self, port: int) -> str:
        """``host:port`` as the others reach the server's ``port``."""
        return f"{self.resolved_advertised_host}:{port}"
