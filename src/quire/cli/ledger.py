"""``quire ledger create|list|info|append|read|recover|delete``."""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.cli.common import (
    emit_json,
    json_option,
    ledger_password,
    ledger_password_options,
    metadata_option,
    open_cli_store,
    run_async,
    tls_options,
    with_client,
)
from quire.types import DigestType, LedgerType

if TYPE_CHECKING:
    from quire.client import Client

T = TypeVar("T")

password_option = ledger_password_options("the empty password")


@click.group()
def ledger() -> None:
    """Create, inspect, write, read, recover and delete ledgers."""


def _shape_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--ensemble-size", "-e", default=3, show_default=True),
        click.option("--write-quorum-size", "-w", default=3, show_default=True),
        click.option("--ack-quorum-size", "-a", default=2, show_default=True),
        click.option("--ledger-type", type=click.Choice([t.value for t in LedgerType]),
                     default=LedgerType.PD_JOURNAL.value, show_default=True),
        click.option("--digest-type", type=click.Choice([t.value for t in DigestType]),
                     default=DigestType.CRC32C.value, show_default=True),
    ]):
        func = option(func)
    return func


@ledger.command("create")
@_shape_options
@password_option
@click.option("--meta", "custom", multiple=True, metavar="KEY=VALUE",
              help="Custom metadata (repeatable).")
@tls_options
@metadata_option
@json_option
def create(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, ledger_type: str,
           digest_type: str, custom: tuple[str, ...], metadata_uri: str | None,
           as_json: bool) -> None:
    """Create an empty ledger and close the handle (it stays OPEN)."""
    password = ledger_password(b"")
    custom_metadata = {}
    for item in custom:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--meta")
        custom_metadata[key] = value.encode()

    async def go(client: Client) -> int:
        handle = await client.create_ledger(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size, ledger_type=LedgerType(ledger_type),
            digest_type=DigestType(digest_type), password=password,
            custom_metadata=custom_metadata)
        return int(handle.ledger_id)

    ledger_id = with_client(metadata_uri, go)
    if as_json:
        emit_json({"ledger_id": ledger_id})
    else:
        click.echo(f"created ledger {ledger_id}")


@ledger.command("list")
@metadata_option
@json_option
def list_ledgers(metadata_uri: str | None, as_json: bool) -> None:
    """List ledger ids with their state and size."""
    from quire.metadata import ledger_json
    async def go() -> list[dict[str, Any]]:
        store = await open_cli_store(metadata_uri)
        try:
            out = []
            for ledger_id in await store.list_ledgers():
                md = (await store.read_ledger(ledger_id)).value
                out.append(ledger_json(ledger_id, md))
            return out
        finally:
            await store.close()

    rows = run_async(go)
    if as_json:
        emit_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("ledger", "state", "E/W/A", "type", "last entry", "bytes")
    for r in rows:
        table.add_row(str(r["ledger_id"]), r["state"],
                      f"{r['ensemble_size']}/{r['write_quorum_size']}/{r['ack_quorum_size']}",
                      r["ledger_type"], str(r["last_entry_id"]), str(r["length"]))
    Console().print(table)


@ledger.command("info")
@click.argument("ledger_id", type=int)
@metadata_option
@json_option
def info(ledger_id: int, metadata_uri: str | None, as_json: bool) -> None:
    """Show a ledger's metadata (fragments included)."""
    from quire.metadata import ledger_json
    async def go() -> dict[str, Any]:
        store = await open_cli_store(metadata_uri)
        try:
            return ledger_json(ledger_id, (await store.read_ledger(ledger_id)).value)
        finally:
            await store.close()

    row = run_async(go)
    if as_json:
        emit_json(row)
        return
    for key, value in row.items():
        if key == "ensembles":
            for frag in value:
                click.echo(f"fragment from entry {frag['first_entry_id']}: "
                           f"{', '.join(frag['bookies'])}")
        else:
            click.echo(f"{key}: {value}")


@ledger.command("append")
@click.argument("payloads", nargs=-1)
@click.option("--stdin", "from_stdin", is_flag=True, help="Also one entry per line of stdin.")
@click.option("--keep-open", is_flag=True, help="Leave the ledger OPEN (no close).")
@_shape_options
@password_option
@tls_options
@metadata_option
@json_option
def append(payloads: tuple[str, ...], from_stdin: bool, keep_open: bool, ensemble_size: int,
           write_quorum_size: int, ack_quorum_size: int, ledger_type: str, digest_type: str,
           metadata_uri: str | None, as_json: bool) -> None:
    """Write PAYLOADS as the entries of a new ledger, then close it.

    A ledger has one writer, the process that created it, so the CLI writes
    a new ledger each time (BookKeeper's shell does the same); use
    ``quire ledger read`` to read it back.
    """
    password = ledger_password(b"")
    data = [p.encode() for p in payloads]
    if from_stdin:
        data.extend(line.rstrip(b"\n") for line in sys.stdin.buffer)

    async def go(client: Client) -> tuple[int, list[int]]:
        handle = await client.create_ledger(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum_size,
            ack_quorum_size=ack_quorum_size, ledger_type=LedgerType(ledger_type),
            digest_type=DigestType(digest_type), password=password)
        ids = [await f for f in [handle.append(d) for d in data]]
        if not keep_open:
            await handle.close()
        return int(handle.ledger_id), ids

    ledger_id, ids = with_client(metadata_uri, go)
    if as_json:
        emit_json({"ledger_id": ledger_id, "entry_ids": ids, "closed": not keep_open})
    else:
        click.echo(f"ledger {ledger_id}: appended {len(ids)} entries"
                   + ("" if keep_open else ", closed"))


@ledger.command("read")
@click.argument("ledger_id", type=int)
@click.option("--first", default=0, show_default=True)
@click.option("--last", default=None, type=int, help="Default: the LAC / last entry.")
@click.option("--hex", "as_hex", is_flag=True, help="Print payloads as hex.")
@click.option("--batch", default=0, help="Read with BP-62 batch reads of N entries.")
@password_option
@tls_options
@metadata_option
@json_option
def read(ledger_id: int, first: int, last: int | None, as_hex: bool, batch: int,
         metadata_uri: str | None, as_json: bool) -> None:
    """Print entries (text, or hex with --hex; base64 in --json)."""
    password = ledger_password(b"")

    async def go(client: Client) -> list[tuple[int, bytes]]:
        handle = await client.open_ledger(ledger_id, password=password, recovery=False)
        end = last
        if end is None:
            end = await handle.read_last_add_confirmed()
        if end < first:
            return []
        if batch <= 0:
            return [(e.entry_id, e.data) for e in await handle.read(first, end)]
        out: list[tuple[int, bytes]] = []
        position = first
        while position <= end:  # loose limits: ask again from where a batch ended
            got = await handle.batch_read(position, min(batch, end - position + 1), 0)
            out.extend((e.entry_id, e.data) for e in got)
            position = got[-1].entry_id + 1
        return out

    entries = with_client(metadata_uri, go)
    if as_json:
        emit_json([{"entry_id": i, "payload": base64.b64encode(d).decode()} for i, d in entries])
        return
    for entry_id, payload in entries:
        text = payload.hex() if as_hex else payload.decode("utf-8", "backslashreplace")
        click.echo(f"{entry_id}\t{text}")


@ledger.command("recover")
@click.argument("ledger_id", type=int)
@ledger_password_options("none: the ledger is recovered with the keys its metadata holds, "
                         "as an operator who reads the metadata store may; a password given "
                         "is checked")
@tls_options
@metadata_option
@json_option
def recover(ledger_id: int, metadata_uri: str | None, as_json: bool) -> None:
    """Fence and close a ledger at its last recoverable entry."""
    password = ledger_password(None)

    async def go(client: Client) -> int:
        if password is None:
            handle = await client.open_ledger_as_admin(ledger_id, recovery=True)
        else:
            handle = await client.open_ledger(ledger_id, password=password, recovery=True)
        return int(handle.last_add_confirmed)

    last = with_client(metadata_uri, go)
    if as_json:
        emit_json({"ledger_id": ledger_id, "last_entry_id": last})
    else:
        click.echo(f"ledger {ledger_id} recovered and closed at entry {last}")


@ledger.command("sync")
@click.argument("ledger_id", type=int)
@password_option
@tls_options
@metadata_option
@json_option
def sync(ledger_id: int, metadata_uri: str | None, as_json: bool) -> None:
    """Ask the ledger's bookies to fsync it (BP-14 SYNC); show LastAddSynced.

    The persisted LAC is what BP-14's rule gives over the answers: sorted
    ascending, the largest of the first W - A + 1 (a bookie that did not
    answer counts as -1).
    """
    password = ledger_password(b"")

    async def go(client: Client) -> tuple[dict[str, Any], int]:
        handle = await client.open_ledger(ledger_id, password=password, recovery=False)
        answers = await handle.sync_replicas()
        md = handle.metadata
        values = sorted(v if isinstance(v, int) else -1 for v in answers.values())
        persisted = values[md.write_quorum_size - md.ack_quorum_size]
        return {b: (v if isinstance(v, int) else str(v)) for b, v in answers.items()}, persisted

    answers, persisted = with_client(metadata_uri, go)
    if as_json:
        emit_json({"ledger_id": ledger_id, "last_add_synced": answers,
                   "persisted_lac": persisted})
        return
    for bookie, value in answers.items():
        click.echo(f"{bookie}\tlast_add_synced={value}")
    click.echo(f"persisted LAC (BP-14 rule): {persisted}")


@ledger.command("delete")
@click.argument("ledger_id", type=int)
@metadata_option
@json_option
def delete(ledger_id: int, metadata_uri: str | None, as_json: bool) -> None:
    """Delete a ledger (bookies reclaim its space by garbage collection)."""

    async def go(client: Client) -> None:
        await client.delete_ledger(ledger_id)

    with_client(metadata_uri, go)
    if as_json:
        emit_json({"ledger_id": ledger_id, "deleted": True})
    else:
        click.echo(f"deleted ledger {ledger_id}")
