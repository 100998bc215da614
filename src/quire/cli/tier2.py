"""``quire tier2 check``: PDP-40's consistency, read from tier-2 alone."""

from __future__ import annotations

import click

from quire.cli.common import emit_json, json_option, run_async


@click.group()
def tier2() -> None:
    """Inspect tier-2 storage (file://, s3://) without tier-1 or the metadata store."""


@tier2.command("check")
@click.argument("uri")
@click.option("--container", "container_ids", type=int, multiple=True,
              help="Check only this container (repeatable; default: every container "
                   "tier-2 holds a journal of).")
@json_option
def check(uri: str, container_ids: tuple[int, ...], as_json: bool) -> None:
    """Check tier-2 at URI against PDP-40's definition of consistency.

    Reads each container's system journal and storage metadata from tier-2
    alone and reports every recovered offset (a recorded length, an
    attribute batch's data length, an index's key version) that tier-2 does
    not hold.  Exits 1 if it finds any, 0 if tier-2 is consistent."""
    from quire.errors import Tier2Error
    from quire.segmentstore.tier2_check import Violation
    from quire.segmentstore.tier2_check import check as run_check
    from quire.segmentstore.tier2_reader import journal_containers
    from quire.tier2 import Tier2Config, open_chunk_storage
    from quire.tier2.config import FileLocation

    config = Tier2Config(uri=uri)
    location = config.location
    if isinstance(location, FileLocation) and not location.root.is_dir():
        raise Tier2Error(f"{uri}: no tier-2 directory at {location.root}")

    async def go() -> tuple[list[int], list[Violation]]:
        storage = await open_chunk_storage(config)
        try:
            ids = sorted(container_ids) if container_ids else await journal_containers(storage)
            return ids, await run_check(storage, container_ids=ids)
        finally:
            await storage.close()

    ids, violations = run_async(go)
    if as_json:
        emit_json({"consistent": not violations, "containers": ids,
                   "violations": [{"container": v.container_id, "segment": v.segment,
                                   "recorded_offset": v.recorded_offset,
                                   "guaranteed_length": v.guaranteed_length,
                                   "reason": v.reason} for v in violations]})
    elif not violations:
        click.echo(f"consistent: {len(ids)} container(s) checked "
                   f"({', '.join(map(str, ids)) or 'none recorded'})")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("container", "segment", "recorded offset", "guaranteed up to", "reason",
                      title=f"{len(violations)} violation(s) of PDP-40's consistency")
        for v in violations:
            table.add_row(str(v.container_id), v.segment, str(v.recorded_offset),
                          str(v.guaranteed_length), v.reason)
        Console(width=160).print(table)
    if violations:
        raise SystemExit(1)
