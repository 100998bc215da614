"""Append times and chunk sidecars: the container's append-time index
(:mod:`quire.segmentstore.append_times`), the chunks' sidecars the storage
writer writes beside a stream segment's chunks
(:mod:`quire.segmentstore.chunk_sidecars`, :mod:`quire.segmentstore.sidecar_writer`),
the times a container answers for bytes in memory and in tier-2 alike,
across a reopen, a concatenation and a merge, and ``quire tier2 check``'s
view of the sidecars.  One container on the in-memory tier-1 twin, a
manual clock, memory:// tier-2, 64-byte chunks."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE
from quire.segmentstore import ContainerConfig, SegmentContainer, SegmentType
from quire.segmentstore.append_times import AppendTimes
from quire.segmentstore.chunk_sidecars import (
    UNKNOWN,
    Sidecar,
    entries_for,
    has_sidecars,
    read_sidecar,
    sidecar_name,
)
from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.operations import MergeOp, SegmentMapOp, TruncateOp
from quire.segmentstore.sidecar_writer import EventWalk, SidecarWriter
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import Tier2Reader, read_layout
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from quire.testing.memory_writer_source import MemoryWriterSource
from quire.tier2 import ChunkStorage, SegmentLayout, open_chunk_storage

SEGMENT = "sc/st/0.#epoch.0"
T0 = 1_000_000


def event(payload: bytes) -> bytes:
    return EVENT_HEADER.pack(EVENT_TYPE, len(payload)) + payload


# --- the index -------------------------------------------------------------------------


def test_the_index_keeps_a_step_per_new_time_and_never_goes_back() -> None:
    times = AppendTimes()
    times.note(1, 0, 100)
    times.note(1, 10, 100)  # the same time: no entry
    times.note(1, 20, 105)
    times.note(1, 30, 103)  # a clock stepping back repeats the last time
    times.note(1, 40, 110)
    times.note(1, 40, 111)  # nothing was appended at 110 after all
    assert times.between(1, 0, 100) == [(0, 100), (20, 105), (40, 111)]
    assert times.between(1, 25, 45) == [(25, 105), (40, 111)]
    assert times.locate(1, 104) == 20 and times.locate(1, 111) == 40
    assert times.locate(1, 112) is None
    times.flushed(1, 30)  # tier-2 holds what is below 30: keep the step in effect there
    assert times.first(1) == (20, 105)
    assert times.between(1, 0, 100) == [(20, 105), (40, 111)]  # below 20: tier-2's


def test_operations_other_than_appends_stamp_the_segment_length() -> None:
    times = AppendTimes()
    segments = {1: SegmentMetadata(1, SEGMENT, SegmentType.STREAM),
                2: SegmentMetadata(2, SEGMENT + "#transaction.1", SegmentType.STREAM),
                3: SegmentMetadata(3, "sc/kv/0", SegmentType.TABLE)}
    times.apply(SegmentMapOp(1, 50, 1, SEGMENT, SegmentType.STREAM), segments)
    times.apply(SegmentMapOp(2, 50, 3, "sc/kv/0", SegmentType.TABLE), segments)
    times.note(1, 0, 60)  # the first append, at the creation's offset
    segments[1].length = 40
    times.apply(MergeOp(3, 70, 1, 2, 40, 25), segments)  # a transaction committed
    segments[1].length = 65
    assert times.between(1, 0, 65) == [(0, 60), (40, 70)]
    assert times.between(3, 0, 10) == []  # tables have no times
    times.apply(TruncateOp(4, 80, 1, 50), segments)
    assert times.between(1, 50, 65) == [(50, 70)]
    seeded = AppendTimes()
    segments[1].last_modified_ms = 90
    seeded.seed(segments.values())
    assert seeded.between(1, 0, 100) == [(65, 90)]


# --- the sidecar codec and the event walk -------------------------------------------------


def test_sidecar_round_trip_and_its_rules() -> None:
    sidecar = entries_for(64, [(100, 5), (110, 7), (130, 7), (150, 9), (170, 11)], 100,
                          3, 70)
    assert sidecar == Sidecar(64, 3, 70, (0, 10, 50), (5, 7, 9))
    assert Sidecar.decode(sidecar.encode()) == sidecar
    assert sidecar.time_at(49) == 7 and (sidecar.min_time, sidecar.max_time) == (5, 9)
    assert entries_for(64, [(120, 5)], 100, UNKNOWN, UNKNOWN).times == (UNKNOWN, 5)
    assert Sidecar(64, offsets=(0, 70), times=(1, 2)).problem() == "an entry past the chunk's end"
    assert Sidecar(64, offsets=(0, 8), times=(3, 2)).problem() == "append times go back"
    assert not has_sidecars(SEGMENT + "#transaction.1", SegmentType.STREAM)
    assert not has_sidecars("_system/_tables/sc/0.#epoch.0", SegmentType.STREAM)
    assert not has_sidecars("sc/_SPARKst/0.#epoch.0", SegmentType.TABLE)


def test_the_walk_finds_event_starts_across_any_cut() -> None:
    events = [event(b"x" * n) for n in (0, 3, 20, 1, 9, 40, 2)]
    data = b"".join(events)
    starts = list(itertools.accumulate((len(e) for e in events[:-1]), initial=0))
    for cuts in [(5,), (3, 4, 9), (8, 16, 17, 18), tuple(range(1, len(data)))]:
        walk = EventWalk(0, 0)
        at = 0
        for end in (*cuts, len(data)):
            first = walk.feed(at, data[at:end])
            expected = min((s for s in starts if s >= at), default=len(data))
            if first is not None:
                assert first == expected, (cuts, at)
            else:  # only while a header is still cut short
                assert end - at < EVENT_HEADER.size
            at = end
        assert walk.next == len(data)
    broken = EventWalk(0, 0)
    assert broken.feed(0, b"\0\0\0\1" + b"\0" * 12) == 0 and broken.next is None


async def test_a_segment_deleted_while_its_chunk_is_written_still_gets_the_sidecar() -> None:
    """Regression (the stream simulation, seed 100344): the writer read a
    segment's bytes, the segment was deleted while tier-2 was slow to take
    the chunk, and the chunk was recorded with no sidecar (the writer
    looked the segment up by name, which a deleted one no longer has):
    ``quire tier2 check`` flagged the layout until the deletion was flushed."""
    source = MemoryWriterSource()
    await source.create_segment(SEGMENT)
    data = event(b"abc") + event(b"de")
    await source.append(SEGMENT, data)
    segment_id = source.metadata.by_name[SEGMENT]
    await source.delete(SEGMENT)
    assert source.segment(SEGMENT) is None
    storage = await open_chunk_storage(f"memory://{uuid.uuid4()}")
    writer = SidecarWriter(storage, source)
    layout = SegmentLayout(SEGMENT, (), 0, 0)
    await storage.write_chunk("sc/st/0.#epoch.0.E1.1", data)
    await writer.chunk_written(layout, "sc/st/0.#epoch.0.E1.1", data, segment_id)
    sidecar = await read_sidecar(storage, "sc/st/0.#epoch.0.E1.1")
    assert sidecar is not None and sidecar.chunk_length == len(data)
    assert (sidecar.first_event, sidecar.next_event) == (0, len(data))


# --- a container and its writer -------------------------------------------------------------


@dataclass
class Rig:
    logs: MemoryDataLogs
    storage: ChunkStorage
    clock: ManualClock
    container: SegmentContainer
    writer: StorageWriter

    async def reopen(self) -> None:
        await self.container.close()
        reader = await Tier2Reader.load(self.storage, 0)
        self.container = await SegmentContainer.open(
            0, self.logs.open("c0"), ContainerConfig(read_index_budget_bytes=100),
            clock=self.clock, tier2_read=reader.read)
        self.writer = await StorageWriter.start(ContainerWriterSource(self.container),
                                                self.storage, self.writer.config,
                                                max_chunk_bytes=64)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    storage = await open_chunk_storage(f"memory://append-times-{uuid.uuid4().hex}")
    logs = MemoryDataLogs()
    clock = ManualClock(T0)
    container = await SegmentContainer.open(0, logs.open("c0"), clock=clock)
    writer = await StorageWriter.start(
        ContainerWriterSource(container), storage,
        StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=1 << 40),
        max_chunk_bytes=64)
    r = Rig(logs, storage, clock, container, writer)
    yield r
    await r.container.close()
    await storage.close()


async def write(r: Rig, name: str, sizes: list[int], step_ms: int = 0
                ) -> list[tuple[int, int]]:
    """Append one event of each size, the clock moving ``step_ms`` before
    each; (offset, time) of each append."""
    stamped = []
    for n, size in enumerate(sizes):
        r.clock.advance(step_ms)
        offset = (await r.container.get_info(name)).length
        await r.container.append(name, event(bytes([65 + n % 26]) * size))
        stamped.append((offset, r.clock.wall_ms()))
    return stamped


async def sidecars(r: Rig, layout: SegmentLayout) -> list[Sidecar]:
    found = [await read_sidecar(r.storage, c.name) for c in layout.chunks]
    assert all(s is not None for s in found)
    return [s for s in found if s is not None]


def expected_entries(stamped: list[tuple[int, int]], start: int, end: int
                     ) -> list[tuple[int, int]]:
    in_effect = [(o, t) for o, t in stamped if o <= start][-1:]
    found = [(start, t) for _o, t in in_effect]
    for offset, time_ms in stamped:
        if start < offset < end and (not found or found[-1][1] != time_ms):
            found.append((offset, time_ms))
    return found


async def test_every_chunk_gets_a_sidecar_with_its_event_starts_and_times(rig: Rig) -> None:
    r = rig
    await r.container.create_segment(SEGMENT, SegmentType.STREAM)
    stamped = await write(r, SEGMENT, [5, 40, 100, 3, 3, 70, 12], step_ms=7)
    await r.writer.flush_once()
    layout = await read_layout(r.storage, SEGMENT)
    assert layout is not None and len(layout.chunks) == 5
    starts = [o for o, _ in stamped]
    for chunk, sidecar in zip(layout.chunks, await sidecars(r, layout), strict=True):
        assert sidecar.chunk_length == chunk.length
        first = min((s for s in starts if s >= chunk.offset), default=layout.length)
        assert chunk.offset + sidecar.first_event == first
        following = min((s for s in starts if s >= chunk.end), default=layout.length)
        assert sidecar.next_event == UNKNOWN or chunk.offset + sidecar.next_event >= following \
            or chunk.offset + sidecar.next_event in starts
        assert [(chunk.offset + o, t) for o, t in zip(sidecar.offsets, sidecar.times,
                                                      strict=True)] \
            == expected_entries(stamped, chunk.offset, chunk.end)
    assert await check(r.storage) == []
    # the container answers the same for every range, now from tier-2 alone
    assert await r.container.append_times(SEGMENT, 0, layout.length) \
        == expected_entries(stamped, 0, layout.length)
    assert await r.container.append_times(SEGMENT, 50, 120) == expected_entries(stamped, 50, 120)
    for offset, time_ms in stamped:
        assert await r.container.locate_append_time(SEGMENT, time_ms) == offset
        assert await r.container.locate_append_time(SEGMENT, time_ms - 3) == offset
    assert await r.container.locate_append_time(SEGMENT, stamped[-1][1] + 1) == layout.length


async def test_times_span_memory_and_tier2_and_survive_a_reopen(rig: Rig) -> None:
    r = rig
    await r.container.create_segment(SEGMENT, SegmentType.STREAM)
    stamped = await write(r, SEGMENT, [30, 30, 30], step_ms=10)
    await r.writer.flush_once()
    stamped += await write(r, SEGMENT, [20, 20], step_ms=10)  # in memory only
    length = (await r.container.get_info(SEGMENT)).length
    assert await r.container.append_times(SEGMENT, 0, length) \
        == expected_entries(stamped, 0, length)
    assert await r.container.locate_append_time(SEGMENT, stamped[1][1]) == stamped[1][0]
    assert await r.container.locate_append_time(SEGMENT, stamped[4][1]) == stamped[4][0]
    await r.reopen()  # the unflushed appends are replayed with their times
    assert await r.container.append_times(SEGMENT, 0, length) \
        == expected_entries(stamped, 0, length)
    stamped += await write(r, SEGMENT, [10], step_ms=0)  # the same ms as the replayed last
    stamped[-1] = (stamped[-1][0], stamped[-2][1])
    await r.writer.flush_once()
    length = (await r.container.get_info(SEGMENT)).length
    layout = await read_layout(r.storage, SEGMENT)
    assert layout is not None and layout.length == length
    assert await r.container.append_times(SEGMENT, 0, length) \
        == expected_entries(stamped, 0, length)
    assert await check(r.storage) == []


async def test_times_never_go_back_across_owners_whose_clocks_disagree(rig: Rig) -> None:
    """An owner whose clock is ahead writes; the next owner's clock is
    behind: its appends repeat the last time, in the log itself, so that a
    third owner, replaying only what tier-1 keeps after the flushes, sees
    the same times (and tier-2's chunks never go back in time)."""
    r = rig
    await r.container.create_segment(SEGMENT, SegmentType.STREAM)
    r.clock.advance(20_000)  # this owner's clock runs ahead
    ahead = await write(r, SEGMENT, [30, 30], step_ms=5)
    await r.writer.flush_once()
    r.clock.advance(-20_000)  # the next owner's runs behind it
    await r.reopen()
    await write(r, SEGMENT, [30, 30], step_ms=5)
    last = ahead[-1][1]
    assert (await r.container.get_info(SEGMENT)).last_modified_ms == last
    await r.writer.flush_once()  # tier-1 is cut below what the first owner wrote
    await r.reopen()
    await write(r, SEGMENT, [30, 30], step_ms=5)
    await r.writer.flush_once()
    length = (await r.container.get_info(SEGMENT)).length
    times = [t for _o, t in await r.container.append_times(SEGMENT, 0, length)]
    assert times == sorted(times) and times[-1] == last
    assert await check(r.storage) == []


async def test_concatenated_chunks_and_merged_transactions_keep_their_sidecars(
        rig: Rig) -> None:
    r = rig
    await r.container.create_segment(SEGMENT, SegmentType.STREAM)
    stamped: list[tuple[int, int]] = []
    for _round in range(10):  # small flushes: the trailing chunks get concatenated
        stamped += await write(r, SEGMENT, [0], step_ms=5)  # 8 bytes: 8 fit one chunk
        await r.writer.flush_once()
    layout = await read_layout(r.storage, SEGMENT)
    assert layout is not None and len(layout.chunks) < 10
    assert await r.container.append_times(SEGMENT, 0, layout.length) \
        == expected_entries(stamped, 0, layout.length)
    # a transaction flushed whole, then merged: its chunks join the segment
    txn = SEGMENT + "#transaction.00000000000000000000000000000001"
    await r.container.create_segment(txn, SegmentType.STREAM)
    await write(r, txn, [50, 50], step_ms=5)
    await r.writer.flush_once()
    assert await read_sidecar(r.storage, (await read_layout(r.storage, txn)).chunks[0].name) \
        is None  # a transaction's chunks have none of their own
    r.clock.advance(100)
    before = (await r.container.get_info(SEGMENT)).length
    await r.container.merge(SEGMENT, txn)
    stamped.append((before, r.clock.wall_ms()))
    stamped += await write(r, SEGMENT, [6], step_ms=5)
    await r.writer.flush_once()
    await r.writer.flush_once()  # the replaced chunks go a cycle later
    layout = await read_layout(r.storage, SEGMENT)
    assert layout is not None
    assert await r.container.append_times(SEGMENT, 0, layout.length) \
        == expected_entries(stamped, 0, layout.length)
    found = await sidecars(r, layout)
    joined = [s for c, s in zip(layout.chunks, found, strict=True) if c.offset >= before]
    assert joined[0].first_event == 0 and joined[0].times == (stamped[-2][1],)
    assert await check(r.storage) == []
    # a missing sidecar is a violation; deleting the segment deletes them all
    victim = layout.chunks[-1].name
    await r.storage.delete(sidecar_name(victim))
    [violation] = await check(r.storage)
    assert "has no sidecar" in violation.reason
    await r.container.delete(SEGMENT)
    await r.writer.flush_once()
    await r.writer.flush_once()
    left = [i.name for i in await r.storage.list_chunks("sc/st/")]
    assert left == []
