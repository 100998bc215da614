"""The storage writer (PDP-40): one container on the in-memory tier-1 twin,
flushing to memory:// or file:// tier-2 through a wrapper that records
every tier-2 write and delete in order.  Each of PDP-40's nine requirements
has a test named after it, checked on the order of the writes.  The tests
that need no tier-1 log (:data:`ANY_SOURCE`) run on the container's
:class:`~quire.testing.memory_writer_source.MemoryWriterSource` twin too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quire.errors import (
    ContainerFencedError,
    CorruptRecordError,
    SegmentTruncatedError,
)
from quire.log import Position
from quire.metadata import open_store
from quire.segmentstore import (
    AttributeUpdate,
    ContainerConfig,
    SegmentContainer,
    SegmentStore,
    SegmentStoreConfig,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.storage_records import (
    AttributeBatch,
    IndexBatch,
    JournalSnapshot,
    decode_attribute_batches,
    decode_index_batches,
    decode_journal,
    encode_attribute_batch,
    encode_index_batch,
    encode_journal,
)
from quire.segmentstore.storage_writer import IterationReport, StorageWriter, StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import (
    Tier2Reader,
    journal_name,
    read_layout,
    read_storage_metadata,
    storage_metadata_name,
)
from quire.segmentstore.writer_source import ContainerWriterSource, WriterSource
from quire.testing.chaos_writer import ChaosStorageWriter
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from quire.testing.memory_writer_source import MemoryWriterSource
from quire.tier2 import (
    ChunkData,
    ChunkInfo,
    ChunkStorage,
    SegmentLayout,
    open_chunk_storage,
    parse_chunk_name,
    read_segment,
)

USER = "sc/st/0"
USER_TABLE = "sc/kv/0"
SYSTEM = "_system/ctl/0"
SYSTEM_TABLE = "_system/ctl/tbl"
META = storage_metadata_name(0)
JOURNAL = journal_name(0)
BIG = 1 << 40


class RecordingStorage:
    """A ChunkStorage that records each completed write and delete, in order."""

    def __init__(self, inner: ChunkStorage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.ops: list[tuple[str, str]] = []
        self.reads = 0

    async def write_chunk(self, name: str, data: ChunkData) -> None:
        await self.inner.write_chunk(name, data)
        self.ops.append(("write", name))

    async def read(self, name: str, offset: int, length: int) -> bytes:
        self.reads += 1
        return await self.inner.read(name, offset, length)

    async def length(self, name: str) -> int:
        return await self.inner.length(name)

    async def exists(self, name: str) -> bool:
        return await self.inner.exists(name)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)
        self.ops.append(("delete", name))

    async def list_chunks(self, prefix: str = "") -> list[ChunkInfo]:
        return await self.inner.list_chunks(prefix)

    async def close(self) -> None:
        await self.inner.close()

    def take(self) -> list[tuple[str, str]]:
        """The operations since the last take, as (kind, segment name)."""
        ops, self.ops = self.ops, []
        return [(kind, parse_chunk_name(name)[0]) for kind, name in ops]


@dataclass
class Rig:
    logs: MemoryDataLogs
    storage: RecordingStorage
    clock: ManualClock
    container: SegmentContainer | MemoryWriterSource
    """Where the tests' requests go: the container, or the twin (the writer's source)."""
    writer: StorageWriter
    uri: str
    opened: list[SegmentContainer] = field(default_factory=list)
    container_config: ContainerConfig = field(default_factory=ContainerConfig)

    @property
    def source(self) -> WriterSource:
        return self.writer.source

    async def reopen(self, config: StorageWriterConfig | None = None) -> None:
        assert isinstance(self.container, SegmentContainer), "the twin has no log to reopen"
        await self.container.close()
        reader = await Tier2Reader.load(self.storage, 0)  # tier-2 alone
        self.container = await SegmentContainer.open(0, self.logs.open("c0"),
                                                     self.container_config,
                                                     clock=self.clock, tier2_read=reader.read)
        self.opened.append(self.container)
        self.writer = await StorageWriter.start(ContainerWriterSource(self.container),
                                                self.storage, config or self.writer.config,
                                                max_chunk_bytes=self.writer.max_chunk_bytes)


def config(**kw: object) -> StorageWriterConfig:
    values: dict[str, object] = {"flush_threshold_bytes": BIG, "flush_threshold_ms": BIG}
    values.update(kw)
    return StorageWriterConfig(**values)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "file"])
async def r(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """A container on the tier-1 twin ("memory", "file": its tier-2), or
    the twin of a container alone ("twin", memory:// tier-2)."""
    uri = f"file://{tmp_path}/tier2" if request.param == "file" \
        else f"memory://writer-{id(request)}"
    storage = RecordingStorage(await open_chunk_storage(uri))
    logs = MemoryDataLogs()
    clock = ManualClock(1_000_000)
    if request.param == "twin":
        twin = MemoryWriterSource(clock=clock)
        writer = await StorageWriter.start(twin, storage, config(), max_chunk_bytes=64)
        r = Rig(logs, storage, clock, twin, writer, uri)
    else:
        container = await SegmentContainer.open(0, logs.open("c0"), clock=clock)
        writer = await StorageWriter.start(ContainerWriterSource(container), storage, config(),
                                           max_chunk_bytes=64)
        r = Rig(logs, storage, clock, container, writer, uri, [container])
    yield r
    for c in r.opened:
        await c.close()
    await storage.close()


ANY_SOURCE = pytest.mark.parametrize("r", ["memory", "file", "twin"], indirect=True)
"""A test that needs no tier-1 log: it runs on the twin as well."""


async def scenario(r: Rig) -> tuple[IterationReport, list[tuple[str, str]]]:
    """A user stream with attributes and a user table (both over the size
    threshold), a system stream with attributes and a system table with a
    byte each: one iteration."""
    r.writer.config = config(flush_threshold_bytes=10)
    c = r.container
    await c.create_segment(USER, SegmentType.STREAM)
    await c.create_segment(USER_TABLE, SegmentType.TABLE)
    await c.create_segment(SYSTEM, SegmentType.STREAM)
    await c.create_segment(SYSTEM_TABLE, SegmentType.TABLE)
    await c.append(USER, b"u" * 100, [AttributeUpdate(5, UpdateType.REPLACE, 50)])
    await c.table_put(USER_TABLE, [(b"k1", b"v" * 40, None)])
    await c.append(SYSTEM, b"s", [AttributeUpdate(6, UpdateType.REPLACE, 60)])
    await c.table_put(SYSTEM_TABLE, [(b"x", b"", None)])
    r.storage.take()
    report = await r.writer.flush_once()
    return report, r.storage.take()


def first(ops: list[tuple[str, str]], segment: str) -> int:
    return min(i for i, (_k, s) in enumerate(ops) if s == segment)


def last(ops: list[tuple[str, str]], segment: str) -> int:
    return max(i for i, (_k, s) in enumerate(ops) if s == segment)


# --- the nine requirements ----------------------------------------------------------


@ANY_SOURCE
async def test_rule_1_modified_system_segments_are_eligible_in_every_iteration(r: Rig) -> None:
    c = r.container
    await c.create_segment(SYSTEM)
    await c.create_segment(USER)
    for round_ in range(3):
        await c.append(SYSTEM, bytes([round_]))
        await c.append(USER, bytes([round_]))  # under both thresholds: not eligible
        report = await r.writer.flush_once()
        ops = r.storage.take()
        assert ("write", SYSTEM) in ops and ("write", USER) not in ops
        assert report.buckets[1] == [SYSTEM]
    await r.writer.flush_once()
    assert ("write", SYSTEM) not in r.storage.take()  # unmodified: nothing to flush
    layout = await read_layout(r.storage, SYSTEM)
    assert layout is not None and layout.length == 3 and len(layout.chunks) == 3


@ANY_SOURCE
async def test_rule_2_modified_metadata_segments_are_eligible_in_every_iteration(r: Rig) -> None:
    c = r.container
    await c.create_segment(SYSTEM)
    for round_ in range(3):
        await c.append(SYSTEM, bytes([round_]))
        await r.writer.flush_once()
        ops = r.storage.take()
        assert ("write", META) in ops and ("write", JOURNAL) in ops
    await r.writer.flush_once()
    assert r.storage.take() == []  # nothing modified, the metadata included


@ANY_SOURCE
async def test_rule_3_a_segment_and_its_attribute_segment_are_eligible_together(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=48)
    await c.create_segment(USER)
    # the data alone passes the threshold: its attributes go with it
    await c.append(USER, b"d" * 48, [AttributeUpdate(1, UpdateType.REPLACE, 10)])
    await r.writer.flush_once()
    ops = r.storage.take()
    assert ("write", USER) in ops and ("write", USER + "$attributes") in ops
    # the attributes alone pass it (2 x 24 B): the 1 byte of data goes with them
    await c.append(USER, b"d", [AttributeUpdate(2, UpdateType.REPLACE, 20),
                                AttributeUpdate(3, UpdateType.REPLACE, 30)])
    await r.writer.flush_once()
    ops = r.storage.take()
    assert ("write", USER) in ops and ("write", USER + "$attributes") in ops
    # by age: one attribute changed long ago, no new data
    await c.update_attributes(USER, [AttributeUpdate(4, UpdateType.REPLACE, 40)])
    await r.writer.flush_once()
    assert r.storage.take() == []
    r.clock.now_ms += BIG
    await r.writer.flush_once()
    assert ("write", USER + "$attributes") in r.storage.take()
    attributes = await read_attributes(r.storage, USER)
    assert attributes == ({1: 10, 2: 20, 3: 30, 4: 40}, 49)


@ANY_SOURCE
async def test_rule_4_eligible_segments_are_grouped_in_priority_buckets(r: Rig) -> None:
    report, _ops = await scenario(r)
    assert report.buckets == [[USER, USER_TABLE], [SYSTEM, SYSTEM_TABLE], [META]]


@ANY_SOURCE
async def test_rule_5_a_higher_bucket_is_flushed_before_any_lower_one(r: Rig) -> None:
    _report, ops = await scenario(r)
    buckets = [[USER, USER_TABLE], [SYSTEM, SYSTEM_TABLE], [META, JOURNAL]]
    rank = {base + suffix: i for i, names in enumerate(buckets) for base in names
            for suffix in ("", "$attributes", "$index")}
    ranks = [rank[segment] for _kind, segment in ops]
    assert ranks == sorted(ranks) and set(ranks) == {0, 1, 2}


@ANY_SOURCE
async def test_rule_6_user_segments_before_system_segments(r: Rig) -> None:
    _report, ops = await scenario(r)
    users = [USER, USER + "$attributes", USER_TABLE, USER_TABLE + "$index"]
    systems = [SYSTEM, SYSTEM + "$attributes", SYSTEM_TABLE, SYSTEM_TABLE + "$index"]
    assert max(last(ops, s) for s in users) < min(first(ops, s) for s in systems)


@ANY_SOURCE
async def test_rule_7_system_segments_before_metadata_segments(r: Rig) -> None:
    _report, ops = await scenario(r)
    systems = [SYSTEM, SYSTEM + "$attributes", SYSTEM_TABLE, SYSTEM_TABLE + "$index"]
    assert max(last(ops, s) for s in systems) < first(ops, META)


@ANY_SOURCE
async def test_rule_8_metadata_segments_are_flushed_last(r: Rig) -> None:
    _report, ops = await scenario(r)
    tail = [segment for _kind, segment in ops[first(ops, META):]]
    assert set(tail) == {META, META + "$index", JOURNAL}
    assert ops[-1] == ("write", JOURNAL)
    # and what they record is what is in tier-2 now
    layouts = await read_storage_metadata(r.storage, 0)
    for name in (USER, USER + "$attributes", USER_TABLE, USER_TABLE + "$index",
                 SYSTEM, SYSTEM + "$attributes", SYSTEM_TABLE, SYSTEM_TABLE + "$index"):
        info = await r.container.get_info(name.split("$")[0])
        if "$" not in name:
            assert layouts[name].length == info.length == info.storage_length


@ANY_SOURCE
async def test_rule_9_data_before_its_index_and_attribute_segments(r: Rig) -> None:
    _report, ops = await scenario(r)
    for data, dependent in ((USER, USER + "$attributes"), (USER_TABLE, USER_TABLE + "$index"),
                            (SYSTEM, SYSTEM + "$attributes"),
                            (SYSTEM_TABLE, SYSTEM_TABLE + "$index"), (META, META + "$index")):
        assert last(ops, data) < first(ops, dependent), (data, ops)
    index = await read_index(r.storage, USER_TABLE)
    assert index[0] == {b"k1": 0} and index[1] == 50


# --- delete, truncate, order switch, liveness ----------------------------------------------


@ANY_SOURCE
async def test_delete_and_truncate_take_two_iterations(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=1)
    await c.create_segment(USER)
    await c.create_segment("sc/st/1")
    for _ in range(3):
        await c.append(USER, b"a" * 64)  # one chunk each (max_chunk_bytes 64)
    await c.append("sc/st/1", b"b" * 10)
    await r.writer.flush_once()
    before = await read_layout(r.storage, USER)
    assert before is not None and len(before.chunks) == 3
    await c.truncate(USER, 130)
    await c.delete("sc/st/1")
    r.storage.take()
    await r.writer.flush_once()  # k: recorded, flushed last, nothing deleted
    ops = r.storage.take()
    assert all(kind == "write" or segment == JOURNAL for kind, segment in ops), ops
    truncated = await read_layout(r.storage, USER)
    deleted = await read_layout(r.storage, "sc/st/1")
    assert truncated is not None and truncated.start_offset == 130
    assert len(truncated.chunks) == 1
    assert deleted is not None and deleted.deleted and not deleted.chunks
    # the old layout still reads: its chunks are all there until k+1
    assert await read_segment(r.storage, before, 0, 10) == b"a" * 10
    await r.writer.flush_once()  # k+1: the chunks go (and the deleted record: a new journal)
    ops = r.storage.take()
    assert sorted(s for kind, s in ops if kind == "delete" and s != JOURNAL) == \
        sorted(["sc/st/1", USER, USER])
    with pytest.raises(SegmentTruncatedError):
        await read_segment(r.storage, before, 0, 10)  # a vanished chunk reads as truncation
    assert await read_segment(r.storage, truncated, 130, 62) == b"a" * 62


@ANY_SOURCE
async def test_unordered_deletes_in_one_iteration_and_breaks_the_order(r: Rig) -> None:
    broken_order = False
    writer = r.writer = await ChaosStorageWriter.start(r.source, r.storage,
                                                       config(flush_threshold_bytes=1),
                                                       max_chunk_bytes=64)
    for seed in range(8):
        writer.break_order(seed)
        c = r.container
        name = f"sc/un/{seed}"
        await c.create_segment(name)
        await c.append(name, b"x" * 10, [AttributeUpdate(1, UpdateType.REPLACE, seed)])
        r.storage.take()
        await r.writer.flush_once()
        ops = r.storage.take()
        if first(ops, name + "$attributes") < first(ops, name) or ops[-1][1] != JOURNAL:
            broken_order = True
        await c.delete(name)
        await r.writer.flush_once()
        assert ("delete", name) in r.storage.take()  # in the same iteration
    assert broken_order
    with pytest.raises(TypeError):  # the product's writer has PDP-40's order only
        StorageWriterConfig(flush_order="unordered")  # type: ignore[call-arg]


async def test_liveness_the_backlog_reaches_zero_once_appends_stop(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=1000, flush_threshold_ms=5000)
    r.writer.max_chunk_bytes = 4096
    names = [f"sc/l/{i}" for i in range(20)]
    for i, name in enumerate(names):
        await c.create_segment(name, SegmentType.TABLE if i % 5 == 0 else SegmentType.STREAM)
    for i, name in enumerate(names):
        if i % 5 == 0:
            await c.table_put(name, [(b"k%d" % j, b"v" * i, None) for j in range(i + 1)])
        else:
            await c.append(name, b"z" * (i * 100), [AttributeUpdate(i, UpdateType.REPLACE, i)])
    await c.truncate(names[3], 50)
    await c.delete(names[4])
    assert r.writer.backlog_bytes() > 0
    iterations = 0
    while r.writer.backlog_bytes() > 0 or r.storage.ops:
        r.storage.take()
        r.clock.now_ms += 1000  # each iteration a second after the last
        await r.writer.flush_once()
        iterations += 1
        assert iterations <= 8, "the backlog did not drain"
    assert iterations <= 7  # the time threshold (5 s) plus the two-step delete
    assert len(tier1_records(r)) == 1  # tier-1 holds the last checkpoint, nothing else
    for i, name in enumerate(names):
        if i == 4:
            continue
        info = await c.get_info(name)
        layout = await read_layout(r.storage, name)
        assert layout is not None and layout.length == info.length == info.storage_length
        data = await read_segment(r.storage, layout, info.start_offset,
                                  info.length - info.start_offset)
        assert data == (await c.read(name, info.start_offset, info.length)).data


# --- tier-1 truncation ----------------------------------------------------------------------


def tier1_records(r: Rig) -> list[Position]:
    return [address for address, _data in r.logs._logs["c0"].records]


async def test_tier1_is_truncated_and_a_reopen_reads_older_bytes_from_tier2(r: Rig) -> None:
    r.container_config = ContainerConfig(read_index_budget_bytes=500)  # evicts at once
    await r.reopen(config(flush_threshold_bytes=1))
    c = r.container
    stream, table, sealed, cut = USER, USER_TABLE, "sc/st/sealed", "sc/st/cut"
    for name in (stream, sealed, cut):
        await c.create_segment(name)
    await c.create_segment(table, SegmentType.TABLE)
    expected = {stream: b"", sealed: b"", cut: b""}
    for i in range(40):
        for name in expected:
            piece = bytes([65 + i % 26]) * (10 + i)
            await c.append(name, piece, [AttributeUpdate(i % 3, UpdateType.REPLACE, i)])
            expected[name] += piece
    await c.table_put(table, [(b"k%d" % i, b"v%d" % i, None) for i in range(30)])
    await c.tables.remove(table, [(b"k3", None)])
    await c.seal(sealed)
    await c.truncate(cut, 300)
    records_before = len(tier1_records(r))
    await r.writer.flush_once()
    assert r.writer.truncated_at is not None
    assert len(tier1_records(r)) < records_before / 10
    # acknowledged after the flush: only in tier-1
    await c.append(stream, b"tail")
    expected[stream] += b"tail"
    await c.tables.put(table, [(b"k30", b"late", None)])
    infos = {name: await c.get_info(name) for name in (*expected, table)}
    entries = await c.tables.iterate(table)
    await r.reopen()
    c = r.container
    reads_before = r.storage.reads
    for name, data in expected.items():
        info = await c.get_info(name)
        assert (info.length, info.start_offset, info.sealed, info.attributes) == (
            infos[name].length, infos[name].start_offset, infos[name].sealed,
            infos[name].attributes)
        got = b""
        while info.start_offset + len(got) < info.length:
            got += (await c.read(name, info.start_offset + len(got), 1 << 20)).data
        assert got == data[info.start_offset:]
    assert r.storage.reads > reads_before  # the evicted, truncated bytes came from tier-2
    assert await c.tables.iterate(table) == entries
    assert (await c.tables.get(table, [b"k3", b"k30"]))[1] is not None
    assert (await c.tables.get(table, [b"k3"]))[0] is None
    with pytest.raises(SegmentTruncatedError):
        await c.read(cut, 299, 1)
    # and it goes on: the writer flushes the tail, tier-1 is cut again
    await r.writer.flush_once()
    layout = await read_layout(r.storage, stream)
    assert layout is not None and layout.length == len(expected[stream])


async def test_merges_move_flushed_chunks_or_copy_the_rest(r: Rig) -> None:
    r.container_config = ContainerConfig(read_index_budget_bytes=100)  # evicts at once
    await r.reopen(config(flush_threshold_bytes=1))
    c = r.container
    target, flushed, unflushed = USER, USER + "#transaction.1", USER + "#transaction.2"
    for name in (target, flushed, unflushed):
        await c.create_segment(name)
    await c.append(target, b"T" * 50)
    await c.append(flushed, b"F" * 100)
    await r.writer.flush_once()  # all in tier-2, tier-1 truncated below them
    assert r.writer.truncated_at is not None
    source = await read_layout(r.storage, flushed)
    assert source is not None
    await c.merge(target, flushed)
    r.writer.config = config(flush_threshold_bytes=BIG)  # the merge alone makes it eligible
    await c.append(unflushed, b"U" * 30)
    await c.merge(target, unflushed)
    r.storage.take()
    await r.writer.flush_once()
    writes = [segment for kind, segment in r.storage.take() if kind == "write"]
    merged = await read_layout(r.storage, target)
    assert merged is not None and merged.length == 180
    assert {chunk.name for chunk in source.chunks} <= {chunk.name for chunk in merged.chunks}
    assert writes.count(target) == 1  # the 30 unflushed bytes copied, the 100 flushed not
    assert await read_segment(r.storage, merged, 0, 180) == b"T" * 50 + b"F" * 100 + b"U" * 30
    gone = await read_layout(r.storage, flushed)
    assert gone is not None and gone.deleted
    await r.writer.flush_once()
    await r.writer.flush_once()
    assert await read_segment(r.storage, merged, 0, 180) == b"T" * 50 + b"F" * 100 + b"U" * 30
    await r.reopen()
    assert (await r.container.read(target, 0, 180)).data == b"T" * 50 + b"F" * 100 + b"U" * 30


@ANY_SOURCE
async def test_small_chunks_are_concatenated_and_the_old_ones_deleted_a_cycle_later(r: Rig
                                                                                    ) -> None:
    c = r.container
    await c.create_segment(SYSTEM)  # flushed in every iteration
    expected = b""
    chunk_counts = []
    for round_ in range(30):
        piece = bytes([48 + round_ % 10]) * 3
        await c.append(SYSTEM, piece)
        expected += piece
        await r.writer.flush_once()
        layout = await read_layout(r.storage, SYSTEM)
        meta = await read_layout(r.storage, META)
        assert layout is not None and meta is not None
        for found in (layout, meta):  # bounded by bytes, not by iterations
            assert len(found.chunks) <= 2 * found.length // 64 + 8
        chunk_counts.append(len(layout.chunks))
        assert await read_segment(r.storage, layout, 0, layout.length) == expected
    assert max(chunk_counts) <= 8 and chunk_counts[-1] < 30
    assert any(kind == "delete" and segment == SYSTEM for kind, segment in r.storage.take())
    listed = [i.name for i in await r.storage.list_chunks(SYSTEM + ".E")]
    final = await read_layout(r.storage, SYSTEM)
    assert final is not None
    assert len(listed) <= len(final.chunks) + 8  # the replaced ones go a cycle later


async def test_a_fenced_owner_still_running_trips_nobody(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=1)
    await c.create_segment(USER)
    await c.append(USER, b"first;")
    await r.writer.flush_once()
    await c.append(USER, b"second;")  # acknowledged by the old owner, not flushed
    old_writer = r.writer
    old_epoch_chunks = {name for kind, name in r.storage.ops if kind == "write"}
    reader = await Tier2Reader.load(r.storage, 0)
    new = await SegmentContainer.open(0, r.logs.open("c0"), clock=r.clock,
                                      tier2_read=reader.read)  # fences the old owner
    r.opened.append(new)
    new_writer = await StorageWriter.start(ContainerWriterSource(new), r.storage,
                                           config(flush_threshold_bytes=1),
                                           max_chunk_bytes=64)
    with pytest.raises(ContainerFencedError):
        await old_writer.flush_once()  # writes its chunks, cannot record them
    await new.append(USER, b"third;")
    await new_writer.flush_once()
    with pytest.raises(ContainerFencedError):
        await old_writer.flush_once()
    assert await check(r.storage) == []
    layout = await read_layout(r.storage, USER)
    assert layout is not None
    assert await read_segment(r.storage, layout, 0, layout.length) == b"first;second;third;"
    written = {name for kind, name in r.storage.ops if kind == "write"}
    epochs = {parse_chunk_name(name)[1] for name in written - old_epoch_chunks
              if name.startswith(USER + ".E")}
    assert epochs == {old_writer.source.epoch, new.epoch}  # both wrote, by distinct names
    assert all(parse_chunk_name(chunk.name)[1] == old_writer.source.epoch
               for chunk in layout.chunks[:1])


# --- reopen, name reuse, the store ----------------------------------------------------------


async def test_reopen_keeps_layouts_and_never_reuses_a_chunk_name(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=1)
    await c.create_segment(USER)
    await c.append(USER, b"first", [AttributeUpdate(9, UpdateType.REPLACE, 1)])
    await r.writer.flush_once()
    written = {name for kind, name in r.storage.ops if kind == "write"}
    await r.reopen(config(flush_threshold_bytes=1))
    assert (await r.container.get_info(USER)).storage_length == 5
    await r.container.append(USER, b"-second")
    await r.writer.flush_once()
    again = {name for kind, name in r.storage.ops if kind == "write"}
    assert written.isdisjoint(again - written) and len(again) > len(written)
    layout = await read_layout(r.storage, USER)
    assert layout is not None
    assert await read_segment(r.storage, layout, 0, layout.length) == b"first-second"
    epochs = {parse_chunk_name(chunk.name)[1] for chunk in layout.chunks}
    assert len(epochs) == 2
    journals = await r.storage.list_chunks(JOURNAL)
    assert len(journals) == 1  # the older owner's snapshot was deleted


@ANY_SOURCE
async def test_a_name_deleted_and_created_again_starts_a_new_layout(r: Rig) -> None:
    c = r.container
    r.writer.config = config(flush_threshold_bytes=1)
    await c.create_segment(USER)
    await c.append(USER, b"old bytes")
    await r.writer.flush_once()
    await c.delete(USER)
    await c.create_segment(USER)
    await c.append(USER, b"new")
    await r.writer.flush_once()
    layout = await read_layout(r.storage, USER)
    assert layout is not None and not layout.deleted
    assert await read_segment(r.storage, layout, 0, layout.length) == b"new"
    await r.writer.flush_once()
    assert ("delete", USER) in r.storage.take()


async def test_segment_store_runs_a_writer_per_container(tmp_path: Path) -> None:
    logs = MemoryDataLogs()
    metadata = await open_store("memory://")
    uri = f"file://{tmp_path}/t2"
    store = await SegmentStore.open(
        None, [0, 1], uri, metadata_store=metadata, open_log=lambda i: logs.open(f"c{i}"),
        config=SegmentStoreConfig(container_count=2, storage_writer=StorageWriterConfig(
            flush_threshold_bytes=1, iteration_interval_ms=10)))
    try:
        names = [f"sc/s/{i}" for i in range(6)]
        for name in names:
            await store.create_segment(name)
            await store.append(name, name.encode() * 3)
        for writer in store.writers.values():
            writer.wake()
        assert store.tier2 is not None
        tier2 = store.tier2

        async def flushed(name: str) -> bool:
            layout = await read_layout(tier2, name)
            return layout is not None and layout.length == 3 * len(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not all([await flushed(name) for name in names]):
            assert loop.time() < deadline, "the writers did not flush"
            await asyncio.sleep(0.01)  # polling the condition, with a deadline
        assert sorted(store.writers) == [0, 1]
        assert all(w.failure is None for w in store.writers.values())
    finally:
        await store.close()
        await metadata.close()
    fresh = await open_chunk_storage(uri)
    try:
        for name in names:
            layout = await read_layout(fresh, name)
            assert layout is not None
            assert await read_segment(fresh, layout, 0, layout.length) == name.encode() * 3
    finally:
        await fresh.close()


# --- reading the records back, and their bytes ------------------------------------------


async def read_attributes(storage: ChunkStorage, segment: str) -> tuple[dict[int, int], int]:
    layout = await read_layout(storage, segment + "$attributes")
    assert layout is not None
    values: dict[int, int] = {}
    data_length = 0
    for batch in decode_attribute_batches(await read_segment(storage, layout, 0,
                                                             layout.length)):
        values.update(batch.values)
        data_length = batch.data_length
    return values, data_length


async def read_index(storage: ChunkStorage, table: str) -> tuple[dict[bytes, int], int]:
    layout = await read_layout(storage, table + "$index")
    assert layout is not None
    versions: dict[bytes, int] = {}
    indexed = 0
    for batch in decode_index_batches(await read_segment(storage, layout, 0, layout.length)):
        for key, version in batch.versions:
            if version < 0:
                versions.pop(key, None)
            else:
                versions[key] = version
        indexed = batch.indexed_length
    return versions, indexed


def test_record_golden_bytes() -> None:
    attributes = encode_attribute_batch({(1 << 64) | 2: -1}, 7)
    assert attributes.hex() == ("51415442" "00000001" "0000000000000001" "0000000000000002"
                                "ffffffffffffffff" "0000000000000007")
    assert decode_attribute_batches(attributes + attributes[:10]) == \
        [AttributeBatch((((1 << 64) | 2, -1),), 7)]
    index = encode_index_batch({b"k": 3, b"gone": -1}, 9)
    assert index.hex() == ("51495842" "00000002" "00000001" "6b" "0000000000000003"
                           "00000004" "676f6e65" "ffffffffffffffff" "0000000000000009")
    assert decode_index_batches(index + index[:-1]) == \
        [IndexBatch(((b"k", 3), (b"gone", -1)), 9)]
    snapshot = JournalSnapshot(2, 5, (SegmentLayout("a"),))
    journal = encode_journal(snapshot)
    assert journal[:21].hex() == "514a5353" "01" "00000002" "0000000000000005" "00000001"
    assert decode_journal(journal) == snapshot
    for cut in range(len(journal)):
        with pytest.raises(CorruptRecordError):
            decode_journal(journal[:cut])
    with pytest.raises(CorruptRecordError):
        decode_attribute_batches(index)


@ANY_SOURCE
async def test_the_background_loop_starts_early_once_a_segment_is_well_past_the_threshold(
        r: Rig) -> None:
    """With a minute between iterations, a segment 1.5x past the size
    threshold is flushed within seconds (the loop polls for it); one just
    past the threshold waits for the interval."""
    r.writer.config = config(flush_threshold_bytes=100, iteration_interval_ms=60_000)
    c = r.container
    await c.create_segment(USER)
    await c.create_segment(USER_TABLE)
    task = asyncio.ensure_future(r.writer.run())
    try:
        async def flushed(name: str, length: int) -> bool:
            layout = r.writer.layouts.get(name)
            return layout is not None and layout.length == length
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while r.writer.iterations < 1:  # the first iteration runs at once
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        await c.append(USER_TABLE, b"t" * 120)  # past 1x, not 1.5x: waits
        await c.append(USER, b"u" * 160)  # past 1.5x
        while r.writer.iterations < 2:
            assert loop.time() < deadline, "no iteration before the interval's end"
            await asyncio.sleep(0.01)
        assert await flushed(USER, 160) and await flushed(USER_TABLE, 120)  # both in it
        await asyncio.sleep(0.3)  # polling rounds pass: nothing is past 1.5x now
        assert r.writer.iterations == 2 and r.writer.failure is None
    finally:
        task.cancel()
        await asyncio.wait([task])
