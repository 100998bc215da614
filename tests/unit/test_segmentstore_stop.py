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
from quire.testing.memory_data_log import MemoryDataLogs


class WriterLosingOneCancellation:
    """A storage writer's stand-in whose first cancellation is lost."""

    def __init__(self) -> None:
        self.health = SimpleNamespace(counts=None)
        self.cancellations = 0

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
