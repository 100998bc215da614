"""Micro-benchmark of the bookie storage engine (not a test).

The main thread plays the event loop: ``add_entry`` in batches, then
``journal.write_buffered()`` once per batch (one loop iteration).  One thread
plays group commit (``journal.sync()`` back to back, real fdatasync) and one
the checkpointer (every ``--checkpoint-interval-ms`` or when the write cache
is over its limit).  Prints appends/s and fsync/checkpoint figures.

    .venv/bin/python benchmarks/storage_engine.py --seconds 5 --entry-bytes 1024
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from quire.bookie.storage import BookieStorage, StorageConfig
from quire.errors import TooManyRequestsError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--ledgers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=64, help="adds per loop iteration")
    parser.add_argument("--checkpoint-interval-ms", type=float, default=1000.0)
    parser.add_argument("--dir", type=Path, default=None,
                        help="data directory (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="quire-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        config = StorageConfig(journal_dirs=(root,), ledger_dirs=(root,))
        storage = BookieStorage.open(config)
        key = bytes(20)
        payload = b"x" * args.entry_bytes

        # 1. The bare add path (no background threads).
        n = 50_000
        paused = 0.0
        started = time.perf_counter()
        for i in range(n):
            storage.add_entry(1_000_000, i, payload, key)
            if i % args.batch == 0:
                storage.journal.write_buffered()
                if storage.checkpoint_due:  # not part of the add path: not timed
                    pause = time.perf_counter()
                    storage.checkpoint()
                    paused += time.perf_counter() - pause
        bare = n / (time.perf_counter() - started - paused)
        storage.journal.sync()
        storage.checkpoint()

        # 2. With an fsync thread and a checkpoint thread.
        stop = threading.Event()
        fsync_latencies: list[float] = []
        fsync_records: list[int] = []
        checkpoints: list[float] = []

        def syncer() -> None:
            while not stop.is_set():
                before = storage.journal.counters().fsync_count
                storage.journal.sync()
                stats = storage.journal.last_sync_stats
                if stats is not None and storage.journal.counters().fsync_count > before:
                    fsync_latencies.append(stats.latency_s)
                    fsync_records.append(stats.records)
                else:
                    time.sleep(0.0002)

        def checkpointer() -> None:
            last = time.monotonic()
            while not stop.is_set():
                due = (time.monotonic() - last) * 1000 >= args.checkpoint_interval_ms
                if due or storage.checkpoint_due:
                    checkpoints.append(storage.checkpoint().duration_s)
                    last = time.monotonic()
                else:
                    time.sleep(0.005)

        threads = [threading.Thread(target=syncer), threading.Thread(target=checkpointer)]
        for t in threads:
            t.start()
        adds = rejected = 0
        next_entry = [0] * args.ledgers
        started = time.perf_counter()
        deadline = started + args.seconds
        while time.perf_counter() < deadline:
            for _ in range(args.batch):
                lid = adds % args.ledgers
                try:
                    storage.add_entry(lid, next_entry[lid], payload, key)
                except TooManyRequestsError:
                    rejected += 1  # a client would back off: so do we
                    time.sleep(0.001)
                    continue
                next_entry[lid] += 1
                adds += 1
            storage.journal.write_buffered()
        elapsed = time.perf_counter() - started
        durable = storage.journal.synced_seq
        stop.set()
        for t in threads:
            t.join()
        lag = storage.journal.append_seq - durable

        print(f"entry size            {args.entry_bytes} B, {args.ledgers} ledgers, "
              f"batch {args.batch}")
        print(f"bare add_entry        {bare:,.0f} appends/s "
              f"({1e6 / bare:.2f} us per add incl. write_buffered)")
        print(f"with fsync+checkpoint {adds / elapsed:,.0f} appends/s, "
              f"{adds * args.entry_bytes / elapsed / 2**20:,.1f} MiB/s "
              f"({rejected} rejected: write cache full)")
        if fsync_latencies:
            print(f"fsyncs                {len(fsync_latencies)} "
                  f"({len(fsync_latencies) / elapsed:,.0f}/s), "
                  f"median {statistics.median(fsync_latencies) * 1e3:.2f} ms, "
                  f"max {max(fsync_latencies) * 1e3:.2f} ms, "
                  f"mean {statistics.mean(fsync_records):,.0f} records per fsync")
        if checkpoints:
            print(f"checkpoints           {len(checkpoints)}, "
                  f"mean {statistics.mean(checkpoints) * 1e3:.0f} ms, "
                  f"max {max(checkpoints) * 1e3:.0f} ms")
        print(f"durability lag at end {lag} records")
        started = time.perf_counter()
        storage.close()
        print(f"close (checkpoint)    {(time.perf_counter() - started) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
