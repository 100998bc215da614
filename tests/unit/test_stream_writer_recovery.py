"""The stream writer when things go wrong (quire.streams against the
in-process system of :mod:`tests.support.streams`): a connection dropped
mid-write, a segment sealed and truncated away under it (NoSuchSegment: the
events go to the successors, or fail as unknown if they were in doubt), a
block the server keeps refusing, an owner that refuses connections."""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import pytest

from quire.errors import SegmentNotFoundError, SegmentStoreConnectionError
from quire.segmentserver import SegmentServer
from quire.streams import RemoteSegmentStore, StreamWriter, WriterConfig, controller_resolver
from quire.streams.model import Segment
from tests.support.streams import FAST_RETRY, StreamSystem, read_all


async def test_a_dropped_connection_mid_write_is_exactly_once(system: StreamSystem) -> None:
    """The server's connections are cut right after an append is applied
    and before its answer leaves: the writer sets up again and resends;
    the segment keeps every event once."""
    c = system.controller_client()
    segments = system.segments(c, FAST_RETRY)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    original = system.store.append
    calls = itertools.count(1)
    cut_at = {3, 7}

    def append(*args: Any, **kwargs: Any) -> Any:
        future = original(*args, **kwargs)
        if next(calls) in cut_at:
            def cut(_: Any) -> None:
                for connection in list(system.server._connections):
                    connection.abort()
            future.add_done_callback(cut)  # runs before the server's reply is written
        return future
    system.store.append = append  # type: ignore[method-assign]
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    written: list[asyncio.Future[None]] = []
    for n in range(0, 400, 10):  # rounds of 10, each sent while the last is in flight
        previous = written[-1] if written else None
        written += [writer.write_event(b"%d" % i, "k") for i in range(n, n + 10)]
        if previous is not None:
            await previous
    await asyncio.gather(*written)
    await writer.close()
    system.store.append = original  # type: ignore[method-assign]
    assert next(calls) > 8 and writer.reconnects >= 2  # both cuts happened
    events = await read_all(c, segments, "sc", "st")
    assert [int(e.data) for e in events] == list(range(400))


async def test_writer_follows_a_segment_truncated_away_before_it_wrote_again(
        system: StreamSystem) -> None:
    """A scale seals the segment the writers write to and a truncation
    deletes it before they learn of the seal: the store answers NoSuchSegment
    (to a block on the open connection, and to a new writer's setup), and
    the events go to the successors, as after SegmentIsSealed (Pravega's
    writer resends to the successors of a segment truncated away)."""
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    connected = StreamWriter(c, segments, "sc", "st")
    await connected.start()
    await connected.write_event(b"before", "k0")  # its connection stays set up
    idle = StreamWriter(c, segments, "sc", "st")
    await idle.start()  # knows the segment, never set up on it
    (only,) = await c.current_segments("sc", "st")
    epoch = await c.scale("sc", "st", [only.id], [(0.0, 0.5), (0.5, 1.0)])
    assert await c.scale_done("sc", "st", epoch)
    successors = await c.current_segments("sc", "st")
    await c.truncate_stream("sc", "st", {s.id: 0 for s in successors})
    with pytest.raises(SegmentNotFoundError):
        await segments.get_info(only.name)
    keys = [f"k{i}" for i in range(8)]
    await asyncio.gather(*(w.write_event(f"{k}:{n}".encode(), k)
                           for n, w in enumerate((connected, idle)) for k in keys))
    assert [s.id for s in connected.segments] == [s.id for s in idle.segments] == \
        [s.id for s in successors]
    await connected.close()
    await idle.close()
    found = sorted(e.data.decode() for e in await read_all(c, segments, "sc", "st"))
    assert found == sorted(f"{k}:{n}" for n in range(2) for k in keys)


async def test_events_in_doubt_in_a_segment_truncated_away_are_unknown_not_resent(
        system: StreamSystem) -> None:
    """A block lands, its connection drops before the answer, and before the
    writer sets up again a scale seals the segment and a truncation deletes
    it: whether the block landed can no longer be known, so it fails as
    unknown (resent to the successors, it would be stored twice); what was
    never sent goes to the successors."""
    c = system.controller_client()
    segments = system.segments(c, FAST_RETRY)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    (only,) = await c.current_segments("sc", "st")
    dropped, reached, gate = asyncio.Event(), asyncio.Event(), asyncio.Event()
    original_append, original_update = system.store.append, system.store.update_attributes

    def append(*args: Any, **kwargs: Any) -> Any:
        future = original_append(*args, **kwargs)
        system.store.append = original_append  # type: ignore[method-assign]

        def cut(_: Any) -> None:
            dropped.set()
            for connection in list(system.server._connections):
                connection.abort()
        future.add_done_callback(cut)  # runs before the server's reply is written
        return future

    def update_attributes(segment: str, updates: Any) -> Any:
        if segment != only.name or updates or not dropped.is_set():
            return original_update(segment, updates)
        reached.set()

        async def later() -> Any:  # the writer's next setup barrier waits for the gate
            await gate.wait()
            return await original_update(segment, updates)
        return asyncio.ensure_future(later())
    system.store.append = append  # type: ignore[method-assign]
    system.store.update_attributes = update_attributes  # type: ignore[method-assign]
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    landed = writer.write_event(b"landed", "k")
    await reached.wait()  # the connection dropped: the writer sets up again
    queued = writer.write_event(b"queued", "k")
    epoch = await c.scale("sc", "st", [only.id], [(0.0, 0.5), (0.5, 1.0)])
    assert await c.scale_done("sc", "st", epoch)
    successors = await c.current_segments("sc", "st")
    await c.truncate_stream("sc", "st", {s.id: 0 for s in successors})
    gate.set()
    await queued
    with pytest.raises(SegmentStoreConnectionError, match="unknown"):
        await landed
    system.store.update_attributes = original_update  # type: ignore[method-assign]
    await writer.close()
    assert [e.data for e in await read_all(c, segments, "sc", "st")] == [b"queued"]


async def test_a_block_the_server_keeps_refusing_fails_instead_of_looping(
        system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c, FAST_RETRY)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    writer = StreamWriter(c, segments, "sc", "st",
                          config=WriterConfig(max_breaks_without_progress=3))
    await writer.start()
    with pytest.raises(ValueError):
        writer.write_event(b"x" * writer.config.max_block_bytes)
    original = system.store.append

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a defect: the server closes the connection")
    system.store.append = broken  # type: ignore[method-assign]
    try:
        with pytest.raises(SegmentStoreConnectionError, match="broke 4 times in a row"):
            await writer.write_event(b"poison", "k")
        assert writer.reconnects == 3
    finally:
        system.store.append = original  # type: ignore[method-assign]
    await writer.write_event(b"fine", "k")  # a new event sets the segment up afresh
    await writer.close()
    assert [e.data for e in await read_all(c, segments, "sc", "st")] == [b"fine"]


async def test_a_writer_sets_up_again_while_the_owner_refuses_connections(
        system: StreamSystem) -> None:
    """The segment's owner is named but refuses connections (it crashed, and
    its containers are not taken over yet) for the first setups: the writer
    keeps resolving and setting up until the owner serves, and every event
    is written once.  (Found by a network round, kill -9 of a segment
    store: the writer failed every queued event at the first refused
    connection.)"""
    c = system.controller_client()
    await c.create_scope("sc")
    await c.create_stream("sc", "crash", 1)
    dead = SegmentServer(system.store)  # bound, then closed: its port refuses connections
    await dead.start("127.0.0.1", 0)
    await dead.close()
    owner = controller_resolver(c)
    refusals = [f"127.0.0.1:{dead.port}"] * 4

    async def resolve(segment: str) -> str:
        return refusals.pop(0) if refusals else await owner(segment)
    segments = RemoteSegmentStore(resolve, FAST_RETRY)
    system.clients.append(segments)
    writer = StreamWriter(c, segments, "sc", "crash")
    await writer.start()
    await asyncio.gather(*(writer.write_event(b"%d" % i, "k") for i in range(20)))
    await writer.close()
    assert not refusals and segments.retries >= 4
    assert [int(e.data) for e in await read_all(c, segments, "sc", "crash")] == list(range(20))


async def test_blocks_failed_on_a_connection_given_up_leave_no_unretrieved_error(
        system: StreamSystem) -> None:
    """Five blocks in flight on one connection when it drops: the first
    block's answer makes the writer give the connection up, and the other
    four answers come to a connection it no longer uses. Their errors are
    still retrieved, not logged as "Future exception was never retrieved"
    when the futures are collected. (Found by the stream simulation, seed
    101961: a writer with blocks in flight on a segment store that went
    away.) The events are then written once."""
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    c = system.controller_client()
    segments = system.segments(c, FAST_RETRY)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    writer = StreamWriter(c, segments, "sc", "st", config=WriterConfig(max_block_events=1))
    await writer.start()
    await writer.write_event(b"first", "k")  # set up: the next five go out at once
    original = system.store.append
    held: list[asyncio.Future[Any]] = []
    all_held = asyncio.Event()

    def hold(*_args: Any, **_kwargs: Any) -> Any:
        held.append(loop.create_future())  # never answered: the connection drops first
        if len(held) == 5:
            all_held.set()
        return held[-1]
    system.store.append = hold  # type: ignore[method-assign]
    written = [writer.write_event(b"%d" % i, "k") for i in range(5)]
    await asyncio.wait_for(all_held.wait(), 10)  # the server has taken all five blocks
    system.store.append = original  # type: ignore[method-assign]
    for connection in list(system.server._connections):
        connection.abort()
    await asyncio.gather(*written)
    await writer.close()
    for future in held:
        future.cancel()
    gc.collect()
    await asyncio.sleep(0)
    assert [x for x in unretrieved if "never retrieved" in str(x.get("message"))] == []
    events = await read_all(c, segments, "sc", "st")
    assert [e.data for e in events] == [b"first", b"0", b"1", b"2", b"3", b"4"]


async def test_a_follow_answered_after_a_neighbours_newer_one_changes_no_route() -> None:
    """Two of a writer's segments sealed at once: the follow of one put a
    newer merged segment over both ranges first, then the other's answer (its
    own, older successor) replaced that merged segment, and part of the key
    space had no segment: the writer's next event for it failed with a
    ValueError nobody retrieved (the stream simulation, seed 115030)."""
    def seg(sid: int, low: float, high: float) -> Segment:
        return Segment("sc", "st", sid, low, high)
    a, b, c = seg(0, 0.0, 0.5), seg(1, 0.5, 0.75), seg(2, 0.75, 1.0)
    merged, a_next = seg(10, 0.0, 0.75), seg(5, 0.0, 0.5)
    answers = {b.id: asyncio.Event(), a.id: asyncio.Event()}

    class Controller:
        async def successors(self, _scope: str, _stream: str, sid: int) -> list[Any]:
            await answers[sid].wait()
            return [(merged, [a.id, b.id])] if sid == b.id else [(a_next, [a.id])]

    writer = StreamWriter(Controller(), None, "sc", "st")  # type: ignore[arg-type]
    writer._routes = [a, b, c]
    writer._following = 2
    following = [asyncio.create_task(writer._follow(b, None)),
                 asyncio.create_task(writer._follow(a, None))]
    answers[b.id].set()  # b's successor (a merge of a and b) answers first
    await following[0]
    assert writer._routes == [merged, c]
    answers[a.id].set()  # then a's own, older one
    await following[1]
    assert writer._routes == [merged, c]
