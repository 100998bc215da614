"""BP-46 phase two: how fast a bookie copies back what it lost.

A 3-bookie sandbox (journal off, ``data_integrity_checking = true``) takes
``--entries`` (default 200,000) entries of ``--entry-bytes`` (1 KiB) in
``--ledgers`` closed ledgers at E3 W3 A2.  Then one bookie loses its disks:
it is stopped, its directories are emptied and its cookie is deleted from
metadata (what an operator does for a replaced disk when stamping is off).
It starts again; phase two finds every entry of its ledgers missing and
copies them from the two others.  Printed: entries copied, seconds and
entries/s, from the bookie's ``quire_bookie_repair_*`` metrics, with the
write rate of the same run as the baseline it is compared to.

    .venv/bin/python benchmarks/repair_rate.py [--entries 200000] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import scrape, write_closed_ledgers
from quire.metadata import open_store
from quire.sandbox import Sandbox

COPIED = "quire_bookie_repair_entries_copied_total"
PASSES = "quire_bookie_repair_passes_total"
LIMBO = "quire_bookie_repair_limbo_ledgers"


async def forget_cookie(uri: str, bookie_id: str) -> None:
    store = await open_store(uri)
    try:
        await store.delete_cookie(bookie_id)
    finally:
        await store.close()


def measure(root: Path, entries: int, ledgers: int, entry_bytes: int,
            quiet: bool) -> dict[str, Any]:
    sandbox = Sandbox(root / "sandbox", 3, metrics_port=0, journal_write_data=False,
                      data_integrity_checking=True)
    sandbox.start()
    try:
        write_rate = uvloop.run(write_closed_ledgers(sandbox.metadata_uri, ledgers,
                                                     entries // ledgers, entry_bytes,
                                                     quiet=quiet))
        victim = sandbox.bookies[-1]
        victim.stop()
        for directory in victim.dirs:
            shutil.rmtree(directory, ignore_errors=True)
        uvloop.run(forget_cookie(sandbox.metadata_uri, victim.bookie_id))
        if not quiet:
            print(f"{victim.bookie_id} lost its disks; starting it again", file=sys.stderr)
        victim.start()
        started = time.monotonic()  # phase two runs from here, while the bookie serves
        assert victim.metrics_address
        expected = ledgers * (entries // ledgers)
        last_print = 0.0
        while True:
            m = scrape(victim.metrics_address, COPIED, PASSES, LIMBO)
            now = time.monotonic()
            if m[PASSES] >= 1:
                break
            if not quiet and now - last_print >= 1.0:
                print(f"  repair: {m[COPIED]:,.0f}/{expected:,} entries copied, "
                      f"{now - started:.1f} s", file=sys.stderr, flush=True)
                last_print = now
            time.sleep(0.05)
        seconds = time.monotonic() - started
    finally:
        sandbox.stop()
    return {"entries": expected, "entry_bytes": entry_bytes, "ledgers": ledgers,
            "entries_copied": m[COPIED], "repair_seconds": seconds,
            "repair_entries_per_s": m[COPIED] / seconds,
            "write_entries_per_s": write_rate,
            "repair_over_write": m[COPIED] / seconds / write_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--ledgers", type=int, default=4)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-bench-") as tmp:
        result = measure(Path(tmp), args.entries, args.ledgers, args.entry_bytes, args.json)
    if args.json:
        print(json.dumps(result))
        return
    print(f"wrote {result['entries']:,} entries of {result['entry_bytes']} B in "
          f"{result['ledgers']} ledgers at {result['write_entries_per_s']:,.0f} entries/s "
          f"(E3 W3 A2, journal off)")
    print(f"phase two copied {result['entries_copied']:,.0f} entries in "
          f"{result['repair_seconds']:.1f} s (from the bookie serving to the pass's end): "
          f"{result['repair_entries_per_s']:,.0f} entries/s, "
          f"{result['repair_over_write']:.2f}x the write rate")


if __name__ == "__main__":
    main()
