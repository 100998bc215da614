"""Disaster recovery time from tier-2 alone (not a test).

A segment store of ``--containers`` containers (tier-1 on the in-memory
twin: it is thrown away anyway) creates ``--segments`` segments, appends
``--bytes`` to each, gives every ``--attributes-every``-th one attributes
and makes every ``--tables-every``-th one a table of 10 entries, and
flushes all of it to ``file://`` tier-2.  Then 3 bookie processes start on
a fresh SQLite metadata store and, in the same run: the baseline, reading
every container's records from tier-2 (journal, storage-metadata table:
what recovery has to read at least), then
:func:`~quire.segmentstore.disaster_recovery.recover` (records, attribute
batches, fresh tier-1 logs seeded, each container opened and compared).
Prints the seconds and segments/s of both, and their ratio; the issue's
goal is a recovery of 10,000 segments in under 60 s.

    .venv/bin/python benchmarks/tier2_recover.py [--segments 10000] [--containers 4]
        [--bytes 1024] [--attributes-every 10] [--tables-every 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from quire.client import Client
from quire.metadata import open_store
from quire.sandbox import BookieProcess, sqlite_uri, start_all, stop_all
from quire.segmentstore import (
    AttributeUpdate,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_reader import read_records
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import open_chunk_storage


async def fill(uri: str, args: argparse.Namespace) -> float:
    """Write the segments and flush them to tier-2; the seconds it took."""
    started = time.perf_counter()
    logs = MemoryDataLogs()
    metadata = await open_store("memory://")
    config = SegmentStoreConfig(container_count=args.containers, storage_writer=(
        StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                            iteration_interval_ms=50)))
    store = await SegmentStore.open(None, range(args.containers), uri, config=config,
                                    metadata_store=metadata,
                                    open_log=lambda cid: logs.open(f"c{cid}"))
    try:
        block = bytes(range(256)) * (args.bytes // 256 + 1)
        futures: list[asyncio.Future[Any]] = []
        for i in range(args.segments):
            name = f"bench/recover/{i}"
            table = args.tables_every and i % args.tables_every == 0
            futures.append(store.create_segment(
                name, SegmentType.TABLE if table else SegmentType.STREAM))
            if table:
                futures.append(store.table_put(name, [(b"key%d" % k, block[:args.bytes // 10],
                                                       None) for k in range(10)]))
            else:
                updates = [AttributeUpdate(k, UpdateType.REPLACE, i) for k in range(4)] \
                    if args.attributes_every and i % args.attributes_every == 0 else []
                futures.append(store.append(name, block[:args.bytes], updates))
            if len(futures) >= 1000:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
        start = {cid: w.iterations for cid, w in store.writers.items()}
        while any(w.iterations < start[cid] + 3 or w.backlog_bytes()
                  for cid, w in store.writers.items()):
            failed = [w.failure for w in store.writers.values() if w.failure is not None]
            if failed:
                raise failed[0]
            await asyncio.sleep(0.05)  # a benchmark's wait for its setup
    finally:
        await store.close()
        await metadata.close()
    return time.perf_counter() - started


async def measure(uri: str, metadata_uri: str, args: argparse.Namespace
                  ) -> list[dict[str, Any]]:
    storage = await open_chunk_storage(uri)
    try:
        started = time.perf_counter()
        recorded = 0
        for cid in range(args.containers):
            recorded += len((await read_records(storage, cid)).layouts)
        read_s = time.perf_counter() - started
    finally:
        await storage.close()
    client = await Client.connect(metadata_uri)
    try:
        def progress(done: int, total: int) -> None:
            if not args.json:
                print(f"\r  recovering: {done:,}/{total:,} segments", end="", file=sys.stderr,
                      flush=True)
        started_cpu = time.process_time()
        report = await recover(client, uri, progress=progress)
        cpu_s = time.process_time() - started_cpu
        if not args.json:
            print(file=sys.stderr)
    finally:
        await client.close()
    return [
        {"what": "baseline: read every container's records from tier-2",
         "seconds": read_s, "records": recorded},
        {"what": f"recover {report.segments:,} segments of {len(report.containers)} "
                 "containers", "seconds": report.elapsed_s, "cpu_s": cpu_s,
         "segments": report.segments, "bytes": report.bytes,
         "segments_per_s": report.segments / report.elapsed_s,
         "x_baseline_time": report.elapsed_s / read_s if read_s > 0 else 0.0,
         "orphans": len(report.orphans)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=10_000)
    parser.add_argument("--containers", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=1024, help="appended to each segment")
    parser.add_argument("--attributes-every", type=int, default=10)
    parser.add_argument("--tables-every", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="quire-tier2-recover-"))
    uri = f"file://{root / 'tier2'}"
    try:
        fill_s = uvloop.run(fill(uri, args))
        if not args.json:
            print(f"filled tier-2 with {args.segments:,} segments in {fill_s:.1f} s",
                  file=sys.stderr)
        metadata_uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, metadata_uri, f"bench-{i}", port=0) for i in range(3)]
        start_all(bookies)
        try:
            results = uvloop.run(measure(uri, metadata_uri, args))
        finally:
            stop_all(bookies)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for row in results:
        figures = ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v:,}"
                            for k, v in row.items() if k != "what")
        print(f"{row['what']}: {figures}")


if __name__ == "__main__":
    main()
