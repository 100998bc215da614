"""The storage writer on real bookies with file:// tier-2: a segment store
flushes its containers to tier-2 and truncates their tier-1 logs; a new
store (new owners: fenced, replayed from the truncation checkpoint) has
every acknowledged byte, attribute and table entry, the older ones read
back from tier-2."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from quire.client import Client
from quire.segmentstore import (
    AttributeUpdate,
    ContainerConfig,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_reader import read_layout
from tests.support.cluster import Cluster


async def test_flush_truncate_tier1_and_take_over_from_tier1_and_tier2(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]], tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/tier2"
    config = SegmentStoreConfig(
        container=ContainerConfig(read_index_budget_bytes=4096),
        storage_writer=StorageWriterConfig(flush_threshold_bytes=1, iteration_interval_ms=20))
    client = await connect(cluster)
    store = await SegmentStore.open(client, (), uri, config=config)
    ids = list(range(store.container_count))
    streams = [f"sc/t2/{i}" for i in range(8)]
    table = "sc/t2/table"
    expected: dict[str, bytes] = {}
    try:
        for container_id in ids:
            await store.start_container(container_id)
        for name in streams:
            await store.create_segment(name)
            expected[name] = b""
        await store.create_segment(table, SegmentType.TABLE)
        for round_ in range(20):
            futures = []
            for i, name in enumerate(streams):
                piece = b"%s:%d;" % (name.encode(), round_)
                expected[name] += piece
                futures.append(store.append(name, piece, [
                    AttributeUpdate(i, UpdateType.REPLACE, round_)]))
            futures.append(store.table_put(table, [(b"key%d" % round_, b"v" * round_, None)]))
            await asyncio.gather(*futures)
        tier2 = store.tier2
        assert tier2 is not None

        async def flushed() -> bool:
            for name, data in expected.items():
                layout = await read_layout(tier2, name)
                if layout is None or layout.length != len(data):
                    return False
            return all(w.truncated_at is not None for w in store.writers.values())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not await flushed():
            assert loop.time() < deadline, "not flushed and truncated in 30 s"
            await asyncio.sleep(0.05)  # polling the condition, with a deadline
        assert all(w.failure is None for w in store.writers.values())
        await store.append(streams[0], b"tail")  # acknowledged, maybe only in tier-1
        expected[streams[0]] += b"tail"
    finally:
        await store.close()
    client2 = await connect(cluster)
    store = await SegmentStore.open(client2, ids, uri, config=config)
    try:
        for i, name in enumerate(streams):
            info = await store.get_info(name)
            assert info.length == len(expected[name])
            got = b""
            while len(got) < info.length:
                got += (await store.read(name, len(got), 1 << 20)).data
            assert got == expected[name]
            assert await store.get_attributes(name, [i]) == {i: 19}
        entries = await store.table_get(table, [b"key%d" % r for r in range(20)])
        assert [e.value if e else None for e in entries] == [b"v" * r for r in range(20)]
    finally:
        await store.close()
