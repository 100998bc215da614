"""``quire autorecovery start|audit|status``, ``quire ledger underreplicated``
and ``quire bookie decommission``: re-replicating what lost bookies held
(see :mod:`quire.node.autorecovery`)."""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import TYPE_CHECKING, Any

import click

from quire.cli.common import (
    client_config,
    emit_json,
    json_option,
    metadata_option,
    tls_options,
    with_store,
)
from quire.clock import SYSTEM_CLOCK

if TYPE_CHECKING:
    from quire.metadata import MetadataStore


async def _marks(store: MetadataStore) -> list[dict[str, Any]]:
    from quire.node.autorecovery import UnderReplication

    marks = UnderReplication(store)
    rows = []
    for ledger_id in await marks.marked():
        mark = await marks.read(ledger_id)
        if mark is None:
            continue
        rows.append({"ledger_id": ledger_id, "lost": sorted(mark.lost),
                     "leaving": sorted(mark.leaving), "marked_ms": mark.marked_ms,
                     "worker": await marks.holder(ledger_id)})
    return rows


def _print_marks(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    if not rows:
        click.echo("no under-replicated ledgers")
        return
    table = Table("ledger", "lost", "leaving", "marked", "worker")
    now_ms = SYSTEM_CLOCK.wall_ms()
    for row in rows:
        table.add_row(str(row["ledger_id"]), ", ".join(row["lost"]), ", ".join(row["leaving"]),
                      f"{(now_ms - row['marked_ms']) / 1000:.0f} s ago", row["worker"] or "")
    Console().print(table)


@click.group()
def autorecovery() -> None:
    """Re-replicate the ledgers of lost bookies (auditor and workers)."""


@autorecovery.command("start")
@tls_options
@metadata_option
@click.option("--worker-id", default=None, help="Name in elections and locks (default: host:pid).")
@click.option("--lost-bookie-delay-s", type=float, default=30.0, show_default=True,
              help="How long a bookie must be unregistered to count as lost.")
@click.option("--open-ledger-grace-ms", type=int, default=30_000, show_default=True,
              help="How long an open ledger's writer gets before it is closed and repaired.")
@click.option("--interval-ms", type=int, default=1000, show_default=True,
              help="The auditor's check and an idle worker's pause.")
def start(metadata_uri: str | None, worker_id: str | None, lost_bookie_delay_s: float,
          open_ledger_grace_ms: int, interval_ms: int) -> None:
    """Run an auditor candidate and a replication worker until Ctrl-C."""
    import json
    import os

    from quire.client import Client
    from quire.node.autorecovery import Autorecovery, AutorecoverySettings
    from quire.node.repair import ClientRecoverer
    from quire.peer import BookiePool

    name = worker_id or f"{socket.gethostname()}:{os.getpid()}"
    config = client_config()

    async def go(store: MetadataStore) -> None:
        client = await Client.over(store, config)
        pool = await BookiePool.open(store, config.peer_config())
        service = Autorecovery(store, pool, ClientRecoverer(client), name, AutorecoverySettings(
            lost_bookie_delay_s=lost_bookie_delay_s, open_ledger_grace_ms=open_ledger_grace_ms,
            check_interval_ms=interval_ms))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        service.start()
        click.echo(json.dumps({"event": "ready", "worker_id": name}), err=False)
        try:
            await stop.wait()
        finally:
            await service.stop()
            await pool.close()
            await client.close()

    with_store(metadata_uri, go, create=True)


@autorecovery.command("audit")
@metadata_option
@json_option
def audit(metadata_uri: str | None, as_json: bool) -> None:
    """Mark now the ledgers of every bookie that has a cookie and is not
    registered (the auditor does this after its delay)."""
    from quire.node.autorecovery import lost_bookies, mark_ledgers_of

    async def go(store: MetadataStore) -> tuple[list[str], int]:
        lost = sorted(await lost_bookies(store))
        return lost, await mark_ledgers_of(store, lost=lost)

    lost, marked = with_store(metadata_uri, go)
    if as_json:
        emit_json({"lost_bookies": lost, "ledgers_marked": marked})
    else:
        click.echo(f"lost bookies: {', '.join(lost) or 'none'}; {marked} ledgers marked "
                   f"under-replicated")


@autorecovery.command("status")
@metadata_option
@json_option
def status(metadata_uri: str | None, as_json: bool) -> None:
    """The auditor, the lost bookies and the under-replicated ledgers."""
    from quire.metadata import read_leader
    from quire.node.autorecovery import lost_bookies
    from quire.node.autorecovery.records import AUDITOR_GROUP

    async def go(store: MetadataStore) -> dict[str, Any]:
        return {"auditor": await read_leader(store, AUDITOR_GROUP),
                "lost_bookies": sorted(await lost_bookies(store)),
                "underreplicated": await _marks(store)}

    found = with_store(metadata_uri, go)
    if as_json:
        emit_json(found)
        return
    click.echo(f"auditor: {found['auditor'] or 'none (no autorecovery process running)'}")
    click.echo(f"lost bookies: {', '.join(found['lost_bookies']) or 'none'}")
    _print_marks(found["underreplicated"])


@click.command("underreplicated")
@metadata_option
@json_option
def underreplicated(metadata_uri: str | None, as_json: bool) -> None:
    """Ledgers marked under-replicated, with the bookies to replace."""

    rows = with_store(metadata_uri, _marks)
    if as_json:
        emit_json(rows)
    else:
        _print_marks(rows)


@click.command("decommission")
@click.argument("bookie_id")
@tls_options
@metadata_option
@json_option
def decommission(bookie_id: str, metadata_uri: str | None, as_json: bool) -> None:
    """Copy everything BOOKIE_ID holds to other bookies while it is still up,
    then delete its cookie and registration (stop it afterwards)."""
    from quire.client import Client
    from quire.node.autorecovery import AutorecoverySettings
    from quire.node.autorecovery.decommission import DecommissionProgress
    from quire.node.autorecovery.decommission import decommission as run
    from quire.node.repair import ClientRecoverer
    from quire.peer import BookiePool

    config = client_config()

    def show(progress: DecommissionProgress) -> None:
        if not as_json:
            click.echo(f"\r{progress.ledgers_left:>8} ledgers left  "
                       f"{progress.entries_copied:>10,} entries copied", nl=False, err=True)

    async def go(store: MetadataStore) -> tuple[int, bool]:
        client = await Client.over(store, config)
        pool = await BookiePool.open(store, config.peer_config())
        try:
            if bookie_id not in await store.list_cookies():
                raise click.UsageError(f"no bookie {bookie_id} (it has no cookie)")
            count = await run(store, pool, ClientRecoverer(client), bookie_id,
                              AutorecoverySettings(), show)
            running = bookie_id in {b.bookie_id for b in await store.list_bookies()}
            return count, running
        finally:
            await pool.close()
            await client.close()

    count, running = with_store(metadata_uri, go)
    if as_json:
        emit_json({"bookie_id": bookie_id, "ledgers_replicated": count,
                   "still_running": running})
        return
    click.echo("", err=True)
    click.echo(f"bookie {bookie_id} decommissioned: {count} ledgers re-replicated; its cookie "
               f"is deleted" + ("; it is still running: stop it now" if running else ""))
