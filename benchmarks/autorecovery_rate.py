"""Autorecovery: time from a bookie's loss to full re-replication.

A 4-bookie sandbox with autorecovery in every bookie takes ``--ledgers``
(default 50) closed ledgers of ``--entries`` (default 10,000) entries of
``--entry-bytes`` (1 KiB) at E3 W3 A2.  One bookie is then killed for good
(kill -9).  Printed: the time from the kill until no ledger is marked and
no ensemble names the lost bookie (``--lost-bookie-delay-s`` of it is the
auditor's wait, reported apart), the entries copied (from the bookies'
``quire_autorecovery_*`` metrics) and the copy rate in entries/s, against
the write rate of the same run.

    .venv/bin/python benchmarks/autorecovery_rate.py [--ledgers 50] [--entries 10000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import scrape, write_closed_ledgers
from quire.metadata import open_store
from quire.node.autorecovery import UnderReplication
from quire.sandbox import Sandbox

COPIED = "quire_autorecovery_entries_copied_total"


async def wait_replicated(uri: str, lost: str, metrics: list[str],
                          quiet: bool) -> tuple[float, float]:
    """Seconds until the first ledger is marked, and until nothing is marked
    and no ensemble names ``lost``."""
    store = await open_store(uri)
    marks = UnderReplication(store)
    started = time.monotonic()
    first_mark: float | None = None
    try:
        while True:
            marked = await marks.marked()
            if marked and first_mark is None:
                first_mark = time.monotonic() - started
            naming = 0
            for ledger_id in await store.list_ledgers():
                md = (await store.read_ledger(ledger_id)).value
                naming += any(lost in bookies for _f, bookies in md.ensembles)
            elapsed = time.monotonic() - started
            if not quiet:
                copied = sum(scrape(a, COPIED)[COPIED] for a in metrics)
                print(f"  {elapsed:6.1f} s: {len(marked)} ledgers marked, {naming} naming "
                      f"{lost}, {copied:,.0f} entries copied", file=sys.stderr, flush=True)
            if not marked and not naming:
                return (elapsed if first_mark is None else first_mark), elapsed
            await asyncio.sleep(0.2 if first_mark is None else 0.5)
    finally:
        await store.close()


def measure(root: Path, ledgers: int, entries: int, entry_bytes: int, delay_s: float,
            quiet: bool) -> dict[str, Any]:
    sandbox = Sandbox(root / "sandbox", 4, metrics_port=0, autorecovery_enabled=True,
                      lost_bookie_delay_s=delay_s, autorecovery_interval_ms=500)
    sandbox.start()
    try:
        write_rate = uvloop.run(write_closed_ledgers(sandbox.metadata_uri, ledgers, entries,
                                                     entry_bytes, quiet=quiet))
        victim = sandbox.bookies[-1]
        survivors = [b.metrics_address for b in sandbox.bookies[:-1] if b.metrics_address]
        victim.kill9()
        marked_s, seconds = uvloop.run(wait_replicated(sandbox.metadata_uri, victim.bookie_id,
                                                       survivors, quiet))
        copied = sum(scrape(a, COPIED)[COPIED] for a in survivors)
    finally:
        sandbox.stop()
    copy_s = max(seconds - marked_s, 1e-9)
    return {"ledgers": ledgers, "entries_per_ledger": entries, "entry_bytes": entry_bytes,
            "write_entries_per_s": write_rate, "lost_bookie_delay_s": delay_s,
            "loss_to_marked_s": marked_s, "loss_to_full_replication_s": seconds,
            "entries_copied": copied,
            "copy_entries_per_s": copied / copy_s,
            "copy_over_write": copied / copy_s / write_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=50)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--lost-bookie-delay-s", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        r = measure(Path(tmp), args.ledgers, args.entries, args.entry_bytes,
                    args.lost_bookie_delay_s, args.json)
    if args.json:
        print(json.dumps(r))
        return
    print(f"wrote {r['ledgers']} ledgers x {r['entries_per_ledger']:,} entries of "
          f"{r['entry_bytes']} B at {r['write_entries_per_s']:,.0f} entries/s (E3 W3 A2, "
          f"4 bookies)")
    print(f"one bookie killed: fully re-replicated after {r['loss_to_full_replication_s']:.1f} s "
          f"(marked after {r['loss_to_marked_s']:.1f} s: registration lease plus the "
          f"auditor's {r['lost_bookie_delay_s']:.0f} s delay); {r['entries_copied']:,.0f} "
          f"entries copied at {r['copy_entries_per_s']:,.0f} "
          f"entries/s ({r['copy_over_write']:.2f}x the write rate)")


if __name__ == "__main__":
    main()
