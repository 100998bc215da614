"""Table segments are compacted as Pravega's are: live entries copied
forward with their versions, the head truncated, so a table's size follows
its live entries, not its history: after 100,000 updates of 100 keys the
segment holds at most twice their bytes and a little slack, every key
reads its latest value at the version its update was given (conditional
updates still hold), a fresh delta reader sees every live entry, and the
table comes back whole from tier-1 replay and from tier-2's bytes alone."""

from __future__ import annotations

import uuid

import pytest

from quire.errors import TableKeyBadVersionError
from quire.segmentstore import ContainerConfig, SegmentContainer, SegmentType
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tables import (
    COMPACTION_SLACK_BYTES,
    TableIndex,
    decode_entries,
    encode_batch,
    encode_copies,
)
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import Tier2Reader, read_records
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import open_chunk_storage, read_segment

TABLE = "_system/_tables/sc/streams"
KEYS = [b"key-%03d" % k for k in range(100)]


def test_a_copied_entry_keeps_its_version() -> None:
    data, _ = encode_batch([(b"a", b"1"), (b"b", b"2")])
    copies = encode_copies([(b"a", b"1", 0), (b"b", b"2", 10)])
    entries = list(decode_entries(data + copies, 0))
    assert [(v, k, x) for v, k, x, _end in entries] == [
        (0, b"a", b"1"), (10, b"b", b"2"), (0, b"a", b"1"), (10, b"b", b"2")]
    assert entries[-1][3] == len(data) + len(copies)
    table = TableIndex()
    table.apply(data, 0)
    live = table.live_bytes
    table.apply(copies, len(data))
    assert table.live_bytes == live and table.entries == {b"a": (0, b"1"), b"b": (10, b"2")}


async def test_a_table_follows_its_live_entries_after_100000_updates_of_100_keys() -> None:
    logs = MemoryDataLogs()
    config = ContainerConfig(checkpoint_every_bytes=1 << 20)
    container = await SegmentContainer.open(0, logs.open("c0"), config)
    try:
        await container.create_segment(TABLE, SegmentType.TABLE)
        versions: dict[bytes, int] = {}
        for round_ in range(10_000):
            batch = [(KEYS[(round_ * 10 + i) % 100], b"value %d" % round_, None)
                     for i in range(10)]
            for (key, _v, _e), version in zip(batch, await container.tables.put(TABLE, batch),
                                              strict=True):
                versions[key] = version
        s = container.committed.get(TABLE)
        assert s is not None
        live = container.tables.committed[s.segment_id].live_bytes
        assert 100 * 16 < live < 100 * 40
        assert s.length - s.start_offset <= 2 * live + COMPACTION_SLACK_BYTES + (1 << 10)
        assert s.length > 50 * (s.length - s.start_offset)  # it was compacted, many times
        got = await container.tables.get(TABLE, KEYS)
        assert [(e.key, e.version) for e in got if e] == [(k, versions[k]) for k in KEYS]
        # a conditional update at the version the key was given still holds
        await container.tables.put(TABLE, [(KEYS[0], b"new", versions[KEYS[0]])])
        with pytest.raises(TableKeyBadVersionError):
            await container.tables.put(TABLE, [(KEYS[1], b"new", versions[KEYS[1]] - 1)])
        delta = await container.tables.read_delta(TABLE, 0, 1000)
        assert delta.should_clear
        delta = await container.tables.read_delta(TABLE, delta.last_position, 1000)
        assert {e.key for e in delta.entries} == set(KEYS)
        expected = {k: (e.version, e.value) for k, e in
                    zip(KEYS, await container.tables.get(TABLE, KEYS), strict=True) if e}
    finally:
        await container.close()
    again = await SegmentContainer.open(0, logs.open("c0"), config)  # tier-1 replay
    try:
        got = await again.tables.get(TABLE, KEYS)
        assert {e.key: (e.version, e.value) for e in got if e} == expected
    finally:
        await again.close()


async def test_a_compacted_table_flushes_and_comes_back_from_tier2_alone() -> None:
    storage = await open_chunk_storage(f"memory://{uuid.uuid4().hex}")
    logs = MemoryDataLogs()
    container = await SegmentContainer.open(0, logs.open("c0"),
                                            tier2_read=(await Tier2Reader.load(storage, 0)).read)
    writer = await StorageWriter.start(ContainerWriterSource(container), storage,
                                       StorageWriterConfig(), max_chunk_bytes=64 << 10)
    try:
        await container.create_segment(TABLE, SegmentType.TABLE)
        for round_ in range(2000):
            await container.tables.put(TABLE, [(KEYS[(round_ * 5 + i) % 100], b"v%d" % round_,
                                                None) for i in range(5)])
            if round_ % 50 == 0:
                await writer.flush_once()
        await writer.flush_once()
        await writer.flush_once()
        expected = {e.key: (e.version, e.value)
                    for e in await container.tables.get(TABLE, KEYS) if e}
        assert await check(storage) == []
        layout = (await read_records(storage, 0)).layouts[TABLE]
        assert layout.start_offset > 0 and layout.length - layout.start_offset < 64 << 10
    finally:
        await container.close()
    records = await read_records(storage, 0)  # tier-2's bytes alone give the table back
    layout = records.layouts[TABLE]
    table = TableIndex()
    table.apply(await read_segment(storage, layout, layout.start_offset,
                                   layout.length - layout.start_offset), layout.start_offset)
    assert table.entries == expected
    await storage.close()
