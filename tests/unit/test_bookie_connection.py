"""BookieConnection with a fake transport: back-pressure, limits and
malformed input against a fake RequestHandler, the timing of answers
against a real server."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from quire.bookie.config import ConnectionLimits
from quire.bookie.connection import BookieConnection, ConnectionHub
from quire.bookie.metrics import BookieMetrics
from quire.bookie.server import BookieServer
from quire.errors import StatusCode
from quire.node import BookieNode
from quire.protocol import (
    FLAG_RECOVERY_ADD,
    AddRequestRun,
    AddResponse,
    DigestManager,
    ReadLacRequest,
    encode_add_request,
    master_key,
)
from quire.protocol.codec import Decoder
from quire.types import DigestType
from tests.support.bookie_node import node_config
from tests.support.fake_transport import FakeTransport


class FakeHandler:
    """A RequestHandler that holds 600 bytes per request and answers nothing."""

    def __init__(self) -> None:
        self.handled: list[object] = []
        self.runs: list[list[int]] = []

    def take_adds(self, conn: BookieConnection, run: AddRequestRun) -> None:
        self.runs.append(list(run.request_ids))

    def take_request(self, conn: BookieConnection, request: object) -> None:
        self.handled.append(request)
        conn.hold(600)

    def release_volatile_acks(self, conn: BookieConnection) -> None:
        conn.volatile_acks.clear()


def connect() -> tuple[BookieConnection, FakeTransport, FakeHandler]:
    hub = ConnectionHub(BookieMetrics(), max_frame_bytes=1 << 20,
                        max_connection_pending_bytes=1000)
    handler = FakeHandler()
    conn = BookieConnection(hub, handler)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport, handler


async def test_reading_pauses_while_too_many_bytes_wait_and_resumes_after() -> None:
    conn, transport, handler = connect()
    conn.data_received(ReadLacRequest(1, 5).encode())
    assert transport.reading  # 600 pending <= 1000
    conn.data_received(ReadLacRequest(2, 5).encode())
    assert not transport.reading  # 1200 pending > 1000: stop reading this socket
    conn.send(b"answer-1", 600)
    conn.flush()
    # 600 still pending is above half the limit: stays paused (resuming only
    # at half the limit keeps the socket from flapping)
    assert not transport.reading
    conn.send(b"answer-2", 600)
    conn.flush()
    assert transport.reading and transport.written == [b"answer-1", b"answer-2"]
    assert len(handler.handled) == 2


async def test_socket_buffer_full_pauses_reading_too() -> None:
    conn, transport, _handler = connect()
    conn.pause_writing()
    assert not transport.reading
    conn.resume_writing()
    assert transport.reading
    assert paused(conn.hub, "replies_unread") == 1


def paused(hub: ConnectionHub, reason: str) -> float:
    return hub.metrics.reads_paused.labels(reason)._value.get()  # type: ignore[no-any-return]


def refused(hub: ConnectionHub, reason: str) -> float:
    return hub.metrics.connection_refusals.labels(reason)._value.get()  # type: ignore[no-any-return]


async def test_requests_past_the_budget_wait_unread_until_half_of_it_is_free() -> None:
    """One read of three requests holding 600 bytes each, a budget of 1000:
    the third waits in the buffer (not taken) and the socket stops being
    read; once answers free the budget it is taken, in order."""
    conn, transport, handler = connect()
    conn.data_received(ReadLacRequest(1, 5).encode() + ReadLacRequest(2, 5).encode()
                       + ReadLacRequest(3, 5).encode())
    assert [r.request_id for r in handler.handled] == [1, 2]  # type: ignore[attr-defined]
    assert not transport.reading and paused(conn.hub, "request_budget") == 1
    conn.data_received(ReadLacRequest(4, 5).encode())  # (arrived before the pause took)
    assert len(handler.handled) == 2
    conn.send(b"answer-1", 600)
    conn.send(b"answer-2", 600)
    conn.flush()
    assert transport.reading
    await asyncio.sleep(0)  # the buffered requests are taken on the next iteration
    assert [r.request_id for r in handler.handled] == [1, 2, 3, 4]  # type: ignore[attr-defined]


class Replier(FakeHandler):
    """Answers every request at once with 3,000 bytes."""

    def take_request(self, conn: BookieConnection, request: object) -> None:
        self.handled.append(request)
        conn.send(b"r" * 3000)


async def test_answers_queued_in_one_iteration_are_held_to_the_reply_limit() -> None:
    hub = ConnectionHub(BookieMetrics(), max_frame_bytes=1 << 20,
                        max_connection_pending_bytes=1 << 20,
                        limits=ConnectionLimits(max_buffered_reply_bytes=5000))
    handler = Replier()
    conn = BookieConnection(hub, handler)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    assert transport.write_buffer_limits == (5000, None)  # write back-pressure past it
    conn.data_received(b"".join(ReadLacRequest(i, 5).encode() for i in range(1, 11)))
    assert len(handler.handled) == 2  # 6,000 bytes of answers queued: the rest waits
    hub.flush_all()  # (the iteration's flush) writes them: reading resumes
    assert transport.written == [b"r" * 6000] and transport.reading
    await asyncio.sleep(0)  # and the buffered requests are taken again, two by two
    assert len(handler.handled) == 4


def connection_from(hub: ConnectionHub, host: str) -> tuple[BookieConnection, FakeTransport]:
    conn = BookieConnection(hub, FakeHandler())
    transport = FakeTransport((host, 1))
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_connections_are_admitted_per_peer_and_in_all() -> None:
    hub = ConnectionHub(BookieMetrics(), max_frame_bytes=1 << 20,
                        max_connection_pending_bytes=1000,
                        limits=ConnectionLimits(max_connections=3,
                                                max_connections_per_peer=2))
    a1, a2, a3 = (connection_from(hub, "10.0.0.1") for _ in range(3))
    assert not a1[1].aborted and not a2[1].aborted and a3[1].aborted
    b1 = connection_from(hub, "10.0.0.2")
    c1 = connection_from(hub, "10.0.0.3")
    assert not b1[1].aborted and c1[1].aborted
    assert refused(hub, "max_connections_per_peer") == 1
    assert refused(hub, "max_connections") == 1
    for conn, _transport in (a3, c1):
        conn.connection_lost(None)  # a refused connection gives nothing back
    a1[0].connection_lost(None)
    assert hub.admitted == 2
    again = connection_from(hub, "10.0.0.1")
    assert not again[1].aborted and hub.admitted == 3 and len(hub.connections) == 3


async def test_connections_that_never_finish_a_request_or_read_no_answer_are_closed(
        ) -> None:
    hub = ConnectionHub(BookieMetrics(), max_frame_bytes=1 << 20,
                        max_connection_pending_bytes=1000,
                        limits=ConnectionLimits(idle_timeout_ms=1000))
    silent = connection_from(hub, "10.0.0.1")
    partial = connection_from(hub, "10.0.0.2")
    partial[0].data_received(ReadLacRequest(1, 5).encode()[:7])
    served = connection_from(hub, "10.0.0.3")
    served[0].data_received(ReadLacRequest(1, 5).encode())
    served[0].send(b"answer", 600)
    served[0].flush()
    unread, reading = (connection_from(hub, f"10.0.0.{i}") for i in (5, 6))
    for conn, transport in (unread, reading):  # answers wait in the write buffer
        conn.data_received(ReadLacRequest(1, 5).encode())
        transport.write_buffer_size = 10_000
        conn.pause_writing()
    now = asyncio.get_running_loop().time()
    assert hub.sweep_idle(now + 0.5) == 0  # not idle long enough yet
    reading[1].write_buffer_size = 6_000  # its client reads a little
    # (idle from the sweep that saw its last change: the partial one from 0.5)
    assert hub.sweep_idle(now + 1.6) == 3
    assert silent[1].aborted and partial[1].aborted and not served[1].aborted
    assert unread[1].aborted and not reading[1].aborted
    assert refused(hub, "idle_timeout") == 2 and refused(hub, "replies_unread_timeout") == 1
    partial_more = connection_from(hub, "10.0.0.4")
    partial_more[0].data_received(ReadLacRequest(1, 5).encode()[:7])
    assert hub.sweep_idle(now + 2.0) == 0  # it sent something in the period


async def test_a_throttled_hub_pauses_reading_until_released() -> None:
    conn, transport, _handler = connect()
    conn.hub.set_throttled(True)  # write cache full while a checkpoint runs
    assert not transport.reading
    conn.hub.set_throttled(False)
    assert transport.reading


async def test_answers_of_one_loop_iteration_go_out_in_one_write() -> None:
    conn, transport, _handler = connect()
    ran: list[int] = []
    conn.send(b"a")
    conn.send(b"b")
    conn.hub.before_answers(lambda: ran.append(len(transport.written)))
    conn.send(b"c")
    assert transport.written == []
    await asyncio.sleep(0)  # the hub's flush, scheduled once
    assert transport.written == [b"abc"]
    assert ran == [0]  # the deferred action ran before the answers were written


async def test_malformed_frame_aborts_only_this_connection() -> None:
    conn, transport, handler = connect()
    conn.data_received(b"\xff" * 16)
    assert transport.aborted and handler.handled == []
    assert conn.hub.connections == {conn}  # (until the transport reports it lost)
    await asyncio.sleep(0)


async def test_requests_before_a_malformed_frame_in_the_same_read_are_served() -> None:
    """Decoded before the garbage, in one read: every request is still handed
    on, in order (runs of adds as columns, the rest one by one), and only
    then is the connection closed."""
    conn, transport, handler = connect()
    entry = DigestManager(7, DigestType.CRC32C, b"pw").encode(0, -1, 3, b"abc")
    key = master_key(b"pw")
    conn.data_received(encode_add_request(1, key, entry) + ReadLacRequest(2, 7).encode()
                       + encode_add_request(3, key, entry) + encode_add_request(4, key, entry)
                       + b"\xff" * 16)
    assert handler.runs == [[1], [3, 4]]
    assert [r.request_id for r in handler.handled] == [2]  # type: ignore[attr-defined]
    assert transport.aborted


@contextlib.asynccontextmanager
async def served(tmp_path: Path
                 ) -> AsyncIterator[tuple[BookieServer, BookieConnection, FakeTransport]]:
    """A real bookie node (server and storage engine), one connection on a
    fake transport."""
    node = BookieNode(node_config(tmp_path))
    await node.start()
    try:
        conn = node.server.new_connection()
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        yield node.server, conn, transport
    finally:
        await node.stop()


async def test_answers_released_by_an_fsync_are_written_before_the_loop_moves_on(
        tmp_path: Path) -> None:
    """A real server and storage engine, a fake transport: the answer to a
    PD add is written inside the callback of the fsync that released it,
    not on a later loop iteration (which would first serve other ready
    I/O, often a read of many adds)."""
    async with served(tmp_path) as (server, conn, transport):
        committer = server.committer
        observe = committer._on_sync
        assert observe is not None
        written_at_sync: list[int] = []
        synced = asyncio.Event()

        def on_sync(seconds: float, released: int) -> None:
            observe(seconds, released)
            if released:
                written_at_sync.append(len(transport.written))
                synced.set()

        committer._on_sync = on_sync
        key = master_key(b"pw")
        entry = DigestManager(7, DigestType.CRC32C, b"pw").encode(0, -1, 3, b"abc")
        conn.data_received(encode_add_request(1, key, entry))
        await synced.wait()
        assert written_at_sync == [1]
        answer = Decoder("responses", 1 << 20)
        answer.feed(transport.written[0])
        message = answer.next_message()
        assert isinstance(message, AddResponse)
        assert (message.status, message.ledger_id, message.entry_id) == (StatusCode.OK, 7, 0)


async def test_a_read_of_one_ledgers_adds_is_taken_whole_and_answered_in_order(
        tmp_path: Path) -> None:
    """A real server and storage engine: a read holding only PD adds of one
    known ledger goes through BookieStorage.add_run (column-wise) and is
    answered in order once durable, the LAC piggy-backed on them noted; a
    read mixing two ledgers goes add by add, with the same answers; a
    failed journal fsync answers every add of a run IO_ERROR."""
    async with served(tmp_path) as (server, conn, transport):
        storage = server.storage
        taken: list[int | None] = []
        real_add_run = storage.add_run

        def add_run(*args: Any) -> int | None:
            taken.append(real_add_run(*args))
            return taken[-1]

        storage.add_run = add_run  # type: ignore[method-assign,assignment]
        key = master_key(b"pw")
        digests = {lid: DigestManager(lid, DigestType.CRC32C, b"pw") for lid in (7, 8)}

        def add(request_id: int, ledger_id: int, entry_id: int) -> bytes:
            entry = digests[ledger_id].encode(entry_id, entry_id - 1, entry_id + 1, b"x")
            return encode_add_request(request_id, key, entry)

        answers = Decoder("responses", 1 << 20)

        async def answered(count: int) -> list[tuple[int, StatusCode, int, int]]:
            got: list[tuple[int, StatusCode, int, int]] = []
            while len(got) < count:
                await server.committer.wait_durable(storage.journal.append_seq)
                await asyncio.sleep(0)  # the answers' flush
                for data in transport.written:
                    answers.feed(data)
                transport.written.clear()
                got += [(m.request_id, m.status, m.ledger_id, m.entry_id)  # type: ignore[union-attr,misc]
                        for m in answers.next_messages()]
            return got

        conn.data_received(add(1, 7, 0))  # ledger 7 is new: created add by add
        assert await answered(1) == [(1, StatusCode.OK, 7, 0)]
        conn.data_received(b"".join(add(10 + i, 7, i) for i in range(1, 6)))
        assert await answered(5) == [(10 + i, StatusCode.OK, 7, i) for i in range(1, 6)]
        assert taken[-1] is not None and server.adds.lacs[7] == 4
        calls = len(taken)
        conn.data_received(add(20, 7, 6) + add(21, 8, 0) + add(22, 7, 7))
        assert await answered(3) == [(20, StatusCode.OK, 7, 6), (21, StatusCode.OK, 8, 0),
                                     (22, StatusCode.OK, 7, 7)]
        assert len(taken) == calls  # two ledgers: never offered as a run
        recovery_add = encode_add_request(
            24, key, digests[7].encode(9, 8, 10, b"x"), FLAG_RECOVERY_ADD)
        conn.data_received(add(23, 7, 8) + recovery_add + add(25, 7, 10))
        assert await answered(3) == [(23, StatusCode.OK, 7, 8), (24, StatusCode.OK, 7, 9),
                                     (25, StatusCode.OK, 7, 10)]
        assert len(taken) == calls  # a run with a recovery add: decided add by add
        for entry_id in range(11):
            assert storage.read_entry(7, entry_id)[:16] == struct.pack(">qq", 7, entry_id)

        server.durability.persistent.after_fsync.run_durable(
            (conn, (30, 31), 7, [8, 9], 0.0, 0), OSError("disk gone"))
        await asyncio.sleep(0)
        answers.feed(b"".join(transport.written))
        assert [(m.request_id, m.status) for m in answers.next_messages()] == [  # type: ignore[union-attr]
            (30, StatusCode.IO_ERROR), (31, StatusCode.IO_ERROR)]
        assert server.read_only


async def test_an_engine_error_on_a_run_answers_each_add_and_adds_nothing_twice(
        tmp_path: Path) -> None:
    """BookieStorage.add_run raising (a bug) is contained as the add-by-add
    path contains one: every add of the run gets an error answer, nothing
    is retried add by add (which could journal a half-taken run twice), and
    the connection goes on serving."""
    async with served(tmp_path) as (server, conn, transport):
        key = master_key(b"pw")
        digest = DigestManager(7, DigestType.CRC32C, b"pw")

        def add(request_id: int, entry_id: int) -> bytes:
            return encode_add_request(request_id, key,
                                      digest.encode(entry_id, entry_id - 1, entry_id + 1, b"x"))

        conn.data_received(add(1, 0))  # ledger 7 is created add by add
        await server.committer.wait_durable(server.storage.journal.append_seq)

        def broken(*_args: Any) -> int:
            raise RuntimeError("engine bug")

        server.storage.add_run = broken  # type: ignore[method-assign]
        seq = server.storage.journal.append_seq
        conn.data_received(add(2, 1) + add(3, 2))
        await asyncio.sleep(0)  # the answers' flush
        answers = Decoder("responses", 1 << 20)
        answers.feed(b"".join(transport.written))
        got = answers.next_messages()
        assert [(m.request_id, m.status) for m in got[1:]] == [  # type: ignore[union-attr]
            (2, StatusCode.IO_ERROR), (3, StatusCode.IO_ERROR)]
        assert server.storage.journal.append_seq == seq  # not retried add by add
        assert not transport.aborted
