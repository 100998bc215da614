"""Abandoned tier-1 ledgers are deleted only when tier-2 covers them.

A store of two containers on fake bookies flushes everything to memory://
tier-2, then one of its containers takes an append that is acknowledged
and never flushed; disaster recovery replaces the logs (recording their
ledgers as abandoned); ``delete_covered`` deletes the fully covered
container's ledgers and keeps the other's, naming the bytes tier-2 lacks;
a second run finds only the kept one, and nothing is read from a deleted
ledger again."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from quire.errors import MetadataNotFoundError
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.covered_ledgers import abandoned_ledgers, delete_covered
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import container_of
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.store import LEGACY_LOG_PASSWORD
from tests.support.fake_bookie import FakeCluster

FLUSH = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                            iteration_interval_ms=10)
NEVER = StorageWriterConfig(flush_threshold_bytes=1 << 40, flush_threshold_ms=1 << 40,
                            iteration_interval_ms=10)


def name_in(container: int) -> str:
    return next(f"sc/st/{i}.#epoch.0" for i in range(100) if container_of(
        f"sc/st/{i}.#epoch.0", 2) == container)


async def flushed(store: SegmentStore) -> None:
    async with asyncio.timeout(30):
        while any(w.backlog_bytes() for w in store.writers.values()):
            await asyncio.sleep(0.01)  # polling the writers, with a deadline
        start = {cid: w.iterations for cid, w in store.writers.items()}
        while any(w.iterations < start[cid] + 2 for cid, w in store.writers.items()):
            await asyncio.sleep(0.01)  # polling the writers, with a deadline


async def test_covered_abandoned_ledgers_are_deleted_an_uncovered_one_kept() -> None:
    uri = f"memory://{uuid.uuid4().hex}"
    cluster = await FakeCluster.start(3)
    try:
        client = await cluster.client()
        store = await SegmentStore.open(client, range(2), uri, config=SegmentStoreConfig(
            container_count=2, storage_writer=FLUSH))
        covered, lost = name_in(0), name_in(1)
        try:
            for name in (covered, lost):
                await store.create_segment(name)
                await store.append(name, b"flushed;" * 10)
            await flushed(store)
            for writer in store.writers.values():
                writer.config = NEVER  # user segments are not flushed from now on
            await store.append(lost, b"acknowledged, never flushed")
        finally:
            await store.close()
        report = await recover(client, uri, replace_logs=True)
        abandoned = await abandoned_ledgers(client.metadata_store)
        assert sorted(abandoned) == [0, 1] and abandoned[0] and abandoned[1]
        assert sorted(report.abandoned_ledgers) == sorted(abandoned[0] + abandoned[1])

        dry = await delete_covered(client, uri, dry_run=True)
        assert sorted(dry.deleted) == abandoned[0]
        assert await abandoned_ledgers(client.metadata_store) == abandoned  # nothing deleted
        done = await delete_covered(client, uri)
        assert sorted(done.deleted) == abandoned[0]
        assert [k.ledger_id for k in done.kept] == abandoned[1] == [abandoned[1][-1]]
        kept = done.kept[-1]
        assert kept.container_id == 1 and f"{lost!r} bytes 80..107" in kept.reason
        for ledger_id in abandoned[0]:
            with pytest.raises(MetadataNotFoundError):
                await client.open_ledger(ledger_id, password=LEGACY_LOG_PASSWORD, recovery=False)
        handle = await client.open_ledger(kept.ledger_id, password=LEGACY_LOG_PASSWORD,
                                          recovery=False)
        assert handle.last_add_confirmed >= 0
        again = await delete_covered(client, uri)
        assert again.deleted == [] and [k.ledger_id for k in again.kept] == [kept.ledger_id]
        assert list(await abandoned_ledgers(client.metadata_store)) == [1]
    finally:
        await cluster.close()
