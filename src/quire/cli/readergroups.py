"""``quire readergroup list|describe|delete`` and ``quire txn list|abort``.

Reader groups are the Pravega client's (their state read, read-only, from
their ``<group>_kvtable`` table segments; the controller learns their
names when a client asks where those tables are) and those registered
with the controller (subscribers).  Transactions are listed from the
controller (its ``Admin`` service) and aborted through Pravega's interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from quire.cli.common import emit_json, json_option
from quire.cli.streams import controller_option, split_stream, stream_argument, with_controller

if TYPE_CHECKING:
    from quire.streams import ControllerClient, RemoteSegmentStore

group_argument = click.argument("name", metavar="SCOPE/GROUP")


@click.group("readergroup")
def readergroup() -> None:
    """List, describe and delete reader groups."""


async def _describe(controller: ControllerClient, segments: RemoteSegmentStore, scope: str,
                    name: str, registered: dict[str, Any] | None) -> dict[str, Any]:
    from quire.errors import SegmentNotFoundError
    from quire.streams.reader_groups import read_client_group

    row: dict[str, Any] = {"group": f"{scope}/{name}", "client": False, "readers": {},
                           "unassigned": {}, "streams": []}
    try:
        group = await read_client_group(segments, scope, name)
    except SegmentNotFoundError:
        group = None
    if group is not None:
        lengths: dict[str, int] = {}

        async def lag(segment: str, offset: int) -> dict[str, int]:
            if segment not in lengths:
                try:
                    lengths[segment] = (await segments.get_info(segment)).length
                except SegmentNotFoundError:
                    lengths[segment] = offset
            return {"offset": offset, "lag_bytes": max(0, lengths[segment] - offset)}

        row.update(client=True, streams=group.streams, future=group.future,
                   readers={reader: {s: await lag(s, o) for s, o in held.items()}
                            for reader, held in group.readers.items()},
                   unassigned={s: await lag(s, o) for s, o in group.unassigned.items()})
    if registered is not None and registered.get("id"):
        row.update(registered={k: registered.get(k) for k in ("id", "generation", "retention")},
                   streams=sorted({*row["streams"], *(f"{scope}/{s}" for s in
                                                      registered.get("streams", {}))}))
    return row


@readergroup.command("list")
@click.argument("scope_name", metavar="SCOPE")
@controller_option
@json_option
def readergroup_list(scope_name: str, controller_uri: str | None, as_json: bool) -> None:
    """The reader groups of SCOPE, with their streams and readers."""

    async def go(controller: ControllerClient, segments: RemoteSegmentStore
                 ) -> list[dict[str, Any]]:
        known = await controller.admin("listReaderGroups", {"scope": scope_name})
        rows = [await _describe(controller, segments, scope_name, g["name"], g) for g in known]
        return [r for r in rows if r["client"] or "registered" in r]

    rows = with_controller(controller_uri, go)
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['group']}: streams {', '.join(r['streams']) or '-'}; readers "
                   f"{', '.join(sorted(r['readers'])) or '-'}")


@readergroup.command("describe")
@group_argument
@controller_option
@json_option
def readergroup_describe(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Reader group SCOPE/GROUP: each reader's segments, the offset it has
    read and its lag (bytes written after it); the unassigned segments."""
    scope_name, group = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> dict[str, Any]:
        known = {g["name"]: g for g in
                 await controller.admin("listReaderGroups", {"scope": scope_name})}
        row = await _describe(controller, segments, scope_name, group, known.get(group))
        if not row["client"] and "registered" not in row:
            raise click.ClickException(f"no reader group {name}")
        return row

    row = with_controller(controller_uri, go)
    if as_json:
        emit_json(row)
        return
    click.echo(f"reader group {row['group']}: streams {', '.join(row['streams']) or '-'}")
    for reader, held in sorted(row["readers"].items()):
        click.echo(f"  reader {reader}")
        for segment, at in sorted(held.items()):
            click.echo(f"    {segment} at {at['offset']} (lag {at['lag_bytes']} bytes)")
    for segment, at in sorted(row["unassigned"].items()):
        click.echo(f"  unassigned {segment} at {at['offset']} (lag {at['lag_bytes']} bytes)")


@readergroup.command("delete")
@group_argument
@controller_option
@json_option
def readergroup_delete(name: str, controller_uri: str | None, as_json: bool) -> None:
    """Delete reader group SCOPE/GROUP: its state table, and its registration
    with the controller (its subscriptions) if it has one."""
    from quire.errors import ControllerNotFoundError, SegmentNotFoundError
    from quire.pravega_wire.reader_group_state import state_table
    from quire.streams.reader_groups import delete_reader_group

    scope_name, group = split_stream(name)

    async def go(controller: ControllerClient, segments: RemoteSegmentStore) -> bool:
        deleted = False
        try:
            await segments.delete(state_table(scope_name, group))
            deleted = True
        except SegmentNotFoundError:
            pass
        try:
            await delete_reader_group(controller, scope_name, group)
            deleted = True
        except ControllerNotFoundError:
            pass
        if not deleted:
            raise click.ClickException(f"no reader group {name}")
        return deleted

    with_controller(controller_uri, go)
    if as_json:
        emit_json({"group": name, "deleted": True})
    else:
        click.echo(f"reader group {name} deleted")


@click.group("txn")
def txn() -> None:
    """List and abort a stream's transactions."""


@txn.command("list")
@stream_argument
@controller_option
@json_option
def txn_list(name: str, controller_uri: str | None, as_json: bool) -> None:
    """The transactions of SCOPE/STREAM the controller knows (open ones, and
    those ended in the last ten minutes)."""
    scope_name, stream_name = split_stream(name)

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore
                 ) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await controller.admin(
            "listTransactions", {"scope": scope_name, "stream": stream_name})
        return found

    rows = with_controller(controller_uri, go)
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['id']} {r['state']} (epoch {r['epoch']})")


@txn.command("abort")
@stream_argument
@click.argument("txn_id", metavar="TXN_ID")
@controller_option
@json_option
def txn_abort(name: str, txn_id: str, controller_uri: str | None, as_json: bool) -> None:
    """Abort transaction TXN_ID (32 hex digits, as ``quire txn list`` shows it)."""
    scope_name, stream_name = split_stream(name)
    try:
        number = int(txn_id, 16)
    except ValueError:
        raise click.BadParameter(f"a transaction id is 32 hex digits, got {txn_id!r}") from None

    async def go(controller: ControllerClient, _segments: RemoteSegmentStore) -> None:
        await controller.abort_transaction(scope_name, stream_name, number)

    with_controller(controller_uri, go)
    if as_json:
        emit_json({"stream": name, "txn": f"{number:032x}", "aborted": True})
    else:
        click.echo(f"transaction {number:032x} of {name} aborted")
