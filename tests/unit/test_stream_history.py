"""quire.history: a stream's history read from tier-2 alone.  An in-process
segment store (two containers on the in-memory tier-1 twin, a manual clock,
memory:// tier-2, a flush every ten appends) and a controller write a stream
across a scale; both are closed, then the history is read back by cuts, by
times and in splits, and DuckDB reads it too."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import duckdb
import pytest

from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.history import StreamDataset, list_streams, plan, read_stream
from quire.metadata import open_store
from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.streams import ControllerClient
from quire.streams.model import segment_name
from quire.testing.clock import ManualClock
from quire.testing.memory_data_log import MemoryDataLogs
from quire.tier2 import Tier2Config, open_chunk_storage

T0 = 1_700_000_000_000
SCOPE, STREAM = "hs", "events"


@dataclass
class Written:
    uri: str
    events: list[tuple[int, int, bytes, int]]
    """(segment id, offset, payload, append time ms), in append order."""
    first: list[int]
    """The segment ids of the first epoch."""
    successors: list[int]


async def flush(store: SegmentStore) -> None:
    for _round in range(2):  # a merge's and a seal's records settle in the second
        for writer in store.writers.values():
            await writer.flush_once()


@pytest.fixture
async def written() -> AsyncIterator[Written]:
    uri = f"memory://history-{uuid.uuid4().hex}"
    clock = ManualClock(T0)
    metadata = await open_store(f"memory://history-meta-{uuid.uuid4().hex}")
    store = await SegmentStore.open(
        None, range(2), Tier2Config(uri, max_chunk_bytes=4096), metadata_store=metadata,
        open_log=MemoryDataLogs().open,
        config=SegmentStoreConfig(container_count=2, storage_writer=StorageWriterConfig(
            flush_threshold_bytes=1, iteration_interval_ms=3_600_000)),
        clock=clock)
    controller = Controller(store, ControllerConfig(), fixed_locator(("h", 1)), clock)
    port = await controller.start("127.0.0.1", 0)
    client = ControllerClient(f"tcp://127.0.0.1:{port}")
    events: list[tuple[int, int, bytes, int]] = []

    async def append(sid: int, n: int) -> None:
        clock.advance(10)
        payload = b"event-%04d" % n + b"." * (n % 37)
        name = segment_name(SCOPE, STREAM, sid)
        offset = (await store.get_info(name)).length
        await store.append(name, EVENT_HEADER.pack(EVENT_TYPE, len(payload)) + payload)
        events.append((sid, offset, payload, clock.wall_ms()))
        if len(events) % 10 == 0:
            await flush(store)  # small chunks, each with its sidecar

    try:
        await client.create_scope(SCOPE)
        await client.create_stream(SCOPE, STREAM, 2)
        first = sorted(s.id for s in await client.current_segments(SCOPE, STREAM))
        for n in range(60):
            await append(first[n % 2], n)
        await flush(store)
        sealed = (await client.current_segments(SCOPE, STREAM))[0]
        epoch = await client.scale(SCOPE, STREAM, [sealed.id],
                                   [(sealed.min_key, 0.25), (0.25, sealed.max_key)])
        async with asyncio.timeout(10):
            while not await client.scale_done(SCOPE, STREAM, epoch):
                await asyncio.sleep(0.01)
        successors = sorted(s.id for s in await client.current_segments(SCOPE, STREAM)
                            if s.id not in first)
        for n in range(60, 120):
            await append([*successors, first[1]][n % 3], n)
        await flush(store)
        storage = await open_chunk_storage(uri)
        assert await check(storage) == []
    finally:
        await client.close()
        await controller.close()
        await store.close()  # nothing of the cluster runs from here on
    yield Written(uri, events, first, successors)


def rows(batches: object) -> list[tuple[int, int, bytes, int]]:
    found = []
    for batch in batches:  # type: ignore[attr-defined]
        for row in batch.to_pylist():
            assert (row["scope"], row["stream"]) == (SCOPE, STREAM)
            stamp = row["timestamp"]
            found.append((row["segment_id"], row["offset"], row["event"],
                          int(stamp.timestamp() * 1000)))
    return found


def by_segment(events: list[tuple[int, int, bytes, int]]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for e in events:
        out.setdefault(e[0], []).append(e)
    return out


def test_the_whole_history_with_append_times_in_reading_order(written: Written) -> None:
    got = rows(read_stream(written.uri, SCOPE, STREAM))
    assert by_segment(got) == by_segment(written.events)
    order = [sid for sid, *_ in got]
    sealed = written.first[0]
    # the sealed segment is read whole before its successors
    last_sealed = max(i for i, sid in enumerate(order) if sid == sealed)
    assert all(i > last_sealed for i, sid in enumerate(order) if sid in written.successors)
    for events in by_segment(got).values():  # times never go back within a segment
        assert all(a[3] <= b[3] for a, b in itertools.pairwise(events))
    assert list_streams(written.uri, SCOPE) == [STREAM]


def test_a_time_window_reads_exactly_what_was_appended_in_it(written: Written) -> None:
    times = sorted(t for *_, t in written.events)
    for low, high in [(times[10], times[30]), (times[55], times[90]), (times[0], times[-1] + 1),
                      (times[70], times[70])]:
        got = rows(read_stream(written.uri, SCOPE, STREAM, start=low,
                               end=datetime.datetime.fromtimestamp(high / 1000,
                                                                   datetime.UTC)))
        expected = [e for e in written.events if low <= e[3] < high]
        assert sorted(got) == sorted(expected), (low, high)


def test_cuts_bound_the_read(written: Written) -> None:
    middle = {sid: events[len(events) // 2][1] for sid, events in
              by_segment([e for e in written.events if e[0] in written.first]).items()}
    after = rows(read_stream(written.uri, SCOPE, STREAM, start=middle))
    before = rows(read_stream(written.uri, SCOPE, STREAM, end=middle))
    assert sorted(before + after) == sorted(written.events)
    assert all(offset < middle[sid] for sid, offset, _e, _t in before)


def test_splits_at_event_boundaries_and_duckdb_reads_the_dataset(written: Written) -> None:
    splits = plan(written.uri, SCOPE, STREAM, split_bytes=300)
    assert len(splits) > len({s.segment_id for s in splits})  # segments were split
    offsets = {(sid, offset) for sid, offset, _e, _t in written.events}
    assert all((s.segment_id, s.first) in offsets for s in splits if s.first > 0)
    dataset = StreamDataset(written.uri, SCOPE, STREAM, split_bytes=300)
    pieces = [rows(f.to_batches()) for f in dataset.get_fragments()]
    assert sorted(itertools.chain.from_iterable(pieces)) == sorted(written.events)
    assert dataset.count_rows() == len(written.events)
    history = dataset.to_table()
    [counted] = duckdb.sql("SELECT count(*), count(DISTINCT segment_id), min(timestamp) "
                           "FROM history").fetchall()
    assert counted[0] == len(written.events) and counted[1] == 4
    assert int(counted[2].timestamp() * 1000) == min(t for *_, t in written.events)
    assert history.num_rows == len(written.events)
    # the dataset itself, through the Arrow PyCapsule stream
    assert duckdb.sql("SELECT count(*) FROM dataset").fetchall() == [(len(written.events),)]
