"""What entry-log compaction costs (not a test): MB/s of live entries moved.

Fills a storage engine with ``--megabytes`` of entries of ``--ledgers``
ledgers written interleaved (each checkpoint holds a slice of every
ledger), deletes ``--dead-fraction`` of the ledgers, then compacts every
log (threshold 1.0) and prints the bytes moved and reclaimed, the time, and
the rate.  Also times the per-checkpoint usage bookkeeping
(``usage_of_rows``) for a 70,000-entry checkpoint.

    .venv/bin/python benchmarks/compaction.py --megabytes 256 --dead-fraction 0.5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from quire.bookie.storage import BookieStorage, StorageConfig
from quire.bookie.storage.entry_log import IndexRows
from quire.bookie.storage.index import usage_of_rows

_MiB = 1024 * 1024


def entry(ledger_id: int, entry_id: int, size: int) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + bytes(size - 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--entry-bytes", type=int, default=1024)
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--dead-fraction", type=float, default=0.5)
    parser.add_argument("--entry-log-max-mb", type=int, default=64)
    parser.add_argument("--chunk-mb", type=int, default=4, help="compaction_chunk_bytes")
    parser.add_argument("--dir", type=Path, default=None,
                        help="data directory (default: a temporary one)")
    args = parser.parse_args()

    rows = IndexRows([i // 700 for i in range(70_000)], list(range(70_000)),
                     [1] * 70_000, [0] * 70_000, [1024] * 70_000)
    started = time.perf_counter()
    for _ in range(10):
        usage_of_rows(rows)
    print(f"usage bookkeeping: {(time.perf_counter() - started) * 100:.2f} ms per "
          "70,000-entry checkpoint of 100 ledgers")

    with tempfile.TemporaryDirectory(prefix="quire-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        config = StorageConfig(journal_dirs=(root,), ledger_dirs=(root,),
                               entry_log_max_bytes=args.entry_log_max_mb * _MiB,
                               write_cache_max_bytes=64 * _MiB,
                               compaction_chunk_bytes=args.chunk_mb * _MiB)
        storage = BookieStorage.open(config)
        key = bytes(20)
        total = args.megabytes * _MiB // args.entry_bytes
        per_checkpoint = 16 * _MiB // args.entry_bytes
        next_entry = [0] * args.ledgers
        for n in range(total):
            lid = n % args.ledgers
            storage.add_entry(lid + 1, next_entry[lid], entry(lid + 1, next_entry[lid],
                                                                args.entry_bytes), key)
            next_entry[lid] += 1
            if (n + 1) % per_checkpoint == 0:
                storage.journal.sync()
                storage.checkpoint()
        storage.journal.sync()
        storage.close()
        storage = BookieStorage.open(config)  # every log written is now closed
        dead = range(1, int(args.ledgers * args.dead_fraction) + 1)
        for lid in dead:
            storage.delete_ledger(lid)
        storage.journal.sync()
        started = time.perf_counter()
        stats = storage.compact_entry_logs(1.0)
        elapsed = time.perf_counter() - started
        storage.close()
    print(f"{args.megabytes} MiB in {args.ledgers} ledgers, {len(dead)} deleted: "
          f"{stats.logs_compacted} logs compacted, {stats.entries_moved:,} entries "
          f"({stats.bytes_moved / _MiB:.1f} MiB) moved, "
          f"{stats.bytes_reclaimed / _MiB:.1f} MiB reclaimed in {elapsed:.2f} s: "
          f"{stats.bytes_moved / _MiB / elapsed:.1f} MiB/s moved, "
          f"{stats.entries_moved / elapsed:,.0f} entries/s")


if __name__ == "__main__":
    main()
