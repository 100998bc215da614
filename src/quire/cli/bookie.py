"""``quire bookie start|list``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from quire.bookie.config import BookieConfig
from quire.cli.common import (
    default_metadata_uri,
    emit_json,
    json_option,
    metadata_option,
    run_async,
)
from quire.cli.options import config_options, pick_overrides
from quire.config import load_config
from quire.errors import QuireError

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def bookie() -> None:
    """Run and inspect bookies."""


def bookie_config_options(func: F) -> F:
    """``--config`` and one flag per BookieConfig key, as ``quire bookie start``
    takes them (read them back with :func:`load_bookie_config`)."""
    func = config_options(BookieConfig)(func)
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        help="TOML file (top-level keys or a [bookie] table).")(func)


def load_bookie_config(config_path: str | None, kwargs: dict[str, Any]) -> BookieConfig:
    """The bookie's config from ``--config`` and the flags left in ``kwargs``."""
    overrides = pick_overrides(BookieConfig, kwargs)
    try:
        return load_config(BookieConfig, config_path, overrides, section="bookie")
    except QuireError as e:
        raise click.UsageError(str(e)) from e


@bookie.command("start")
@bookie_config_options
def start(config_path: str | None, **kwargs: Any) -> None:
    """Run one bookie in the foreground until SIGTERM/SIGINT."""
    from quire.node import run

    config = load_bookie_config(config_path, kwargs)
    try:
        run(config)
    except QuireError as e:
        click.echo(f"error: bookie refused to start: {e}", err=True)
        raise SystemExit(2) from e


@bookie.command("list")
@metadata_option
@json_option
def list_bookies(metadata_uri: str | None, as_json: bool) -> None:
    """Show the live bookies and whether they take writes."""
    from quire.metadata import open_store

    async def fetch() -> list[Any]:
        store = await open_store(metadata_uri or default_metadata_uri())
        try:
            return await store.list_bookies()
        finally:
            await store.close()

    bookies = run_async(fetch)
    if as_json:
        emit_json([{"bookie_id": b.bookie_id, "address": b.address, "state": b.state.value,
                    "metrics": b.metrics_address} for b in bookies])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("bookie id", "address", "state", "metrics")
    for b in bookies:
        table.add_row(b.bookie_id, b.address, b.state.value, b.metrics_address or "-")
    Console().print(table)
