"""Helpers shared by the CLI commands: the metadata URI default, output, asyncio."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from quire.errors import QuireError

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
