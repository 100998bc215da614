"""Turn a config dataclass into click options, one flag per field.

``--journal-max-group-wait-ms 2`` overrides ``journal_max_group_wait_ms``
from the TOML file given with ``--config``; tuple fields take a comma
separated list.  Unset flags leave the file's (or the default) value.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from quire.config import field_types

F = TypeVar("F", bound=Callable[..., Any])


def config_options(cls: type[Any]) -> Callable[[F], F]:
    types = field_types(cls)

    def decorate(func: F) -> F:
        for field in reversed(dataclasses.fields(cls)):
            hint = types[field.name]
            flag = "--" + field.name.replace("_", "-")
            if hint is bool:
                option = click.option(f"{flag}/--no-{flag[2:]}", field.name, default=None,
                                      help=f"(default {field.default})")
            else:
                click_type: Any = {int: int, float: float, str: str, Path: str}.get(hint, str)
                shown = field.default
                if typing.get_origin(hint) is tuple:
                    shown = ",".join(map(str, field.default))
                option = click.option(flag, field.name, type=click_type, default=None,
                                      help=f"(default {shown})")
            func = option(func)
        return func

    return decorate


def pick_overrides(cls: type[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}
