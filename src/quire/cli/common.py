"""Helpers shared by the CLI commands: the metadata URI default, output, asyncio."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.errors import QuireError

if TYPE_CHECKING:
    from quire.client import Client

T = TypeVar("T")

DEFAULT_SANDBOX_DIR = Path("quire-sandbox")


def default_metadata_uri() -> str:
    """``$QUIRE_METADATA``, else the default sandbox's SQLite file."""
    env = os.environ.get("QUIRE_METADATA")
    if env:
        return env
    return f"sqlite:///{(DEFAULT_SANDBOX_DIR / 'metadata.db').resolve()}"


metadata_option = click.option(
    "--metadata", "metadata_uri", default=None,
    help="Metadata store URI (default: $QUIRE_METADATA, then ./quire-sandbox/metadata.db).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    import uvloop

    try:
        return uvloop.run(factory())
    except QuireError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, sort_keys=True))


def with_client(metadata_uri: str | None, action: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``action(client)`` on a client of ``metadata_uri`` (or the default)."""
    from quire.client import Client

    async def go() -> T:
        client = await Client.connect(metadata_uri or default_metadata_uri())
        try:
            return await action(client)
        finally:
            await client.close()

    return run_async(go)


def progress_printer(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """A live progress line on stderr for long operations (silent if ``quiet``)."""

    def show(snapshot: dict[str, Any]) -> None:
        if not quiet:
            click.echo(f"\r{snapshot['elapsed_s']:6.1f}s  {snapshot['entries']:>10,} entries  "
                       f"{snapshot['entries_per_s']:>10,.0f}/s", nl=False, err=True)

    return show
