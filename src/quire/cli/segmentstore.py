"""``quire segmentstore start``, ``status`` and ``recover``."""

from __future__ import annotations

from typing import Any

import click

from quire.cli.common import (
    emit_json,
    json_option,
    metadata_option,
    open_cli_store,
    run_async,
    tls_options,
    with_client,
)
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


@segmentstore.command("status")
@click.option("--timeout-s", type=float, default=10.0, show_default=True,
              help="How long to wait for each segment store's answer.")
@click.option("--tls-ca", "tls_ca", type=click.Path(dir_okay=False), default=None,
              help="Speak HTTPS to the segment stores, trusting this CA (PEM).")
@click.option("--credentials", "credentials_path", type=click.Path(dir_okay=False),
              default=None, help="TOML file (mode 0600) with the username and password of a "
                                 "user with READ on prn::/ (segment stores with auth_enabled).")
@metadata_option
@json_option
def status(timeout_s: float, tls_ca: str | None, credentials_path: str | None,
           metadata_uri: str | None, as_json: bool) -> None:
    """Show each container's owner and health, from the segment stores' /api/v1/health.

    One line per container: ``container N: <owner>: ok``, or ``degraded:
    tier-2 unavailable since <UTC> (<cause>)`` while its tier-2 flushing
    fails, with its throttled appends and quarantined segments if any.
    Exits 1 when a container is not ok (or cannot be told)."""
    from quire.hosts.segmentstore_status import cluster_status
    from quire.security import basic_authorization, client_context, read_credentials

    tls = client_context(tls_ca) if tls_ca else None
    authorization = None
    if credentials_path:
        credentials = read_credentials(credentials_path)
        authorization = basic_authorization(credentials.username, credentials.password)

    async def fetch() -> list[Any]:
        store = await open_cli_store(metadata_uri)
        try:
            return await cluster_status(store, timeout_s=timeout_s, tls=tls,
                                        authorization=authorization)
        finally:
            await store.close()

    containers = run_async(fetch)
    if as_json:
        emit_json({"containers": [c.as_json() for c in containers],
                   "ok": all(c.ok for c in containers)})
    else:
        if not containers:
            click.echo("no container: no segment store has run on this metadata store")
        for c in containers:
            for line in c.lines():
                click.echo(line)
    if not all(c.ok for c in containers):
        raise SystemExit(1)


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
@click.option("--delete-covered-ledgers", is_flag=True,
              help="Recover nothing: delete the tier-1 ledgers an earlier --replace-logs "
                   "abandoned whose every entry tier-2 holds; list the others.")
@click.option("--dry-run", is_flag=True,
              help="With --delete-covered-ledgers: only say which would be deleted.")
@json_option
def recover(tier2_uri: str, metadata_uri: str | None, container_ids: tuple[int, ...],
            container_count: int | None, ledger_password_file: str | None, replace_logs: bool,
            delete_covered_ledgers: bool, dry_run: bool, as_json: bool) -> None:
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
    if delete_covered_ledgers:
        _delete_covered(tier2, metadata_uri, config.tier1_passwords, dry_run, as_json)
        return
    if dry_run:
        raise click.UsageError("--dry-run goes with --delete-covered-ledgers")
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
                  "acknowledged after their last flush is only there; `quire segmentstore "
                  "recover --delete-covered-ledgers` deletes those tier-2 covers)")
    rate = report.segments / report.elapsed_s if report.elapsed_s > 0 else 0.0
    out.print(f"recovered {len(report.containers)} container(s) of {report.container_count}, "
              f"{report.segments:,} segment(s), {report.bytes:,} bytes, "
              f"{len(report.orphans)} orphan chunk(s) in {report.elapsed_s:.1f} s "
              f"({rate:,.0f} segments/s)")


def _delete_covered(tier2: Any, metadata_uri: str | None, passwords: Any, dry_run: bool,
                    as_json: bool) -> None:
    """``recover --delete-covered-ledgers``: see
    :mod:`quire.segmentstore.covered_ledgers`."""
    from quire.client import Client
    from quire.segmentstore.covered_ledgers import CoverageReport, delete_covered

    async def go(client: Client) -> CoverageReport:
        return await delete_covered(client, tier2, passwords=passwords, dry_run=dry_run)

    report = with_client(metadata_uri, go)
    if as_json:
        emit_json({**report.as_json(), "dry_run": dry_run})
        return
    verb = "would delete" if dry_run else "deleted"
    for ledger_id in report.deleted:
        click.echo(f"ledger {ledger_id}: {verb}: tier-2 holds every entry")
    for kept in report.kept:
        click.echo(f"ledger {kept.ledger_id} (container {kept.container_id}): kept: "
                   f"{kept.reason}")
    click.echo(f"{len(report.deleted)} abandoned ledger(s) {verb}, {len(report.kept)} kept")
