"""The real Pravega client (PyPI ``pravega`` 0.3.8, module ``pravega_client``,
unmodified) against Quire's controller and segment server, both in one
process (``tests.support.pravega_stack``; the client's blocking calls hold
the GIL, so the servers cannot live in the test's process): scope and stream
with 3 segments, a writer with routing keys, and a reader group whose first
reader reads a slice and goes offline and whose second takes over from the
positions kept in the group's table segment: every event read exactly once,
in order per routing key; then seal and delete."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pravega_client
import pytest

from tests.support.pravega_reading import Stack, by_routing_key, pravega_stack, read_slices

KEYS = 6
EVENTS_PER_KEY = 50


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with pravega_stack("1000") as started:
        yield started


def test_real_client_writes_and_a_reader_group_reads_each_event_once(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("shop")
    assert not manager.create_scope("shop")
    assert manager.create_stream("shop", "orders", 3)
    writer = manager.create_writer("shop", "orders")
    for n in range(EVENTS_PER_KEY):
        for k in range(KEYS):
            writer.write_event(f"key{k}:{n}", routing_key=f"key{k}")
    writer.flush()
    del writer

    total = KEYS * EVENTS_PER_KEY
    deadline = time.monotonic() + 60
    group = manager.create_reader_group("auditors", "shop", "orders")
    # the first reader takes every segment (it is alone when it joins), reads
    # one slice and leaves; the second takes over from the positions it left
    first = group.create_reader("reader-1")
    read_first = asyncio.run(read_slices(first, 1, deadline))
    assert 0 < len(read_first) < total
    second = group.create_reader("reader-2")
    read_second = asyncio.run(read_slices(second, total - len(read_first), deadline))
    # exactly once, and in order per routing key (one key lives in one segment)
    assert by_routing_key(read_first + read_second) == \
        {f"key{k}": list(range(EVENTS_PER_KEY)) for k in range(KEYS)}
    assert manager.seal_stream("shop", "orders")
    assert manager.delete_stream("shop", "orders")


def test_writer_exactly_once_across_dropped_connections(stack: Stack) -> None:
    """Up to 100 events in flight (``write_event`` returns before the ack)
    while the segment server drops every connection now and then: the
    writer reconnects, learns its last event number from SetupAppend and
    resends the rest; each event is read once, in order per routing key."""
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("faults")
    assert manager.create_stream("faults", "payments", 3)
    writer = manager.create_writer("faults", "payments", 100)
    total = 1200
    for n in range(total):
        writer.write_event(f"key{n % KEYS}:{n}", f"key{n % KEYS}")
        if n % 300 == 150:
            assert stack.drop_connections() >= 1
    writer.flush()
    group = manager.create_reader_group("checkers", "faults", "payments")
    reader = group.create_reader("checker")
    got = asyncio.run(read_slices(reader, total, time.monotonic() + 60))
    assert by_routing_key(got) == {f"key{k}": list(range(k, total, KEYS)) for k in range(KEYS)}


def test_byte_stream_write_read_seek_truncate(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("bytes")
    assert manager.create_stream("bytes", "blob", 1)
    stream = manager.create_byte_stream("bytes", "blob")
    assert stream.write(b"hello world, a byte stream") == 26
    stream.flush()
    assert (stream.current_head_offset(), stream.current_tail_offset()) == (0, 26)
    stream.seek(6, 0)
    buffer = bytearray(5)
    assert stream.readinto(buffer) == 5 and bytes(buffer) == b"world"
    stream.truncate(6)
    assert stream.current_head_offset() == 6
    stream.seek(13, 0)
    buffer = bytearray(13)
    assert stream.readinto(buffer) == 13 and bytes(buffer) == b"a byte stream"


def test_committed_transaction_is_read(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("txns")
    assert manager.create_stream("txns", "ledger", 2)
    txn_writer = manager.create_transaction_writer("txns", "ledger", 7)
    txn = txn_writer.begin_txn()
    for n in range(20):
        txn.write_event(f"key{n % 2}:{n}", f"key{n % 2}")
    txn.commit()
    group = manager.create_reader_group("txn-readers", "txns", "ledger")
    reader = group.create_reader("r")
    got = asyncio.run(read_slices(reader, 20, time.monotonic() + 60))
    assert by_routing_key(got) == {"key0": list(range(0, 20, 2)), "key1": list(range(1, 20, 2))}


def test_blocks_of_big_events(stack: Stack) -> None:
    """10 KiB events with 500 in flight: the client's blocks grow past what
    the store takes in one append (4 MiB) and are split by the server."""
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("big")
    assert manager.create_stream("big", "images", 1)
    writer = manager.create_writer("big", "images", 500)
    payloads = [b"%05d" % n + bytes([n % 251]) * 10_235 for n in range(600)]
    for payload in payloads:
        writer.write_event_bytes(payload)
    writer.flush()
    group = manager.create_reader_group("viewers", "big", "images")
    reader = group.create_reader("viewer")

    async def read() -> list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < len(payloads):
            piece = await asyncio.wait_for(reader.get_segment_slice_async(),
                                           deadline - time.monotonic())
            got += [event.data() for event in piece]
            reader.release_segment(piece)
        reader.reader_offline()
        return got

    assert asyncio.run(read()) == payloads
