"""``quire segmentstore start`` and ``quire segmentstore recover``."""

from __future__ import annotations

from typing import Any

import click

from quire.cli.common import emit_json, json_option, metadata_option, tls_options, with_client
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


@segmentstore.command("recover")
@click.option("--tier2", "tier2_uri", required=True,
              help="Tier-2 URI to recover from (file:///path, s3://bucket/prefix?...).")
@tls_options
@metadata_option
@click.option("--container", "container_ids", type=int, multiple=True,
              help="Recover only this container (repeatable; default: all).")
@click.option("--container-count", type=int, default=None,
              help="Only if neither the metadata store nor tier-2 records it.")
@click.option("--ledger-password-file", type=click.Path(dir_okay=False), default=None,
              help="The cluster's tier-1 ledger password (the segment stores' "
                   "ledger_password_file; default: the built-in password).")
@click.option("--replace-logs", is_flag=True,
              help="Drop the containers' tier-1 logs if the metadata store still has them "
                   "(their ledgers are not read; stop the segment stores first).")
@json_option
def recover(tier2_uri: str, metadata_uri: str | None, container_ids: tuple[int, ...],
            container_count: int | None, ledger_password_file: str | None, replace_logs: bool,
            as_json: bool) -> None:
    """Rebuild every container from tier-2 alone onto fresh tier-1 logs.

    For a lost bookie cluster and/or a lost metadata store: --metadata names
    the (new) cluster, whose bookies must run and which must not hold the
    containers' tier-1 logs yet (or pass --replace-logs).  Every segment tier-2 records comes back
    with its recorded length, start offset, sealed state, attributes and
    table contents; chunks no record names are listed as orphans and left
    in place.  Ends with a summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from quire.client import Client
    from quire.security import read_secret
    from quire.segmentstore import SegmentStoreConfig
    from quire.segmentstore.disaster_recovery import RecoveryReport
    from quire.segmentstore.disaster_recovery import recover as run_recover
    from quire.segmentstore.store import tier1_passwords
    from quire.tier2 import Tier2Config

    tier2 = Tier2Config(uri=tier2_uri)  # a bad URI fails before anything connects
    config = SegmentStoreConfig(tier1_passwords=tier1_passwords(
        read_secret(ledger_password_file) if ledger_password_file else None))
    console = Console(stderr=True)
    bar = Progress("recovering segments", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, disable=as_json, transient=False)

    async def go(client: Client) -> RecoveryReport:
        task = bar.add_task("recover", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        with bar:
            return await run_recover(client, tier2,
                                     container_ids=container_ids or None,
                                     progress=progress, container_count=container_count,
                                     config=config, replace_logs=replace_logs)

    report = with_client(metadata_uri, go)
    if as_json:
        emit_json(report.as_json())
        return
    from rich.table import Table

    table = Table("container", "epoch", "segments", "tables", "bytes",
                  title="recovered from tier-2")
    for c in report.containers:
        table.add_row(str(c.container_id), str(c.epoch), f"{c.segments:,}", f"{c.tables:,}",
                      f"{c.bytes:,}")
    out = Console(soft_wrap=True)  # long names stay on one line
    out.print(table)
    for c in report.containers:
        for name in c.dangling:
            out.print(f"container {c.container_id}: {name} names no live data segment "
                      "(left as is)")
        for name in c.index_mismatches:
            out.print(f"container {c.container_id}: table {name}: its $index in tier-2 "
                      "disagrees with its data (the data wins)")
    for orphan in report.orphans:
        out.print(f"orphan chunk (no record names it, left in place): {orphan.name} "
                  f"({orphan.length:,} bytes)")
    if report.abandoned_ledgers:
        ids = " ".join(str(i) for i in report.abandoned_ledgers)
        out.print(f"the replaced tier-1 logs' ledgers are left as they were: {ids} (what was "
                  "acknowledged after their last flush is only there; `quire ledger delete "
                  "ID` once it is not needed)")
    rate = report.segments / report.elapsed_s if report.elapsed_s > 0 else 0.0
    out.print(f"recovered {len(report.containers)} container(s) of {report.container_count}, "
              f"{report.segments:,} segment(s), {report.bytes:,} bytes, "
              f"{len(report.orphans)} orphan chunk(s) in {report.elapsed_s:.1f} s "
              f"({rate:,.0f} segments/s)")
