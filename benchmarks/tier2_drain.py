"""Storage writer drain rate against the disk's raw sequential write rate
(not a test).

One container on the in-memory tier-1 twin holds ``--total-mib`` of
unflushed appends (``--append-kib`` each) spread over ``--segments``
segments, appends stopped; a :class:`StorageWriter` (threshold 1 byte)
drains it to ``file://`` tier-2 in flush iterations until the backlog is
zero.  In the same run, on the same file system, the same bytes are written
as one plain file and fsynced once.  Prints both rates, the ratio (the
issue's goal: at least 0.7) and the iterations taken.

    .venv/bin/python benchmarks/tier2_drain.py --total-mib 256 --segments 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.tier2_write import raw_write
from quire.segmentstore import ContainerConfig, SegmentContainer
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import Tier2Config, open_chunk_storage

_MiB = 1024 * 1024


async def drain(root: Path, total_bytes: int, segments: int, append_bytes: int,
                max_chunk_bytes: int) -> tuple[float, int, int]:
    """(seconds, iterations, chunks written) to drain the backlog."""
    container = await SegmentContainer.open(0, MemoryDataLogs().open("c0"), ContainerConfig(
        read_index_budget_bytes=2 * total_bytes, checkpoint_every_bytes=4 * total_bytes))
    storage = await open_chunk_storage(Tier2Config(uri=f"file://{root}",
                                                   max_chunk_bytes=max_chunk_bytes))
    try:
        names = [f"bench/drain/{i}" for i in range(segments)]
        for name in names:
            await container.create_segment(name)
        block = os.urandom(append_bytes)
        per_segment = total_bytes // segments
        futures = []
        for _ in range(0, per_segment, append_bytes):
            for name in names:
                futures.append(container.append(name, block))
            if len(futures) > 1000:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
        writer = await StorageWriter.start(ContainerWriterSource(container), storage,
                                           StorageWriterConfig(flush_threshold_bytes=1),
                                           max_chunk_bytes=max_chunk_bytes)
        start = time.perf_counter()
        iterations = chunks = 0
        while writer.backlog_bytes() > 0:
            report = await writer.flush_once()
            iterations += 1
            chunks += report.chunks_written
        return time.perf_counter() - start, iterations, chunks
    finally:
        await container.close()
        await storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mib", type=int, default=256)
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--append-kib", type=int, default=64)
    parser.add_argument("--chunk-mib", type=int, default=16)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    total = args.total_mib * _MiB
    base = Path(tempfile.mkdtemp(prefix="quire-drain-", dir=args.dir))
    try:
        seconds, iterations, chunks = asyncio.run(drain(
            base / "tier2", total, args.segments, args.append_kib * 1024,
            args.chunk_mib * _MiB))
        raw_seconds = raw_write(base / "raw", memoryview(os.urandom(total)), 1 * _MiB)
        drained = total / seconds / 1e6
        raw = total / raw_seconds / 1e6
        print(f"drain {args.total_mib} MiB over {args.segments} segments to file://: "
              f"{drained:.1f} MB/s in {iterations} iterations, {chunks} chunks; raw write+fsync "
              f"{raw:.1f} MB/s; ratio {drained / raw:.2f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
