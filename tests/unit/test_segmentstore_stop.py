"""A container's stop that waits for a storage writer which lost its
cancellation (Python 3.11's ``asyncio.wait_for`` returns its inner result
when a cancellation races it) is named in ``transitions`` and ends when the
writer is cancelled again (what the host's convergence watchdog does)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from quire.metadata import open_store
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from quire.testing.memory_writer_source import MemoryWriterSource
from quire.tier2 import open_chunk_storage


class WriterLosingOneCancellation:
    """A storage writer's stand-in whose first cancellation is lost (and
    which, unlike :class:`~quire.segmentstore.storage_writer.StorageWriter`,
    ignores :meth:`stop`)."""

    def __init__(self) -> None:
        self.health = SimpleNamespace(counts=None)
        self.cancellations = 0

    def stop(self) -> None:
        pass

    async def run(self) -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancellations += 1
                if self.cancellations > 1:
                    raise


async def test_a_stop_waiting_for_a_writer_that_lost_its_cancellation(tmp_path: Path) -> None:
    metadata = await open_store("memory://stop-writer")
    logs = MemoryDataLogs()
    writer = WriterLosingOneCancellation()

    async def start_writer(*_args: Any) -> Any:
        return writer
    store = await SegmentStore.open(None, [0], (tmp_path / "tier2").as_uri(),
                                    metadata_store=metadata,
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=1),
                                    start_writer=start_writer)
    try:
        assert store.cancel_writer_again(0) is None  # no stop waits
        stopping = asyncio.ensure_future(store.stop_container(0))
        for _ in range(5):
            await asyncio.sleep(0)  # turns of the loop: the cancellation lands, and is lost
        assert writer.cancellations == 1 and not stopping.done()
        assert store.transitions == {"starting": [], "stopping": {0: "its storage writer"}}
        where = store.cancel_writer_again(0)
        assert where is not None and "in run" in where
        await stopping
        assert writer.cancellations == 2
        assert store.transitions == {"starting": [], "stopping": {}}
        assert store.container_ids == []
    finally:
        await store.close()
        await metadata.close()


async def test_a_writer_told_to_stop_ends_without_its_cancellation() -> None:
    """:meth:`StorageWriter.stop` alone ends :meth:`StorageWriter.run` at
    its next wait (what a lost cancellation leaves to it)."""
    storage = await open_chunk_storage("memory://writer-stop")
    writer = await StorageWriter.start(MemoryWriterSource(clock=ManualClock(1_000_000)), storage,
                                       StorageWriterConfig(iteration_interval_ms=60_000))
    running = asyncio.ensure_future(writer.run())
    try:
        while writer.iterations < 1:
            await asyncio.sleep(0)  # turns of the loop: the first iteration runs at once
        writer.stop()
        await asyncio.wait_for(running, 5)  # long before the minute's interval
        assert writer.failure is None
    finally:
        running.cancel()
        await storage.close()
