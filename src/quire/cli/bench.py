"""``quire bench write``: throughput and latency of appends."""

from __future__ import annotations

from typing import Any

import click

from quire.bench import WriteBenchParams, bench_write
from quire.cli.common import (
    default_metadata_uri,
    emit_json,
    json_option,
    metadata_option,
    run_async,
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
@metadata_option
@json_option
def write(metadata_uri: str | None, as_json: bool, ledger_type: str, **kwargs: Any) -> None:
    """Append fixed-size entries as fast as the outstanding limit allows."""
    from quire.client import Client

    params = WriteBenchParams(ledger_type=LedgerType(ledger_type), **kwargs)

    def show(snapshot: dict[str, Any]) -> None:
        if not as_json:
            click.echo(f"\r{snapshot['elapsed_s']:6.1f}s  {snapshot['entries']:>10,} entries  "
                       f"{snapshot['entries_per_s']:>10,.0f}/s", nl=False, err=True)

    async def go() -> dict[str, float]:
        client = await Client.connect(metadata_uri or default_metadata_uri())
        try:
            return await bench_write(client, params, show)
        finally:
            await client.close()

    result = run_async(go)
    if as_json:
        emit_json({"params": {**kwargs, "ledger_type": ledger_type}, "result": result})
        return
    click.echo("", err=True)
    click.echo(f"{result['entries']:,.0f} entries in {result['seconds']:.1f}s: "
               f"{result['entries_per_s']:,.0f} entries/s, {result['mb_per_s']:.1f} MB/s; "
               f"latency ms p50 {result['p50_ms']:.2f} p95 {result['p95_ms']:.2f} "
               f"p99 {result['p99_ms']:.2f} max {result['max_ms']:.2f}")
