"""Quick ledger-client throughput: N appends of 1 KiB, 256 outstanding.

Starts 3 bookie processes on a temporary SQLite metadata store, then writes
one ledger per shape (E=W=A=1, and E=3 W=3 A=2) through ``quire.Client``
(uvloop) and prints entries/s, MB/s and latency percentiles per shape.

    .venv/bin/python benchmarks/client_quick.py [--entries 20000] [--outstanding 256]
        [--entry-bytes 1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from quire.bench import WriteBenchParams, bench_write
from quire.client import Client
from quire.sandbox import BookieProcess, sqlite_uri, start_all, stop_all

SHAPES = ((1, 1, 1), (3, 3, 2))


async def run(uri: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    client = await Client.connect(uri)
    try:
        results = []
        for ensemble, write, ack in SHAPES:
            params = WriteBenchParams(
                ensemble_size=ensemble, write_quorum_size=write, ack_quorum_size=ack,
                entry_bytes=args.entry_bytes, outstanding=args.outstanding,
                count=args.entries)
            summary = await bench_write(client, params)
            results.append({"shape": f"E={ensemble} W={write} A={ack}", **summary})
        return results
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-client-bench-") as tmp:
        root = Path(tmp)
        uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, uri, f"bench-{i}", port=0) for i in range(3)]
        start_all(bookies)
        try:
            results = uvloop.run(run(uri, args))
        finally:
            stop_all(bookies)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.entries} appends of {args.entry_bytes} B, {args.outstanding} outstanding, "
          "3 bookie processes on this machine")
    for r in results:
        print(f"  {r['shape']:<14} {r['entries_per_s']:>9.0f} entries/s  "
              f"{r['mb_per_s']:>6.1f} MB/s  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
              f"({r['seconds']:.2f} s)")


if __name__ == "__main__":
    main()
