"""Disaster recovery's choices, on in-process fake bookies and memory://
tier-2: where the container count comes from (the metadata store, else
tier-2, else the caller; refused when they disagree or nobody knows),
recovering some containers only, an empty tier-2, and a table whose
``$index`` disagrees with its data.  Recovery of every
kind of segment runs on real bookies in
``tests/integration/test_segmentstore_recovery.py``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from quire.client import Client
from quire.errors import RecoveryError
from quire.log import LogCatalog
from quire.segmentstore import SegmentStore, SegmentStoreConfig, SegmentType
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import container_log_name
from quire.segmentstore.storage_records import decode_index_batches, encode_index_batch
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.store import cluster_container_count
from quire.segmentstore.tier2_reader import read_layout
from quire.tier2 import open_chunk_storage
from tests.support.fake_bookie import FakeCluster

FLUSH = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                            iteration_interval_ms=10)


@pytest.fixture
async def clusters() -> AsyncIterator[Callable[[], asyncio.Future[Client]]]:
    """``await new_client()``: a client of a new cluster of 3 fake bookies."""
    started: list[FakeCluster] = []

    async def make() -> Client:
        cluster = await FakeCluster.start(3)
        started.append(cluster)
        return await cluster.client()
    yield lambda: asyncio.ensure_future(make())
    for cluster in started:
        await cluster.close()


async def written(client: Client, uri: str, count: int) -> dict[str, bytes]:
    """A few segments flushed to ``uri`` by a store of ``count`` containers."""
    store = await SegmentStore.open(client, range(count), uri, config=SegmentStoreConfig(
        container_count=count, storage_writer=FLUSH))
    data = {f"sc/st/{i}": b"bytes of %d" % i for i in range(6)}
    try:
        for name, value in data.items():
            await store.create_segment(name)
            await store.append(name, value)
        await iterated(store)
    finally:
        await store.close()
    return data


async def iterated(store: SegmentStore) -> None:
    """Every writer ran 2 whole iterations after now: all is in tier-2."""
    start = {cid: w.iterations for cid, w in store.writers.items()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while any(w.iterations < start[cid] + 2 for cid, w in store.writers.items()):
        assert loop.time() < deadline
        await asyncio.sleep(0.01)  # polling the condition, with a deadline


async def test_the_container_count_comes_from_tier2_when_the_metadata_store_is_lost(
        clusters: Callable[[], asyncio.Future[Client]]) -> None:
    uri = f"memory://{uuid.uuid4().hex}"
    data = await written(await clusters(), uri, 2)
    fresh = await clusters()
    report = await recover(fresh, uri)
    assert report.container_count == 2 and report.segments == len(data)
    assert await cluster_container_count(fresh.metadata_store, None) == 2
    store = await SegmentStore.open(fresh, range(2), uri,
                                    config=SegmentStoreConfig(storage_writer=FLUSH))
    try:
        for name, value in data.items():
            assert (await store.read(name, 0, 100)).data == value
    finally:
        await store.close()


async def test_a_count_that_disagrees_or_that_nobody_records_is_refused(
        clusters: Callable[[], asyncio.Future[Client]]) -> None:
    uri = f"memory://{uuid.uuid4().hex}"
    await written(await clusters(), uri, 2)
    other = await clusters()
    await cluster_container_count(other.metadata_store, 3)
    with pytest.raises(RecoveryError, match="different clusters"):
        await recover(other, uri)
    with pytest.raises(RecoveryError, match="asked for 3"):
        await recover(await clusters(), uri, container_count=3)
    assert not await LogCatalog(other.metadata_store).names()  # nothing was made

    empty = f"memory://{uuid.uuid4().hex}"
    nobody = await clusters()
    with pytest.raises(RecoveryError, match="neither"):
        await recover(nobody, empty)
    report = await recover(nobody, empty, container_count=2)
    assert (report.container_count, report.segments, report.orphans) == (2, 0, ())
    assert await LogCatalog(nobody.metadata_store).names() == [
        container_log_name(0), container_log_name(1)]


async def test_some_containers_only(clusters: Callable[[], asyncio.Future[Client]]) -> None:
    uri = f"memory://{uuid.uuid4().hex}"
    data = await written(await clusters(), uri, 2)
    fresh = await clusters()
    report = await recover(fresh, uri, container_ids=[1])
    assert [c.container_id for c in report.containers] == [1]
    assert 0 < report.segments < len(data)
    assert await LogCatalog(fresh.metadata_store).names() == [container_log_name(1)]
    assert report.orphans == ()  # container 0's chunks are recorded, not orphans


async def test_a_table_index_that_disagrees_with_its_data_is_reported(
        clusters: Callable[[], asyncio.Future[Client]]) -> None:
    uri = f"memory://{uuid.uuid4().hex}"
    client = await clusters()
    store = await SegmentStore.open(client, range(1), uri, config=SegmentStoreConfig(
        container_count=1, storage_writer=FLUSH))
    try:
        await store.create_segment("sc/st/table", SegmentType.TABLE)
        await store.table_put("sc/st/table", [(b"a", b"1", None), (b"b", b"2", None)])
        await iterated(store)
    finally:
        await store.close()
    assert (await recover(await clusters(), uri)).containers[0].index_mismatches == ()
    # rewrite the $index's first chunk (same length): key a at b's version
    storage = await open_chunk_storage(uri)
    try:
        layout = await read_layout(storage, "sc/st/table$index")
        assert layout is not None
        chunk = layout.chunks[0]
        raw = await storage.read(chunk.name, 0, chunk.length)
        (batch,) = decode_index_batches(raw)
        versions = dict(batch.versions)
        forged = encode_index_batch({b"a": versions[b"b"], b"b": versions[b"b"]},
                                    batch.indexed_length)
        assert len(forged) == len(raw)
        await storage.delete(chunk.name)
        await storage.write_chunk(chunk.name, forged)
    finally:
        await storage.close()
    report = await recover(await clusters(), uri)
    assert report.containers[0].index_mismatches == ("sc/st/table",)
