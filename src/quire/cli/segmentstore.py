"""``quire segmentstore start``."""

from __future__ import annotations

from typing import Any

import click

from quire.cli.options import config_options, pick_overrides
from quire.config import load_config
from quire.errors import QuireError
from quire.hosts import SegmentStoreHostConfig


@click.group()
def segmentstore() -> None:
    """Run segment stores (Pravega's wire protocol over segment containers)."""


@segmentstore.command("start")
@config_options(SegmentStoreHostConfig)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML file (top-level keys or a [segmentstore] table).")
def start(config_path: str | None, **kwargs: Any) -> None:
    """Run one segment store in the foreground until SIGTERM/SIGINT.

    It registers in the metadata store, takes the containers the assignment
    gives it (fencing their previous owners) and serves Pravega's wire
    protocol; prints one JSON line {"event": "ready", ...} once it serves."""
    from quire.hosts import run_segment_store

    try:
        config = load_config(SegmentStoreHostConfig, config_path,
                             pick_overrides(SegmentStoreHostConfig, kwargs),
                             section="segmentstore")
    except QuireError as e:
        raise click.UsageError(str(e)) from e
    try:
        run_segment_store(config)
    except QuireError as e:
        click.echo(f"error: segment store refused to start: {e}", err=True)
        raise SystemExit(2) from e
