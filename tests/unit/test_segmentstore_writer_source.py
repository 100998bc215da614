"""The storage writer's seam, :class:`~quire.segmentstore.writer_source.WriterSource`:
the twin (:class:`~quire.testing.memory_writer_source.MemoryWriterSource`)
shows a writer what a container would, and a writer runs on the twin alone,
with no container and no tier-1 log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from quire.segmentstore import AttributeUpdate, SegmentContainer, SegmentType, UpdateType
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import journal_name, read_layout, storage_metadata_name
from quire.segmentstore.writer_source import ContainerWriterSource, WriterSource
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from quire.testing.memory_writer_source import MemoryWriterSource
from quire.tier2 import open_chunk_storage, read_segment
from tests.unit.test_segmentstore_storage_writer import RecordingStorage

USER, TABLE, SYSTEM = "sc/st/0", "sc/kv/0", "_system/ctl/0"
META, JOURNAL = storage_metadata_name(0), journal_name(0)


def view(source: WriterSource) -> dict[str, Any]:
    """Everything a writer reads of ``source``'s segments."""
    return {s.segment_id: (s.name, s.type, s.length, s.start_offset, s.sealed, s.deleted,
                           dict(s.attributes), dict(source.table_entries(s.segment_id)))
            for s in source.segments.values()}


async def requests(c: Any) -> None:
    """The same requests, to a container or to the twin."""
    await c.create_segment(USER, SegmentType.STREAM)
    await c.create_segment(TABLE, SegmentType.TABLE)
    await c.create_segment(USER + "#transaction.1", SegmentType.STREAM)
    await c.append(USER, b"abc" * 10, [AttributeUpdate(7, UpdateType.REPLACE, 70)])
    await c.append(USER + "#transaction.1", b"txn")
    await c.table_put(TABLE, [(b"k1", b"v1", None), (b"k2", b"v2", None)])
    # a container serves table removals through its tables; the twin takes them itself
    remove = c.tables.remove if isinstance(c, SegmentContainer) else c.table_remove
    await remove(TABLE, [(b"k1", None)])
    await c.update_attributes(USER, [AttributeUpdate(8, UpdateType.ACCUMULATE, 5)])
    await c.truncate(USER, 4)
    await c.merge(USER, USER + "#transaction.1")
    await c.create_segment("sc/st/doomed")
    await c.delete("sc/st/doomed")


async def no_tier2(_segment_id: int, _name: str, _offset: int, _length: int) -> bytes:
    return b""


async def test_the_twin_shows_a_writer_what_a_container_would() -> None:
    container = await SegmentContainer.open(0, MemoryDataLogs().open("c0"),
                                            clock=ManualClock(1234))
    try:
        real, twin = ContainerWriterSource(container), MemoryWriterSource(clock=ManualClock(1234))
        for source in (real, twin):
            source.read_from_tier2(no_tier2)  # what a writer's start does: merges are kept
        await requests(container)
        await requests(twin)
        assert view(twin) == view(real)
        assert twin.segment(USER) == real.segment(USER)
        assert twin.segment("sc/st/doomed") is None and real.segment("sc/st/doomed") is None
        merges = list(real.take_merges())
        assert merges == list(twin.take_merges()) and len(merges) == 1
        assert not real.take_merges() and not twin.take_merges()  # each handed over once
        user = real.segment(USER)
        assert user is not None
        for source in (real, twin):
            assert await source.read(user.segment_id, 4, 100) == (b"abc" * 10)[4:] + b"txn"
            source.flushed(user.segment_id, 10)
        assert view(twin) == view(real)
        assert twin.segments[user.segment_id].storage_length == 10 == user.storage_length
    finally:
        await container.close()


@pytest.fixture
async def alone() -> AsyncIterator[tuple[MemoryWriterSource, RecordingStorage, StorageWriter]]:
    """A writer on the twin alone, flushing at once (chunks of at most 64 bytes)."""
    storage = RecordingStorage(await open_chunk_storage("memory://"))
    twin = MemoryWriterSource()
    writer = await StorageWriter.start(twin, storage, StorageWriterConfig(
        flush_threshold_bytes=1), max_chunk_bytes=64)
    yield twin, storage, writer
    await storage.close()


async def test_one_iteration_on_the_twin_flushes_in_pdp40_order(
        alone: tuple[MemoryWriterSource, RecordingStorage, StorageWriter]) -> None:
    twin, storage, writer = alone
    assert twin.tier2_read == writer.reader.read  # the writer gave its reader
    await twin.create_segment(USER)
    await twin.create_segment(TABLE, SegmentType.TABLE)
    await twin.create_segment(SYSTEM)
    await twin.append(USER, b"u" * 100, [AttributeUpdate(1, UpdateType.REPLACE, 10)])
    await twin.table_put(TABLE, [(b"k", b"v", None)])
    await twin.append(SYSTEM, b"s")
    storage.take()
    report = await writer.flush_once()
    ops = storage.take()
    order = [segment for _kind, segment in ops]
    assert report.buckets == [[USER, TABLE], [SYSTEM], [META]]
    # the user bucket, the system bucket, the metadata bucket, the journal last
    rank = {USER: 0, USER + "$attributes": 0, TABLE: 0, TABLE + "$index": 0, SYSTEM: 1,
            META: 2, META + "$index": 2, JOURNAL: 3}
    assert [rank[s] for s in order] == sorted(rank[s] for s in order)
    assert set(order) == set(rank) and order[-1] == JOURNAL
    assert all(kind == "write" for kind, _s in ops)
    for data, dependent in ((USER, USER + "$attributes"), (TABLE, TABLE + "$index"),
                            (META, META + "$index")):  # each data before what records it
        assert max(i for i, s in enumerate(order) if s == data) < order.index(dependent)
    for name in (USER, TABLE, SYSTEM):
        s = twin.segment(name)
        assert s is not None and s.storage_length == s.length
    assert twin.truncated_at is not None and len(twin.checkpoints) == 1  # tier-1 cut
    layout = await read_layout(storage, USER)
    assert layout is not None
    assert await read_segment(storage, layout, 0, 100) == b"u" * 100
    assert await check(storage) == []


async def test_a_deletion_on_the_twin_takes_two_iterations(
        alone: tuple[MemoryWriterSource, RecordingStorage, StorageWriter]) -> None:
    twin, storage, writer = alone
    await twin.create_segment(USER)
    await twin.append(USER, b"d" * 150, [AttributeUpdate(1, UpdateType.REPLACE, 1)])
    await writer.flush_once()
    flushed = await read_layout(storage, USER)
    assert flushed is not None and len(flushed.chunks) == 3
    await twin.delete(USER)
    storage.take()
    await writer.flush_once()  # k: the deletion recorded, no chunk of it deleted
    ops = storage.take()
    assert not any(kind == "delete" and segment != JOURNAL for kind, segment in ops), ops
    gone = await read_layout(storage, USER)
    assert gone is not None and gone.deleted
    assert await read_segment(storage, flushed, 0, 150) == b"d" * 150  # still readable
    assert await check(storage) == []
    await writer.flush_once()  # k+1: its chunks go (its records too: a new journal)
    deleted = sorted(segment for kind, segment in storage.take()
                     if kind == "delete" and segment != JOURNAL)
    assert deleted == [USER] * 3 + [USER + "$attributes"]
    assert await check(storage) == []
