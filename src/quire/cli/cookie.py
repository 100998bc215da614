"""``quire cookie list|get|delete|fix``: bookies' cookies (BP-46).

A cookie is a bookie's identity, kept in the metadata store and in each of
its directories (see :mod:`quire.bookie.cookie`).  ``fix`` is the by-hand
version of ``data_integrity_stamp_missing_cookies``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from quire.cli.bookie import bookie_config_options, load_bookie_config
from quire.cli.common import (
    emit_json,
    json_option,
    metadata_option,
    run_async,
    with_store,
)

if TYPE_CHECKING:
    from quire.bookie.cookie import CookieCheck
    from quire.metadata import MetadataStore


@click.group()
def cookie() -> None:
    """Inspect, delete and repair bookies' cookies."""


def _describe(bookie_id: str, data: bytes, version: int) -> dict[str, Any]:
    from quire.bookie.cookie import Cookie

    parsed = Cookie.from_bytes(data, f"the metadata store's cookie of {bookie_id}")
    return {"bookie_id": parsed.bookie_id, "instance_id": parsed.instance_id,
            "journal_dirs": list(parsed.journal_dirs), "ledger_dirs": list(parsed.ledger_dirs),
            "version": version}


@cookie.command("list")
@metadata_option
@json_option
def list_cookies(metadata_uri: str | None, as_json: bool) -> None:
    """Every bookie id with a cookie in the metadata store."""
    from quire.errors import MetadataNotFoundError

    async def go(store: MetadataStore) -> list[dict[str, Any]]:
        rows = []
        for bookie_id in await store.list_cookies():
            try:
                stored = await store.read_cookie(bookie_id)
            except MetadataNotFoundError:
                continue  # deleted meanwhile
            rows.append(_describe(bookie_id, stored.value, stored.version))
        return rows

    rows = with_store(metadata_uri, go)
    if as_json:
        emit_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("bookie id", "instance id", "version")
    for r in rows:
        table.add_row(r["bookie_id"], r["instance_id"], str(r["version"]))
    Console().print(table)


@cookie.command("get")
@click.argument("bookie_id")
@metadata_option
@json_option
def get(bookie_id: str, metadata_uri: str | None, as_json: bool) -> None:
    """Show a bookie's cookie (its fields and version)."""

    async def go(store: MetadataStore) -> dict[str, Any]:
        stored = await store.read_cookie(bookie_id)
        return _describe(bookie_id, stored.value, stored.version)

    row = with_store(metadata_uri, go)
    if as_json:
        emit_json(row)
        return
    for key in ("bookie_id", "instance_id", "journal_dirs", "ledger_dirs", "version"):
        value = row[key]
        click.echo(f"{key:13} {', '.join(value) if isinstance(value, list) else value}")


_DELETE_MEANING = (
    "Deleting the cookie of bookie {id} removes its identity from the metadata store. "
    "Do it only for a bookie taken out of service for good, so that a new bookie with "
    "empty directories can take the id: a bookie whose directories still hold the cookie "
    "refuses to start once the metadata store has none, and a bookie started with empty "
    "directories under the id is taken as new, its lost data going unnoticed.")


@cookie.command("delete")
@click.argument("bookie_id")
@click.option("--yes", is_flag=True, help="Delete without asking (see the command's help).")
@metadata_option
@json_option
def delete(bookie_id: str, yes: bool, metadata_uri: str | None, as_json: bool) -> None:
    """Delete a bookie's cookie from the metadata store (needs --yes).

    Only for a bookie taken out of service for good: a bookie whose
    directories still hold the cookie refuses to start without it, and one
    started with empty directories under the id is taken as a new bookie.
    """
    if not yes:
        raise click.UsageError(_DELETE_MEANING.format(id=bookie_id) + " Add --yes to delete.")
    from quire.errors import QuireError

    async def go(store: MetadataStore) -> None:
        if any(info.bookie_id == bookie_id for info in await store.list_bookies()):
            raise QuireError(f"bookie {bookie_id} is running: stop it before deleting "
                             f"its cookie")
        await store.delete_cookie(bookie_id)

    with_store(metadata_uri, go)
    if as_json:
        emit_json({"bookie_id": bookie_id, "deleted": True})
    else:
        click.echo(f"deleted the cookie of bookie {bookie_id}")


@cookie.command("fix")
@click.argument("fixed_id", metavar="BOOKIE_ID")
@bookie_config_options
@json_option
def fix(fixed_id: str, config_path: str | None, as_json: bool, **kwargs: Any) -> None:
    """Repair a stopped bookie whose directories lost their cookie.

    Takes the bookie's config as ``quire bookie start`` does (``--config``
    and flags; the metadata store is the config's).  If directories lack
    their cookie (emptied or replaced disks), fences and puts in limbo the
    bookie's open ledgers, then writes the cookie back into them, as
    ``data_integrity_stamp_missing_cookies = true`` makes the bookie do at
    start.  Refuses while the bookie runs.
    """
    from quire.node.cookie_fix import fix_missing_cookies

    config = load_bookie_config(config_path, kwargs)
    if config.resolved_bookie_id != fixed_id:
        raise click.UsageError(f"the config is of bookie {config.resolved_bookie_id}, "
                               f"not {fixed_id}")
    check: CookieCheck = run_async(lambda: fix_missing_cookies(config))
    stamped = [str(d) for d in check.missing_dirs]
    if as_json:
        emit_json({"bookie_id": fixed_id, "instance_id": check.cookie.instance_id,
                   "stamped_dirs": stamped, "first_boot": check.first_boot})
    elif stamped:
        click.echo(f"bookie {fixed_id}: its ledgers fenced and the open ones put in limbo "
                   f"(repaired from its peers once it runs); cookie "
                   f"{check.cookie.instance_id} written to {', '.join(stamped)}")
    elif check.first_boot:
        click.echo(f"bookie {fixed_id} had no cookie anywhere: wrote a new one "
                   f"({check.cookie.instance_id}) to its directories and the metadata store")
    else:
        click.echo(f"bookie {fixed_id}: every directory has its cookie; nothing to fix")
