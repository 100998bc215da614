"""Tier-2 file driver write rate against the disk's raw sequential write rate
(not a test).

Writes ``--total-mib`` of random bytes as chunks of ``--chunk-mib`` through
the ``file://`` driver (each chunk: temporary file, write, fdatasync, link,
directory fsync), and, in the same run on the same file system, the same
bytes as one plain file written sequentially and fsynced once at the end.
Rounds alternate between the two (each round's files deleted after it);
prints the median MB/s of each and the ratio (goal: at least 0.7).

    .venv/bin/python benchmarks/tier2_write.py --total-mib 256 --chunk-mib 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from quire.tier2 import DEFAULT_MAX_CHUNK_BYTES, Tier2Config, open_chunk_storage

_MiB = 1024 * 1024


def raw_write(path: Path, data: memoryview, piece_bytes: int) -> float:
    """Seconds to write ``data`` to one new file in ``piece_bytes`` writes and fsync it."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for offset in range(0, len(data), piece_bytes):
            piece = data[offset:offset + piece_bytes]
            written = 0
            while written < len(piece):
                written += os.write(fd, piece[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


async def tier2_write(root: Path, data: memoryview, chunk_bytes: int, concurrency: int) -> float:
    """Seconds to write ``data`` as chunks through the file driver,
    ``concurrency`` chunk writes in flight."""
    storage = await open_chunk_storage(Tier2Config(uri=f"file://{root}",
                                                   max_chunk_bytes=chunk_bytes))
    offsets = list(range(0, len(data), chunk_bytes))
    start = time.perf_counter()

    async def writer(first: int) -> None:
        for index in range(first, len(offsets), concurrency):
            offset = offsets[index]
            await storage.write_chunk(f"scope/stream/0.E1.{index}",
                                      data[offset:offset + chunk_bytes])

    await asyncio.gather(*(writer(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    await storage.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--chunk-mib", type=float, default=DEFAULT_MAX_CHUNK_BYTES / _MiB,
                        help="chunk size (default: the default max_chunk_bytes)")
    parser.add_argument("--concurrency", type=int, default=1, help="chunk writes in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    chunk_bytes = int(args.chunk_mib * _MiB)
    data = memoryview(os.urandom(args.total_mib * _MiB))
    megabytes = len(data) / 1e6
    raw_rates: list[float] = []
    tier2_rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="quire-bench-tier2-", dir=args.dir) as tmp:
        work = Path(tmp)
        for round_number in range(args.rounds):
            raw_rates.append(megabytes / raw_write(work / "raw", data, chunk_bytes))
            (work / "raw").unlink()
            tier2_rates.append(megabytes / asyncio.run(
                tier2_write(work / "tier2", data, chunk_bytes, args.concurrency)))
            shutil.rmtree(work / "tier2")
            if not args.json:
                print(f"round {round_number + 1}: raw {raw_rates[-1]:.0f} MB/s, "
                      f"tier-2 {tier2_rates[-1]:.0f} MB/s", flush=True)
    raw_rate, tier2_rate = statistics.median(raw_rates), statistics.median(tier2_rates)
    if args.json:
        print(json.dumps({"raw": {"mb_per_s": raw_rate}, "tier2": {"mb_per_s": tier2_rate},
                          "ratio": tier2_rate / raw_rate}))
        return
    print(f"{args.total_mib} MiB in chunks of {chunk_bytes / _MiB:g} MiB, "
          f"{args.concurrency} in flight, median of {args.rounds} rounds:")
    print(f"  raw sequential write + fsync: {raw_rate:8.1f} MB/s")
    print(f"  tier-2 file driver:           {tier2_rate:8.1f} MB/s")
    print(f"  ratio: {tier2_rate / raw_rate:.2f}x (goal >= 0.7x)")


if __name__ == "__main__":
    main()
