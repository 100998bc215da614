"""Turn a config dataclass into click options, one flag per field.

``--journal-max-group-wait-ms 2`` overrides ``journal_max_group_wait_ms``
from the TOML file given with ``--config``; tuple fields take a comma
separated list.  Unset flags leave the file's (or the default) value.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from quire.config import settings_of

F = TypeVar("F", bound=Callable[..., Any])


def config_options(cls: type[Any]) -> Callable[[F], F]:
    """One flag per flat key of ``cls`` (nested config dataclasses' fields
    included, see :func:`quire.config.settings_of`)."""
    settings = settings_of(cls)

    def decorate(func: F) -> F:
        for setting in reversed(settings.values()):
            hint = setting.hint
            flag = "--" + setting.name.replace("_", "-")
            if hint is bool:
                option = click.option(f"{flag}/--no-{flag[2:]}", setting.name, default=None,
                                      help=f"(default {setting.default})")
            else:
                click_type: Any = {int: int, float: float, str: str, Path: str}.get(hint, str)
                shown = setting.default
                if typing.get_origin(hint) is tuple:
                    shown = ",".join(map(str, setting.default))
                option = click.option(flag, setting.name, type=click_type, default=None,
                                      help=f"(default {shown})")
            func = option(func)
        return func

    return decorate


def pick_overrides(cls: type[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = settings_of(cls)
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}
