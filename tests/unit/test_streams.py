"""quire.streams against an in-process controller and segment server on
loopback (the in-memory tier-1 twin); the controller keeps its own tables
through a RemoteSegmentStore, so they cross the wire too."""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from quire.errors import (
    BadOffsetError,
    ConfigError,
    ContainerNotOwnedError,
    ControllerPreconditionError,
    ControllerUnavailableError,
    ScopeNotFoundError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentStoreConnectionError,
    StreamNotFoundError,
    StreamSealedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)
from quire.metadata import open_store
from quire.pravega_wire import (
    OLDEST_COMPATIBLE_VERSION,
    REQUEST_TYPES,
    WIRE_VERSION,
    CreateTableSegment,
    Decoder,
    Hello,
    SegmentCreated,
    WireCommand,
)
from quire.segmentserver import SegmentServer
from quire.segmentstore import NOT_EXISTS, SegmentStore, SegmentStoreConfig, SegmentType
from quire.segmentstore.names import CONTAINER_COUNT_KEY, container_of
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    SegmentClientConfig,
    SegmentConnection,
    StreamReader,
    StreamTransaction,
    StreamWriter,
    TxnState,
    controller_resolver,
    frame_event,
    metadata_resolver,
    tail_cut,
)
from quire.streams.model import EventParser, key_hash, parse_segment_name, segment_for
from quire.testing.memory_data_log import MemoryDataLogs
from tests.support.streams import FAST_RETRY, StreamSystem, read_all

# --- model -----------------------------------------------------------------------------


def test_event_parser_takes_events_across_any_read_boundaries() -> None:
    data = b"".join(frame_event(b"e%d" % i * i) for i in range(20))
    for step in (1, 3, 8, 13, len(data)):
        parser = EventParser(100)
        found = []
        for at in range(0, len(data), step):
            found += parser.feed(data[at:at + step])
        assert [p for _, p in found] == [b"e%d" % i * i for i in range(20)]
        assert found[1][0] == 100 + 8  # the offset of the second event's header
        assert parser.partial_bytes == 0 and parser.offset == 100 + len(data)


def test_names_and_key_points() -> None:
    assert parse_segment_name("sc/st/3.#epoch.2") == ("sc", "st", (2 << 32) | 3)
    assert parse_segment_name("sc/st/3.#epoch.2#transaction.00ff") == ("sc", "st", (2 << 32) | 3)
    assert parse_segment_name("_system/_tables/scopes") is None
    points = [key_hash(f"k{i}") for i in range(1000)]
    assert all(0 <= p < 1 for p in points) and key_hash("k1") == points[1]
    assert len({int(p * 3) for p in points}) == 3  # spread over three equal ranges


# --- controller client ------------------------------------------------------------------


async def test_scope_and_stream_lifecycle_with_typed_errors(system: StreamSystem) -> None:
    c = system.controller_client()
    assert await c.create_scope("sc") is True
    assert await c.create_scope("sc") is False
    assert await c.create_scope("other") is True
    assert sorted(await c.list_scopes()) == ["other", "sc"]
    with pytest.raises(ScopeNotFoundError):
        await c.list_streams("nope")
    with pytest.raises(ScopeNotFoundError):
        await c.create_stream("nope", "st", 1)
    assert await c.create_stream("sc", "st", 3, retention="size", retention_param=1 << 20)
    assert not await c.create_stream("sc", "st", 3)
    assert await c.create_stream("sc", "two", 1)
    assert sorted(await c.list_streams("sc")) == ["st", "two"]
    config = await c.stream_config("sc", "st")
    assert (config.segments, config.retention, config.retention_param) == (3, "size", 1 << 20)
    current = await c.current_segments("sc", "st")
    assert len(current) == 3 and current[0].min_key == 0.0 and current[-1].max_key == 1.0
    assert all(a.max_key == b.min_key for a, b in itertools.pairwise(current))
    assert await c.head_cut("sc", "st") == {s.id: 0 for s in current}
    with pytest.raises(ControllerPreconditionError):
        await c.delete_scope("sc")  # it has streams
    with pytest.raises(ControllerPreconditionError):
        await c.delete_stream("sc", "st")  # not sealed
    await c.seal_stream("sc", "st")
    assert all([(await c.successors("sc", "st", s.id)) == [] for s in current])
    await c.delete_stream("sc", "st")
    with pytest.raises(StreamNotFoundError):
        await c.delete_stream("sc", "st")
    await c.seal_stream("sc", "two")
    await c.delete_stream("sc", "two")
    await c.delete_scope("sc")
    with pytest.raises(ScopeNotFoundError):
        await c.delete_scope("sc")
    assert await c.list_scopes() == ["other"]


async def test_transactions_commit_is_visible_abort_is_not(system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    committed = await c.create_transaction("sc", "st")
    aborted = await c.create_transaction("sc", "st")
    for txn, payload in ((committed, b"in"), (aborted, b"out")):
        assert await c.transaction_state("sc", "st", txn.id) is TxnState.OPEN
        (segment,) = txn.segments
        name = f"{segment.name}#transaction.{txn.id:032x}"
        await segments.append(name, frame_event(payload), writer_id=7, event_number=1)
    assert await c.ping_transaction("sc", "st", committed.id, 10_000)
    await c.commit_transaction("sc", "st", committed.id)
    await c.abort_transaction("sc", "st", aborted.id)
    assert [e.data for e in await read_all(c, segments, "sc", "st")] == [b"in"]
    assert await c.transaction_state("sc", "st", aborted.id) in (TxnState.ABORTING,
                                                                  TxnState.ABORTED)


# --- segment operations ---------------------------------------------------------------------


async def test_segment_and_table_operations_answer_the_store_errors(system: StreamSystem) -> None:
    c = system.controller_client()
    s = system.segments(c)
    name = "sc/raw/0.#epoch.0"
    await s.create_segment(name)
    with pytest.raises(SegmentExistsError):
        await s.create_segment(name)
    with pytest.raises(SegmentNotFoundError):
        await s.get_info("sc/raw/9.#epoch.0")
    first = await s.append(name, frame_event(b"a"), writer_id=1, event_number=1)
    assert (first.length, first.duplicate) == (9, False)
    again = await s.append(name, frame_event(b"a"), writer_id=1, event_number=1)
    assert again.duplicate and (await s.get_info(name)).length == 9
    with pytest.raises(BadOffsetError):
        await s.append(name, frame_event(b"b"), writer_id=1, event_number=2, expected_offset=0)
    await s.append(name, frame_event(b"b"), writer_id=1, event_number=2, expected_offset=9)
    r = await s.read(name, 9)
    assert r.data == frame_event(b"b") and r.at_tail and not r.end_of_segment
    assert await s.seal(name) == 18
    with pytest.raises(SegmentSealedError):
        await s.append(name, frame_event(b"c"), writer_id=1, event_number=3)
    assert (await s.read(name, 18)).end_of_segment

    table = "sc/_t/0.#epoch.0"
    await s.create_segment(table, SegmentType.TABLE)
    (v1,) = await s.table_put(table, [(b"k", b"v1", NOT_EXISTS)])
    with pytest.raises(TableKeyBadVersionError):
        await s.table_put(table, [(b"k", b"v2", NOT_EXISTS)])
    (v2,) = await s.table_put(table, [(b"k", b"v2", v1)])
    await s.table_put(table, [(b"j", b"x", None)])
    found = await s.table_get(table, [b"k", b"missing"])
    assert found[0] is not None and (found[0].value, found[0].version) == (b"v2", v2)
    assert found[1] is None
    page = await s.table_iterate(table, max_entries=1)
    assert [e.key for e in page.entries] == [b"j"]
    page = await s.table_iterate(table, token=page.token)
    assert [e.key for e in page.entries] == [b"k"]
    assert (await s.table_iterate(table, token=page.token)).token is None
    delta = await s.table_read_delta(table, 0, 10)
    assert [e.key for e in delta.entries] == [b"k", b"j"]
    with pytest.raises(TableKeyNotFoundError):
        await s.table_remove(table, [(b"missing", 5)])
    await s.table_remove(table, [(b"k", v2)])
    assert await s.table_get(table, [b"k"]) == [None]
    await s.delete(table)
    with pytest.raises(SegmentNotFoundError):
        await s.table_get(table, [b"k"])


async def test_wrong_host_and_unreachable_owner_are_retried(system: StreamSystem) -> None:
    """A resolver that first names a port nobody listens on, then a segment
    server hosting no container (WrongHost), then the owner."""
    other = await SegmentStore.open(None, [], metadata_store=await open_store("memory://w"),
                                    open_log=MemoryDataLogs().open,
                                    config=SegmentStoreConfig(container_count=2))
    wrong = SegmentServer(other)
    await wrong.start("127.0.0.1", 0)
    dead = SegmentServer(other)  # bound, then closed: its port refuses connections
    await dead.start("127.0.0.1", 0)
    await dead.close()
    answers = [f"127.0.0.1:{dead.port}", f"127.0.0.1:{wrong.port}"]
    asked: list[str] = []

    async def resolve(segment: str) -> str:
        asked.append(segment)
        return answers.pop(0) if answers else system.address
    s = RemoteSegmentStore(resolve, FAST_RETRY)
    try:
        name = "sc/wh/0.#epoch.0"
        await s.create_segment(name)
        assert s.retries == 2 and len(asked) == 3
        answers[:] = [f"127.0.0.1:{wrong.port}"]
        s.refute(name, system.address)
        assert (await s.append(name, frame_event(b"x"), 5, 1)).length == 9
        assert s.retries == 3
    finally:
        await s.close()
        await wrong.close()
        await other.close()

    async def nobody(_segment: str) -> str:
        raise ContainerNotOwnedError("no owner")
    s = RemoteSegmentStore(nobody, SegmentClientConfig(retry_deadline_ms=50,
                                                       retry_backoff_ms=5))
    with pytest.raises(ContainerNotOwnedError):  # retries ran out: never "no such segment"
        await s.get_info("sc/wh/0.#epoch.0")
    await s.close()


async def test_a_mutation_whose_connection_drops_is_unknown_not_no(system: StreamSystem) -> None:
    c = system.controller_client()
    s = system.segments(c, FAST_RETRY)
    name = "sc/drop/0.#epoch.0"
    await s.create_segment(name)
    original = system.store.seal

    def seal_then_drop(segment: str) -> Any:
        future = original(segment)
        for connection in list(system.server._connections):
            connection.abort()  # before the answer leaves
        return future
    system.store.seal = seal_then_drop  # type: ignore[method-assign]
    with pytest.raises(SegmentStoreConnectionError):
        await s.seal(name)
    system.store.seal = original  # type: ignore[method-assign]
    assert (await s.get_info(name)).sealed  # a query is resent on a new connection


async def test_metadata_resolver_names_the_owner_of_the_container() -> None:
    metadata = await open_store("memory://resolver")
    await metadata.create_record(CONTAINER_COUNT_KEY, b"4")
    owners = {0: "a:1", 1: "b:2", 2: None, 3: "d:4"}
    asked: list[int] = []

    async def owner_address(store: Any, container: int) -> str | None:
        assert store is metadata
        asked.append(container)
        return owners[container]
    resolve = metadata_resolver(metadata, owner_address)
    for i in range(40):
        name = f"sc/st/{i}.#epoch.0"
        container = container_of(name, 4)
        if owners[container] is None:
            with pytest.raises(ContainerNotOwnedError):
                await resolve(name)
        else:
            assert await resolve(name) == owners[container]
        assert asked[-1] == container
    await metadata.close()


# --- writer and reader ----------------------------------------------------------------


async def test_writer_and_reader_round_trip_over_three_segments_in_key_order(
        system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 3)
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    keys = [f"key-{k}" for k in range(12)]
    futures = [writer.write_event(f"{key}:{n}".encode(), key)
               for n in range(50) for key in keys]
    await asyncio.gather(*futures)
    await writer.close()
    events = await read_all(c, segments, "sc", "st")
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    segments_of: dict[str, set[int]] = collections.defaultdict(set)
    for e in events:
        key, n = e.data.decode().split(":")
        per_key[key].append(int(n))
        segments_of[key].add(e.segment_id)
    assert len(events) == 600
    assert all(per_key[k] == list(range(50)) for k in keys)  # once each, in order
    assert all(len(ids) == 1 for ids in segments_of.values())  # a key stays in its segment
    assert len({e.segment_id for e in events}) == 3
    current = await c.current_segments("sc", "st")
    for key in keys:
        assert segment_for(current, key_hash(key)).id in segments_of[key]


async def test_writer_follows_a_scale_and_reader_reads_across_it(system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 1)
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    keys = [f"k{i}" for i in range(8)]
    await asyncio.gather(*(writer.write_event(f"{k}:{n}".encode(), k)
                           for n in range(20) for k in keys))
    (only,) = await c.current_segments("sc", "st")
    epoch = await c.scale("sc", "st", [only.id], [(0.0, 0.5), (0.5, 1.0)])
    assert await c.scale_done("sc", "st", epoch)
    await asyncio.gather(*(writer.write_event(f"{k}:{n}".encode(), k)
                           for n in range(20, 40) for k in keys))
    assert len(writer.segments) == 2
    await c.seal_stream("sc", "st")
    with pytest.raises(StreamSealedError):
        await writer.write_event(b"late", "k0")
    await writer.close()
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for e in await read_all(c, segments, "sc", "st"):
        key, n = e.data.decode().split(":")
        per_key[key].append(int(n))
    assert all(per_key[k] == list(range(40)) for k in keys)


async def test_tail_reader_sees_only_new_events_and_follows(system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 2)
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    await asyncio.gather(*(writer.write_event(b"old-%d" % n, str(n)) for n in range(10)))
    reader = StreamReader(c, segments, "sc", "st", from_tail=True)
    cut = await reader.start_cut()
    assert cut == await tail_cut(c, segments, "sc", "st") and sum(cut.values()) > 0
    seen: list[bytes] = []

    async def follow() -> None:
        async for event in reader.events(follow=True):
            seen.append(event.data)
    following = asyncio.create_task(follow())
    await asyncio.gather(*(writer.write_event(b"new-%d" % n, str(n)) for n in range(10)))
    await writer.close()
    await c.seal_stream("sc", "st")  # the reader ends once both segments end
    await asyncio.wait_for(following, 10)
    assert sorted(seen) == sorted(b"new-%d" % n for n in range(10))


async def test_a_closed_following_reader_leaves_no_read_connection(system: StreamSystem) -> None:
    # each closed tail reader left its segments' read connections open (the
    # month soak's segment stores gained ~2 sockets a minute)
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 2)
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()
    await asyncio.gather(*(writer.write_event(b"e-%d" % n, str(n)) for n in range(10)))
    await writer.close()
    reader = StreamReader(c, segments, "sc", "st")
    seen = 0
    async for _ in reader.events(follow=True):
        seen += 1
        if seen == 10:
            break  # both segments are at their tail, their reads waiting there
    await reader.close()
    assert segments._readers == {}


async def test_an_unreachable_controller_is_unavailable_not_no() -> None:
    with pytest.raises(ConfigError):
        ControllerClient("http://127.0.0.1:1")
    c = ControllerClient("tcp://127.0.0.1:1", timeout_ms=2_000)
    try:
        with pytest.raises(ControllerUnavailableError):
            await c.scope_exists("sc")
    finally:
        await c.close()


async def test_no_owner_known_to_the_controller_is_retried(system: StreamSystem) -> None:
    """getURI answers UNAVAILABLE while no live segment store owns the
    container (its owner crashed and the takeover is not done): operations
    resolving through the controller retry instead of failing.  (Found by a
    network round, kill -9 of a segment store: a stream reader died of
    ControllerUnavailableError.)"""
    c = system.controller_client()
    await c.create_scope("sc")
    await c.create_stream("sc", "moving", 1)
    unavailable = [2]

    class Flaky:
        async def segment_uri(self, scope: str, stream: str, segment: int) -> str:
            if unavailable[0]:
                unavailable[0] -= 1
                raise ControllerUnavailableError("getURI: UNAVAILABLE: no live segment store "
                                                 "owns container 0")
            return await c.segment_uri(scope, stream, segment)
    segments = RemoteSegmentStore(controller_resolver(Flaky()),  # type: ignore[arg-type]
                                  FAST_RETRY)
    system.clients.append(segments)
    info = await segments.get_info("sc/moving/0.#epoch.0")
    assert info.length == 0 and segments.retries == 2 and unavailable == [0]


# --- one connection ---------------------------------------------------------------------


async def fake_store(answer: Callable[[list[WireCommand]], bytes]) -> asyncio.Server:
    """A server that says Hello, reads the client's Hello and two requests,
    then writes ``answer(requests)``."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION).encode())
        decoder = Decoder(REQUEST_TYPES)
        requests: list[WireCommand] = []
        while len(requests) < 3:
            decoder.feed(await reader.read(4096))
            requests += list(decoder)
        writer.write(answer(requests[1:]))
        await writer.drain()
        await reader.read()  # until the client goes
        writer.close()
    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_a_connection_matches_replies_by_request_id() -> None:
    def reversed_replies(requests: list[WireCommand]) -> bytes:
        return b"".join(SegmentCreated(r.request_id, r.segment).encode()  # type: ignore[attr-defined]
                        for r in reversed(requests))
    server = await fake_store(reversed_replies)
    port = server.sockets[0].getsockname()[1]
    connection = await SegmentConnection.open(f"127.0.0.1:{port}", 2_000)
    first, second = connection.send([(CreateTableSegment(11, "a", ""), 11),
                                     (CreateTableSegment(12, "b", ""), 12)])
    assert await first == SegmentCreated(11, "a") and await second == SegmentCreated(12, "b")
    await connection.close()
    server.close()


async def test_a_malformed_reply_fails_what_is_pending_and_the_next_request() -> None:
    server = await fake_store(lambda _requests: b"\x00\x00\x00\x07\xff\xff\xff\xff")
    port = server.sockets[0].getsockname()[1]
    connection = await SegmentConnection.open(f"127.0.0.1:{port}", 2_000)
    pending = connection.send([(CreateTableSegment(1, "a", ""), 1),
                               (CreateTableSegment(2, "b", ""), 2)])
    for future in pending:
        with pytest.raises(SegmentStoreConnectionError, match="malformed"):
            await future
    assert connection.broken
    with pytest.raises(SegmentStoreConnectionError):  # nothing sent on a broken connection
        connection.request(CreateTableSegment(3, "c", ""), 3)
    server.close()


async def test_two_cuts_split_a_stream_across_a_scale(system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 2)
    writer = StreamWriter(c, segments, "sc", "st")
    await writer.start()

    async def write(batch: str) -> None:
        await asyncio.gather(*(writer.write_event(f"{batch}{n}".encode(), str(n))
                               for n in range(10)))
    await write("a")
    first = await tail_cut(c, segments, "sc", "st")
    await write("b")
    current = await c.current_segments("sc", "st")
    epoch = await c.scale("sc", "st", [current[0].id],
                          [(current[0].min_key, 0.25), (0.25, current[0].max_key)])
    assert await c.scale_done("sc", "st", epoch)
    await write("c")
    second = await tail_cut(c, segments, "sc", "st")
    assert len(second) == 3
    await write("d")
    await writer.close()

    async def between(start: dict[int, int] | None, end: dict[int, int] | None) -> list[str]:
        reader = StreamReader(c, segments, "sc", "st", cut=start, end_cut=end)
        return sorted(e.data.decode() for e in [e async for e in reader.events()])
    assert await between(None, first) == sorted(f"a{n}" for n in range(10))
    assert await between(first, second) == sorted(f"{b}{n}" for b in "bc" for n in range(10))
    assert await between(second, None) == sorted(f"d{n}" for n in range(10))


async def test_stream_transactions_commit_together_abort_discards(system: StreamSystem) -> None:
    c = system.controller_client()
    segments = system.segments(c)
    await c.create_scope("sc")
    await c.create_stream("sc", "st", 3)
    keys = [f"k{i}" for i in range(6)]
    committed = await StreamTransaction.begin(c, segments, "sc", "st")
    aborted = await StreamTransaction.begin(c, segments, "sc", "st")
    assert committed.id != aborted.id
    await asyncio.gather(*(committed.write_event(f"{k}:{n}".encode(), k)
                           for n in range(10) for k in keys))
    await asyncio.gather(*(aborted.write_event(f"x{k}:{n}".encode(), k)
                           for n in range(10) for k in keys))
    assert await read_all(c, segments, "sc", "st") == []  # nothing visible while open
    assert await committed.state() is TxnState.OPEN and await committed.ping(20_000)
    await committed.commit()
    await aborted.abort()
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for e in await read_all(c, segments, "sc", "st"):
        key, n = e.data.decode().split(":")
        per_key[key].append(int(n))
    assert dict(per_key) == {k: list(range(10)) for k in keys}
    assert await committed.state() in (TxnState.COMMITTING, TxnState.COMMITTED)
    assert not await aborted.ping(20_000)
