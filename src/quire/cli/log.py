"""``quire log list|info|create|append|cat|tail|truncate|delete``: named logs.

Over :class:`quire.log.LogStore`.  Positions are ``SEQ:ENTRY`` (see
:class:`quire.log.Position`).  ``--json`` prints one JSON document, except
``tail -f``, which prints one JSON object per record as it comes.
"""

from __future__ import annotations

import base64
import collections
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from quire.cli.common import (
    emit_json,
    json_option,
    ledger_password,
    ledger_password_options,
    metadata_option,
    tls_options,
    until_interrupted,
    with_client,
)
from quire.types import LedgerType

if TYPE_CHECKING:  # imported where used: `quire` and every bookie start import this module
    from quire.client import Client
    from quire.log import LogInfo, LogRecord, LogStore, Position

T = TypeVar("T")

password_option = ledger_password_options("the empty password")
"""The password of a log's ledgers (``--password-file``, ``$QUIRE_LEDGER_PASSWORD``)."""


class PositionType(click.ParamType["Position"]):
    """A log position on the command line: ``SEQ:ENTRY``."""

    name = "SEQ:ENTRY"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Position:
        from quire.log import Position

        if isinstance(value, Position):
            return value
        try:
            return Position.parse(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


def with_logs(metadata_uri: str | None, password: bytes,
              action: Callable[[LogStore], Awaitable[T]]) -> T:
    """Run ``action(logs)`` on a :class:`LogStore` of a fresh client whose
    ledgers have ``password`` (:func:`ledger_password` for a command with
    :data:`password_option`)."""
    from quire.log import LogStore

    async def go(client: Client) -> T:
        return await action(LogStore(client, password=password))

    return with_client(metadata_uri, go)


def describe(info: LogInfo) -> dict[str, Any]:
    """A log's head and ledgers as JSON-ready values."""
    head = info.head
    return {
        "name": info.name,
        "epoch": head.epoch,
        "writer": None if head.writer is None else {
            "epoch": head.writer.epoch, "owner": head.writer.owner,
            "since_ms": head.writer.since_ms},
        "next_seq": head.next_seq,
        "truncated_before": str(head.truncated_before),
        "created_ms": head.created_ms,
        "entries": sum(r.entries or 0 for r in info.ledgers),
        "bytes": sum(r.bytes or 0 for r in info.ledgers),
        "ledgers": [{"seq": r.seq, "ledger_id": r.ledger_id, "state": r.state,
                     "entries": r.entries, "bytes": r.bytes} for r in info.ledgers],
    }


def record_json(record: LogRecord) -> dict[str, Any]:
    return {"position": str(record.position),
            "payload": base64.b64encode(record.payload).decode()}


def echo_record(record: LogRecord, as_hex: bool) -> None:
    text = record.payload.hex() if as_hex else record.payload.decode("utf-8", "backslashreplace")
    click.echo(f"{record.position}\t{text}")


@click.group()
def log() -> None:
    """Create, write, read, truncate and delete named logs."""


@log.command("list")
@metadata_option
@json_option
def list_logs(metadata_uri: str | None, as_json: bool) -> None:
    """Every log with its size (entries and bytes of its closed ledgers)."""

    async def go(logs: LogStore) -> list[dict[str, Any]]:
        return [describe(await logs.info(name)) for name in await logs.list()]

    rows = with_logs(metadata_uri, b"", go)
    if as_json:
        emit_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("log", "ledgers", "entries", "bytes", "writer", "truncated before")
    for r in rows:
        table.add_row(r["name"], str(len(r["ledgers"])), str(r["entries"]), str(r["bytes"]),
                      "held" if r["writer"] else "-", r["truncated_before"])
    Console().print(table)


@log.command("info")
@click.argument("name")
@metadata_option
@json_option
def info(name: str, metadata_uri: str | None, as_json: bool) -> None:
    """Show a log's head (epoch, writer, truncation) and ledgers."""

    async def go(logs: LogStore) -> dict[str, Any]:
        return describe(await logs.info(name))

    row = with_logs(metadata_uri, b"", go)
    if as_json:
        emit_json(row)
        return
    for key, value in row.items():
        if key == "ledgers":
            for r in value:
                click.echo(f"ledger seq {r['seq']}: id {r['ledger_id']} {r['state']} "
                           f"entries={r['entries']} bytes={r['bytes']}")
        else:
            click.echo(f"{key}: {value}")


@log.command("create")
@click.argument("name")
@click.option("--exist-ok", is_flag=True, help="No error if the log exists.")
@metadata_option
@json_option
def create(name: str, exist_ok: bool, metadata_uri: str | None, as_json: bool) -> None:
    """Create an empty log."""

    async def go(logs: LogStore) -> bool:
        return await logs.create(name, exist_ok=exist_ok)

    created = with_logs(metadata_uri, b"", go)
    if as_json:
        emit_json({"name": name, "created": created})
    else:
        click.echo(f"created log {name}" if created else f"log {name} exists")


@log.command("append")
@click.argument("name")
@click.argument("records", nargs=-1)
@click.option("--ensemble-size", "-e", default=3, show_default=True)
@click.option("--write-quorum-size", "-w", default=3, show_default=True)
@click.option("--ack-quorum-size", "-a", default=2, show_default=True)
@click.option("--ledger-type", type=click.Choice([t.value for t in LedgerType]),
              default=LedgerType.PD_JOURNAL.value, show_default=True)
@click.option("--no-create", is_flag=True, help="Fail if the log does not exist.")
@password_option
@tls_options
@metadata_option
@json_option
def append(name: str, records: tuple[str, ...], ensemble_size: int, write_quorum_size: int,
           ack_quorum_size: int, ledger_type: str, no_create: bool,
           metadata_uri: str | None, as_json: bool) -> None:
    """Append RECORDS (or, with none given, one record per line of stdin).

    The command becomes the log's writer for the time it runs: a writer
    another process holds is fenced out (as ``LogStore.open_writer`` does).
    """
    if not records and sys.stdin.isatty():
        raise click.UsageError("give RECORDS, or pipe them in one a line")
    data = ([r.encode() for r in records] if records
            else [line.rstrip(b"\n") for line in sys.stdin.buffer])

    async def go(logs: LogStore) -> list[Position]:
        writer = await logs.open_writer(
            name, create=not no_create, ensemble_size=ensemble_size,
            write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size,
            ledger_type=LedgerType(ledger_type))
        try:
            return [await f for f in [writer.append(d) for d in data]]
        finally:
            await writer.close()

    positions = with_logs(metadata_uri, ledger_password(b""), go)
    if as_json:
        emit_json({"name": name, "positions": [str(p) for p in positions]})
    else:
        click.echo(f"log {name}: appended {len(positions)} records"
                   + (f", {positions[0]} to {positions[-1]}" if positions else ""))


@log.command("cat")
@click.argument("name")
@click.option("--from", "start", type=PositionType(), default=None,
              help="First position (default: the log's first entry).")
@click.option("--hex", "as_hex", is_flag=True, help="Print payloads as hex.")
@password_option
@tls_options
@metadata_option
@json_option
def cat(name: str, start: Position | None, as_hex: bool,
        metadata_uri: str | None, as_json: bool) -> None:
    """Print every record from a position to the end (text, hex, or base64 in --json)."""

    async def go(logs: LogStore) -> list[LogRecord]:
        reader = await logs.open_reader(name, start, follow=False)
        try:
            return [record async for record in reader]
        finally:
            await reader.close()

    got = with_logs(metadata_uri, ledger_password(b""), go)
    if as_json:
        emit_json([record_json(r) for r in got])
        return
    for record in got:
        echo_record(record, as_hex)


async def last_records(logs: LogStore, name: str, count: int) -> tuple[list[LogRecord],
                                                                        Position]:
    """The last ``count`` records of the log and the position after them.

    Closed ledgers' entry counts say where to start; an open ledger (a
    writer is at work) is read from its start."""
    from quire.log import Position

    log_info = await logs.info(name)
    start = log_info.start
    need = count
    for ledger in reversed(log_info.ledgers):
        start = Position(ledger.seq, 0)
        if ledger.entries is None:
            continue
        if ledger.entries >= need:
            start = Position(ledger.seq, ledger.entries - need)
            break
        need -= ledger.entries
    kept: collections.deque[LogRecord] = collections.deque(maxlen=count)
    reader = await logs.open_reader(name, max(start, log_info.truncated_before), follow=False)
    try:
        async for record in reader:
            kept.append(record)
        return list(kept), reader.position
    finally:
        await reader.close()


@log.command("tail")
@click.argument("name")
@click.option("--lines", "-n", "count", default=10, show_default=True,
              type=click.IntRange(min=0), help="How many of the last records to print.")
@click.option("--follow", "-f", is_flag=True, help="Then print new records until Ctrl-C.")
@click.option("--hex", "as_hex", is_flag=True, help="Print payloads as hex.")
@password_option
@tls_options
@metadata_option
@json_option
def tail(name: str, count: int, follow: bool, as_hex: bool,
         metadata_uri: str | None, as_json: bool) -> None:
    """Print the last records; with -f, follow the log (one JSON object a line
    with --json)."""

    def show(record: LogRecord) -> None:
        if as_json:
            emit_json(record_json(record))
        else:
            echo_record(record, as_hex)

    async def go(logs: LogStore) -> None:
        last, after = await last_records(logs, name, count)
        if not follow:
            if as_json:
                emit_json([record_json(r) for r in last])
            else:
                for record in last:
                    show(record)
            return
        for record in last:
            show(record)
        sys.stdout.flush()
        reader = await logs.open_reader(name, after, follow=True, skip_truncated=True)

        async def print_new() -> None:
            try:
                async for record in reader:
                    show(record)
                    sys.stdout.flush()
            finally:
                await reader.close()
        await until_interrupted(print_new())

    try:
        with_logs(metadata_uri, ledger_password(b""), go)
    except KeyboardInterrupt:
        return  # Ctrl-C is how tail -f ends


@log.command("truncate")
@click.argument("name")
@click.option("--before", required=True, type=PositionType(),
              help="Remove every ledger entirely below this position.")
@password_option
@tls_options
@metadata_option
@json_option
def truncate(name: str, before: Position, metadata_uri: str | None,
             as_json: bool) -> None:
    """Remove whole ledgers from the front of the log (a ledger that is
    partly below BEFORE stays)."""

    async def go(logs: LogStore) -> tuple[list[int], Position]:
        removed = await logs.truncate(name, before)
        return removed, (await logs.read_head(name)).value.truncated_before

    removed, truncated_before = with_logs(metadata_uri, ledger_password(b""), go)
    if as_json:
        emit_json({"name": name, "removed_ledgers": removed,
                   "truncated_before": str(truncated_before)})
    else:
        click.echo(f"log {name}: removed {len(removed)} ledgers; "
                   f"the log starts at {truncated_before}")


@log.command("delete")
@click.argument("name")
@password_option
@tls_options
@metadata_option
@json_option
def delete(name: str, metadata_uri: str | None, as_json: bool) -> None:
    """Delete a log and its ledgers (refused while a writer holds it)."""

    async def go(logs: LogStore) -> None:
        await logs.delete(name)

    with_logs(metadata_uri, ledger_password(b""), go)
    if as_json:
        emit_json({"name": name, "deleted": True})
    else:
        click.echo(f"deleted log {name}")
