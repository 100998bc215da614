"""``quire controller start``."""

from __future__ import annotations

from typing import Any

import click

from quire.cli.options import config_options, pick_overrides
from quire.config import load_config
from quire.errors import QuireError
from quire.hosts import ControllerHostConfig


@click.group()
def controller() -> None:
    """Run the controller (Pravega's gRPC controller interface)."""


@controller.command("start")
@config_options(ControllerHostConfig)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML file (top-level keys or a [controller] table).")
def start(config_path: str | None, **kwargs: Any) -> None:
    """Run the controller in the foreground until SIGTERM/SIGINT; prints one
    JSON line {"event": "ready", "uri": "tcp://host:port", ...} once it serves."""
    from quire.hosts import run_controller

    try:
        config = load_config(ControllerHostConfig, config_path,
                             pick_overrides(ControllerHostConfig, kwargs), section="controller")
    except QuireError as e:
        raise click.UsageError(str(e)) from e
    try:
        run_controller(config)
    except QuireError as e:
        click.echo(f"error: controller refused to start: {e}", err=True)
        raise SystemExit(2) from e
