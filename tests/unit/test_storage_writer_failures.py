"""The storage writer never gives up silently, and keeps what it records bounded.

A container on the in-memory tier-1 twin flushes to memory:// tier-2
through :class:`~tests.support.faulty_storage.FaultyStorage`: a flush that
fails N times and then succeeds leaves nothing stuck (every byte in tier-2,
tier-1 truncated, no orphan chunk, the check clean), each cause said once
and counted; a segment tier-2 refuses for good is quarantined (sealed,
appends refused with a typed error, its bytes in tier-2 under its
quarantine path) while the rest keeps flushing; a refusal of everything
quarantines nothing; past the tier-1 ceiling acknowledgements wait for
tier-2 instead of failing; deleted segments leave the storage-metadata
table and the container; ``$index`` and ``$attributes`` stay bounded; and
merging small chunks writes each byte well under 1.5 times.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from quire.errors import SegmentQuarantinedError
from quire.segmentstore import AttributeUpdate, ContainerConfig, SegmentContainer, SegmentType
from quire.segmentstore.chunk_sidecars import SIDECAR_SUFFIX
from quire.segmentstore.flush_plan import MERGE_FANOUT, small_chunk_bytes
from quire.segmentstore.segment_flush import IterationReport
from quire.segmentstore.storage_writer import StorageWriter, StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import (
    Tier2Reader,
    journal_name,
    read_journal,
    read_records,
    storage_metadata_name,
)
from quire.segmentstore.types import UpdateType
from quire.segmentstore.writer_source import ContainerWriterSource
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import chunk_path, open_chunk_storage, read_segment
from tests.support.faulty_storage import FaultyStorage

FAST = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                           iteration_interval_ms=5, retry_initial_ms=5, retry_max_ms=40)
USER, OTHER, TABLE = "sc/st/0.#epoch.0", "sc/st/1.#epoch.0", "sc/kv/0.#epoch.0"


@dataclass
class Rig:
    logs: MemoryDataLogs
    storage: FaultyStorage
    container: SegmentContainer
    writer: StorageWriter
    task: asyncio.Task[None] | None = None
    config: ContainerConfig = field(default_factory=ContainerConfig)

    def run(self) -> None:
        self.task = asyncio.ensure_future(self.writer.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.wait([self.task])
            self.task = None

    async def reopen(self) -> None:
        await self.stop()
        await self.container.close()
        await self.open()

    async def open(self) -> None:
        reader = await Tier2Reader.load(self.storage, 0)
        self.container = await SegmentContainer.open(0, self.logs.open("c0"), self.config,
                                                     tier2_read=reader.read)
        self.writer = await StorageWriter.start(ContainerWriterSource(self.container),
                                                self.storage, FAST, max_chunk_bytes=4096)


@pytest.fixture
async def rig() -> AsyncIterator[Callable[..., asyncio.Future[Rig]]]:
    made: list[Rig] = []

    async def make(config: ContainerConfig | None = None, max_chunk_bytes: int = 4096) -> Rig:
        config = config or ContainerConfig()
        storage = FaultyStorage(await open_chunk_storage(f"memory://{uuid.uuid4().hex}"))
        logs = MemoryDataLogs()
        reader = await Tier2Reader.load(storage, 0)
        container = await SegmentContainer.open(0, logs.open("c0"), config,
                                                tier2_read=reader.read)
        writer = await StorageWriter.start(ContainerWriterSource(container), storage, FAST,
                                           max_chunk_bytes=max_chunk_bytes)
        made.append(Rig(logs, storage, container, writer, config=config))
        return made[-1]
    yield lambda *a, **kw: asyncio.ensure_future(make(*a, **kw))
    for r in made:
        await r.stop()
        await r.container.close()
        await r.storage.close()


async def until(condition: Callable[[], object], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)  # polling the writer's progress, with a deadline


async def settled(r: Rig) -> None:
    """Every byte in tier-2 and two more whole iterations after it."""
    await until(lambda: r.writer.backlog_bytes() == 0 and r.writer.health.degraded is None)
    done = r.writer.iterations + 2
    await until(lambda: r.writer.iterations >= done)


async def orphans(r: Rig) -> list[str]:
    """Chunks in tier-2 that no record names (a sidecar counts as its chunk)."""
    records = await read_records(r.storage, 0)
    named = {c.name for layout in records.layouts.values() for c in layout.chunks}
    return [info.name for info in await r.storage.list_chunks("")
            if info.name.removesuffix(SIDECAR_SUFFIX) not in named
            and not info.name.startswith(journal_name(0))]


async def test_a_flush_failing_n_times_then_succeeding_leaves_nothing_stuck(
        rig: Callable[..., asyncio.Future[Rig]], caplog: pytest.LogCaptureFixture) -> None:
    r = await rig()
    await r.container.create_segment(USER)
    await r.container.create_segment(TABLE, SegmentType.TABLE)
    r.run()
    await settled(r)
    truncated_before = r.writer.truncated_at
    r.storage.fail_writes = 7
    acknowledged = b""
    for i in range(20):
        piece = b"%03d;" % i * 50
        await r.container.append(USER, piece, [AttributeUpdate(9, UpdateType.REPLACE, i)])
        await r.container.tables.put(TABLE, [(b"k%d" % (i % 3), piece[:10], None)])
        acknowledged += piece
    with caplog.at_level(logging.WARNING, "quire.segmentstore.storage_writer"):
        await settled(r)
    attempts = r.writer.health.counts["Tier2Error"]  # failed attempts (writes fail together)
    assert r.storage.failures == 7 and 1 <= attempts <= 7
    said = [rec for rec in caplog.records if "flush failed" in rec.getMessage()]
    assert 1 <= len(said) <= attempts  # once per cause, segment and step; not once per retry
    assert len({rec.getMessage().split(": Tier2Error")[0] for rec in said}) == len(said)
    assert any("resumed" in rec.getMessage() for rec in caplog.records)
    assert r.writer.truncated_at is not None and r.writer.truncated_at != truncated_before
    assert await check(r.storage) == [] and await orphans(r) == []
    layout = (await read_records(r.storage, 0)).layouts[USER]
    assert await read_segment(r.storage, layout, 0, layout.length) == acknowledged
    await r.reopen()  # from tier-2 and what tier-1 still holds
    assert (await r.container.read(USER, 0, 1 << 20)).data == acknowledged
    assert (await r.container.get_attributes(USER, [9])) == {9: 19}


async def test_a_refused_segment_is_quarantined_and_the_rest_keeps_flushing(
        rig: Callable[..., asyncio.Future[Rig]]) -> None:
    r = await rig()
    for name in (USER, OTHER):
        await r.container.create_segment(name)
        await r.container.append(name, b"before;" * 20)
    r.run()
    await settled(r)
    r.storage.refuse_prefixes = [chunk_path(USER)]
    await r.container.append(USER, b"refused;" * 20)
    await until(lambda: USER in r.writer.quarantine.quarantined)
    with pytest.raises(SegmentQuarantinedError, match="quarantined"):
        await r.container.append(USER, b"after")
    for i in range(5):
        await r.container.append(OTHER, b"other %d;" % i * 30)
    await settled(r)
    info = await r.container.get_info(USER)
    assert info.sealed and info.length == len(b"before;" * 20 + b"refused;" * 20)
    records = await read_records(r.storage, 0)
    assert records.layouts[USER].sealed and records.layouts[USER].length == info.length
    assert records.layouts[OTHER].length == (await r.container.get_info(OTHER)).length
    assert await check(r.storage) == []
    await r.reopen()
    with pytest.raises(SegmentQuarantinedError):
        await r.container.append(USER, b"after")
    assert USER in r.writer.quarantine.quarantined  # found again from its attribute
    assert (await r.container.read(USER, 0, 1 << 20)).data == b"before;" * 20 + b"refused;" * 20


async def test_tier2_refusing_everything_quarantines_nothing(
        rig: Callable[..., asyncio.Future[Rig]]) -> None:
    r = await rig()
    await r.container.create_segment(USER)
    r.run()
    await settled(r)
    r.storage.refuse_all = True
    await r.container.append(USER, b"x" * 100)
    await until(lambda: r.writer.health.degraded is not None
                and r.writer.health.degraded.failures >= 6)
    assert r.writer.quarantine.quarantined == {}
    assert r.writer.health.status().startswith("degraded: tier-2 unavailable since ")
    assert r.writer.health.as_json()["cause"] == "Tier2RefusedError"
    r.storage.refuse_all = False
    await settled(r)
    assert not (await r.container.get_info(USER)).sealed


async def test_past_the_tier1_ceiling_acks_wait_for_tier2_and_never_fail(
        rig: Callable[..., asyncio.Future[Rig]]) -> None:
    r = await rig(ContainerConfig(tier1_ceiling_bytes=64 << 10))
    await r.container.create_segment(USER)
    r.run()
    await settled(r)
    r.storage.hold()  # tier-2 hangs
    acked = 0
    while not r.container.throttle.throttled:  # acknowledged at once up to the ceiling
        await r.container.append(USER, b"p" * 1000)
        acked += 1
    assert acked * 1000 >= (64 << 10) // 2 and r.container.throttle.pressure
    pending = [r.container.append(USER, b"q" * 1000) for _ in range(50)]
    await r.container.barrier()  # every one of them durable in tier-1
    assert not any(f.done() for f in pending)  # and not acknowledged: held
    assert r.container.committed_side.tier1_bytes > 64 << 10
    r.storage.release()
    results = await asyncio.gather(*pending)
    assert [x.length for x in results] == [1000 * (acked + i + 1) for i in range(50)]
    await until(lambda: not r.container.throttle.throttled)
    assert r.container.throttle.held_total == 50


async def test_deleted_segments_leave_the_table_and_the_container(
        rig: Callable[..., asyncio.Future[Rig]]) -> None:
    r = await rig()
    r.run()
    for round_ in range(30):
        name = f"sc/churn/{round_}.#epoch.0"
        await r.container.create_segment(name)
        await r.container.append(name, b"c" * 300, [AttributeUpdate(1, UpdateType.REPLACE, 1)])
        if round_ % 3 == 0:
            table = f"sc/churn-kv/{round_}.#epoch.0"
            await r.container.create_segment(table, SegmentType.TABLE)
            await r.container.tables.put(table, [(b"k", b"v", None)])
            await settled(r)
            await r.container.delete(table)
        await settled(r)
        await r.container.delete(name)
    await settled(r)
    await settled(r)
    records = await read_records(r.storage, 0)
    assert not [n for n in records.layouts if "churn" in n]
    assert not [s for s in r.container.committed.segments.values() if s.deleted]
    assert not [s for s in r.container.accepted.segments.values() if s.deleted]
    assert await check(r.storage) == [] and await orphans(r) == []
    meta = r.container.committed.get(storage_metadata_name(0))
    assert meta is not None
    assert len(r.container.tables.committed[meta.segment_id].entries) == 0


async def test_index_and_attributes_stay_bounded(rig: Callable[..., asyncio.Future[Rig]]
                                                 ) -> None:
    r = await rig()
    await r.container.create_segment(USER)
    await r.container.create_segment(TABLE, SegmentType.TABLE)
    report = IterationReport()
    sizes = []
    for round_ in range(400):
        await r.container.append(USER, b"a", [AttributeUpdate(k, UpdateType.REPLACE, round_)
                                              for k in range(1, 21)])
        await r.container.tables.put(TABLE, [(b"key%02d" % k, b"%d" % round_, None)
                                             for k in range(20)])
        report = await r.writer.flush_once()
        layouts = r.writer.layouts
        sizes.append([layouts[n].length - layouts[n].start_offset
                      for n in (TABLE + "$index", USER + "$attributes")])
    assert report.bytes_written > 0
    whole_index, whole_attributes = 16 + 20 * 17, 16 + 20 * 24
    assert max(s[0] for s in sizes) <= (64 << 10) + 2 * whole_index
    assert max(s[1] for s in sizes) <= (64 << 10) + 2 * whole_attributes
    assert sizes[-1][0] < sizes[200][0] + (64 << 10)  # it does not grow with the rounds
    assert await check(r.storage) == []
    journal = await read_journal(r.storage, 0)
    assert journal is not None and sum(len(x.chunks) for x in journal.layouts) < 100


async def test_merging_small_chunks_writes_each_byte_under_one_and_a_half_times(
        rig: Callable[..., asyncio.Future[Rig]]) -> None:
    r = await rig(max_chunk_bytes=16 << 20)
    await r.container.create_segment(USER)
    piece = b"m" * (256 << 10)
    for _ in range(160):  # 40 MiB, flushed 256 KiB at a time
        await r.container.append(USER, piece)
        await r.writer.flush_once()
    layout = r.writer.layouts[USER]
    assert layout.length == 160 * len(piece)
    assert r.storage.written[chunk_path(USER)] / layout.length < 1.5
    # a segment flushed a few bytes at a time ends in few chunks all the same
    await r.container.create_segment(OTHER)
    for _ in range(300):
        await r.container.append(OTHER, b"t" * 100)
        await r.writer.flush_once()
    small = small_chunk_bytes(16 << 20)
    other = r.writer.layouts[OTHER]
    assert len(other.chunks) <= MERGE_FANOUT + small.bit_length()
    assert r.storage.written[chunk_path(OTHER)] / other.length < small.bit_length()
    assert await read_segment(r.storage, other, 0, other.length) == b"t" * 30000
