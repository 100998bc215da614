"""``quire bookie start|list|gc``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from quire.bookie.config import BookieConfig
from quire.cli.common import (
    emit_json,
    json_option,
    metadata_option,
    open_cli_store,
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
    async def fetch() -> list[Any]:
        store = await open_cli_store(metadata_uri)
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


@bookie.command("gc")
@click.option("--now", is_flag=True, help="Run GC and a major compaction now (required).")
@click.option("--bookie", "bookie_ids", multiple=True, metavar="BOOKIE_ID",
              help="Only this bookie (repeatable; default: every registered bookie).")
@click.option("--timeout-s", type=float, default=3600.0, show_default=True,
              help="How long to wait for each bookie's GC.")
@click.option("--tls-ca", "tls_ca", type=click.Path(dir_okay=False), default=None,
              help="Speak HTTPS to the bookies, trusting this CA (PEM).")
@click.option("--credentials", "credentials_path", type=click.Path(dir_okay=False),
              default=None, help="TOML file (mode 0600) with the username and password of a "
                                 "user with READ_UPDATE on prn::/ (bookies with auth_enabled).")
@metadata_option
@json_option
def gc(now: bool, bookie_ids: tuple[str, ...], timeout_s: float, tls_ca: str | None,
       credentials_path: str | None, metadata_uri: str | None, as_json: bool) -> None:
    """Ask running bookies to drop deleted ledgers, remove dead entry logs and
    compact partly live ones now (an admin request to each bookie's metrics
    endpoint, see quire.bookie.admin), and show what each did."""
    from quire.bookie.admin import request_gc
    from quire.security import basic_authorization, client_context, read_credentials

    if not now:
        raise click.UsageError("say --now: GC otherwise runs on the bookies' own timers")
    tls = client_context(tls_ca) if tls_ca else None
    authorization = None
    if credentials_path:
        credentials = read_credentials(credentials_path)
        authorization = basic_authorization(credentials.username, credentials.password)

    async def fetch() -> list[Any]:
        store = await open_cli_store(metadata_uri)
        try:
            return await store.list_bookies()
        finally:
            await store.close()

    def fail(message: str) -> None:
        if as_json:
            emit_json({"error": message})
        else:
            click.echo(f"error: {message}", err=True)
        raise SystemExit(1)

    registered = {b.bookie_id: b for b in run_async(fetch)}
    unknown = [bid for bid in bookie_ids if bid not in registered]
    if unknown:
        fail(f"no registered bookie {', '.join(unknown)}")
    chosen = [registered[bid] for bid in bookie_ids] if bookie_ids else list(
        registered.values())
    if not chosen:
        fail("no bookie is registered")
    reports: dict[str, Any] = {}
    failed = False
    for b in chosen:
        if not b.metrics_address:
            reports[b.bookie_id] = {"error": "no metrics endpoint (metrics_port = -1)"}
            failed = True
            continue
        try:
            reports[b.bookie_id] = request_gc(b.metrics_address, timeout_s=timeout_s, tls=tls,
                                              authorization=authorization)
        except QuireError as e:
            reports[b.bookie_id] = {"error": str(e)}
            failed = True
    if as_json:
        emit_json(reports)
    else:
        for bookie_id, report in reports.items():
            if "error" in report:
                click.echo(f"{bookie_id}: error: {report['error']}", err=True)
                continue
            stats = report["compaction_stats"]
            click.echo(f"{bookie_id}: {len(report['ledgers_dropped'])} ledgers dropped, "
                       f"{len(report['entry_logs_removed'])} dead entry logs removed, "
                       f"{stats['logs_compacted']} entry logs compacted "
                       f"({stats['entries_moved']} entries moved, "
                       f"{stats['bytes_reclaimed']} bytes reclaimed)")
    if failed:
        raise SystemExit(1)
