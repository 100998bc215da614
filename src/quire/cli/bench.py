"""``quire bench write``: throughput and latency of appends."""

from __future__ import annotations

from typing import Any

import click

from quire.bench import (
    BENCH_LEDGER_PASSWORD,
    ReadBenchParams,
    WriteBenchParams,
    bench_read,
    bench_write,
)
from quire.cli.common import (
    emit_json,
    json_option,
    ledger_password,
    ledger_password_options,
    metadata_option,
    progress_printer,
    tls_options,
    with_client,
)
from quire.types import LedgerType


@click.group()
def bench() -> None:
    """Benchmarks against a running cluster."""


@bench.command("write")
@click.option("--ensemble-size", "-e", default=3, show_default=True)
@click.option("--write-quorum-size", "-w", default=3, show_default=True)
@click.option("--ack-quorum-size", "-a", default=2, show_default=True)
@click.option("--entry-bytes", default=1024, show_default=True)
@click.option("--ledgers", default=1, show_default=True)
@click.option("--outstanding", default=256, show_default=True,
              help="Appends in flight across all ledgers.")
@click.option("--duration-s", default=10.0, show_default=True)
@click.option("--count", default=0, help="Stop after N entries instead of a duration.")
@click.option("--ledger-type", type=click.Choice([t.value for t in LedgerType]),
              default=LedgerType.PD_JOURNAL.value, show_default=True)
@tls_options
@metadata_option
@json_option
def write(metadata_uri: str | None, as_json: bool, ledger_type: str, **kwargs: Any) -> None:
    """Append fixed-size entries as fast as the outstanding limit allows."""
    params = WriteBenchParams(ledger_type=LedgerType(ledger_type), **kwargs)
    show = progress_printer(as_json)
    result = with_client(metadata_uri, lambda client: bench_write(client, params, show))
    if as_json:
        emit_json({"params": {**kwargs, "ledger_type": ledger_type}, "result": result})
        return
    click.echo("", err=True)
    click.echo(f"{result['entries']:,.0f} entries in {result['seconds']:.1f}s: "
               f"{result['entries_per_s']:,.0f} entries/s, {result['mb_per_s']:.1f} MB/s; "
               f"latency ms p50 {result['p50_ms']:.2f} p95 {result['p95_ms']:.2f} "
               f"p99 {result['p99_ms']:.2f} max {result['max_ms']:.2f}")


@bench.command("read")
@click.argument("ledger_id", type=int)
@ledger_password_options("the password of the ledgers 'quire bench write' makes")
@click.option("--first", "first_entry_id", default=0, show_default=True)
@click.option("--last", "last_entry_id", default=-1, help="Default: the LAC / last entry.")
@click.option("--batch", default=100, show_default=True,
              help="Entries per batch read (BP-62); 0 for single-entry reads.")
@click.option("--window", default=1, show_default=True,
              help="Requests outstanding (single reads: 1 = one at a time).")
@click.option("--max-batch-bytes", default=0, help="Batch size limit (0: frame limit).")
@click.option("--duration-s", default=0.0, help="Stop after this long (0: whole range).")
@tls_options
@metadata_option
@json_option
def read(ledger_id: int, metadata_uri: str | None, as_json: bool, **kwargs: Any) -> None:
    """Read a ledger range: entries/s, MB/s and per-request latency."""
    params = ReadBenchParams(ledger_id=ledger_id,
                             password=ledger_password(BENCH_LEDGER_PASSWORD), **kwargs)
    show = progress_printer(as_json)
    result = with_client(metadata_uri, lambda client: bench_read(client, params, show))
    if as_json:
        emit_json({"params": {"ledger_id": ledger_id, **kwargs}, "result": result})
        return
    click.echo("", err=True)
    click.echo(f"{result['entries']:,.0f} entries in {result['seconds']:.1f}s: "
               f"{result['entries_per_s']:,.0f} entries/s, {result['mb_per_s']:.1f} MB/s; "
               f"{result['requests']:,.0f} requests, latency ms p50 {result['p50_ms']:.2f} "
               f"p99 {result['p99_ms']:.2f} max {result['max_ms']:.2f}")
