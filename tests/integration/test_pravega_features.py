"""The real Pravega client's features (PyPI ``pravega`` 0.3.8, unmodified)
against Quire's controller and segment server, run by
``tests.support.pravega_stack`` in a child process on the in-memory tier-1
(the client's blocking calls hold the GIL): transactions, a reader group
from the tail, byte streams, listing, seal and delete, exactly-once across a
connection dropped between an append and its ack, and manual scaling while
a writer (its own process) writes and a reader group reads."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pravega_client
import pytest

from quire.streams import ControllerClient, RemoteSegmentStore, controller_resolver
from tests.integration.test_pravega_cluster import next_line
from tests.support.pravega_reading import read_slices

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}


class Stack:
    """The child process serving the controller and the segment server."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.pravega_stack", "500", *args], cwd=REPO,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready, "the controller and segment server did not start"
        self.ports: dict[str, int] = json.loads(self.proc.stdout.readline())
        self.uri = f"tcp://127.0.0.1:{self.ports['controller']}"

    def stop(self) -> list[dict[str, Any]]:
        """Close its stdin (it stops), and return the JSON lines it printed on exit."""
        try:
            out, _ = self.proc.communicate(b"", timeout=15)  # closes its stdin
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


@pytest.fixture
def stack() -> Iterator[Stack]:
    served = Stack()
    try:
        yield served
    finally:
        served.stop()


def by_key(events: list[str]) -> dict[str, list[int]]:
    """``key:n`` events grouped by key, in the order read."""
    grouped: dict[str, list[int]] = {}
    for data in events:
        key, number = data.split(":")
        grouped.setdefault(key, []).append(int(number))
    return grouped


def read_all(manager: pravega_client.StreamManager, group_name: str, scope: str,
             stream: str, count: int) -> list[str]:
    group = manager.create_reader_group(group_name, scope, stream)
    reader = group.create_reader("reader-1")
    return asyncio.run(read_slices(reader, count, time.monotonic() + 30))


def test_committed_transactions_are_read_and_aborted_ones_never(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("bank")
    assert manager.create_stream("bank", "ledger", 2)
    txn_writer = manager.create_transaction_writer("bank", "ledger", 7)
    committed = txn_writer.begin_txn()
    aborted = txn_writer.begin_txn()
    assert committed.get_txn_id() != aborted.get_txn_id()
    for n in range(10):
        for key in ("a", "b", "c"):
            committed.write_event(f"{key}:{n}", routing_key=key)
            aborted.write_event(f"{key}:{100 + n}", routing_key=key)
    assert committed.is_open() and aborted.is_open()
    committed.commit()
    aborted.abort()
    assert not committed.is_open() and not aborted.is_open()
    # events after the abort, on the same keys (so in the same segments): a
    # reader reaching them has passed wherever aborted events could have been
    writer = manager.create_writer("bank", "ledger")
    for key in ("a", "b", "c"):
        writer.write_event(f"{key}:10", routing_key=key)
    writer.flush()
    got = read_all(manager, "auditors", "bank", "ledger", 33)
    assert by_key(got) == {key: list(range(11)) for key in ("a", "b", "c")}
    # a finished transaction cannot be committed or aborted again
    with pytest.raises(pravega_client.TxnFailedException):
        aborted.commit()


def test_a_reader_group_from_the_tail_sees_only_later_events(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("shop")
    assert manager.create_stream("shop", "orders", 3)
    writer = manager.create_writer("shop", "orders")
    for n in range(20):
        writer.write_event(f"old:{n}", routing_key=f"k{n}")
    writer.flush()
    group = manager.create_reader_group("latest", "shop", "orders", True)
    reader = group.create_reader("reader-1")
    for n in range(20):
        writer.write_event(f"new:{n}", routing_key=f"k{n}")
    writer.flush()
    got = asyncio.run(read_slices(reader, 20, time.monotonic() + 30))
    assert sorted(by_key(got)["new"]) == list(range(20))
    assert set(by_key(got)) == {"new"}


def test_a_byte_stream_is_written_read_sought_and_truncated(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("files")
    assert manager.create_stream("files", "blob", 1)
    stream = manager.create_byte_stream("files", "blob")
    payload = bytes(range(256)) * 40  # 10240 bytes
    assert stream.write(payload[:4000]) == 4000
    assert stream.write(payload[4000:]) == len(payload) - 4000
    stream.flush()
    assert stream.current_tail_offset() == len(payload)
    assert stream.current_head_offset() == 0

    assert stream.seek(0, 0) == 0
    buffer = bytearray(len(payload))
    read = 0
    while read < len(payload):
        view = bytearray(len(payload) - read)
        n = stream.readinto(view)
        assert n > 0
        buffer[read:read + n] = view[:n]
        read += n
    assert bytes(buffer) == payload

    assert stream.seek(5000, 0) == 5000
    assert stream.tell() == 5000
    piece = bytearray(100)
    assert stream.readinto(piece) == 100
    assert bytes(piece) == payload[5000:5100]
    assert stream.seek(-40, 2) == len(payload) - 40  # from the end

    stream.truncate(6000)
    assert stream.current_head_offset() == 6000
    assert stream.current_tail_offset() == len(payload)
    assert stream.seek(6000, 0) == 6000
    assert stream.readinto(piece) == 100
    assert bytes(piece) == payload[6000:6100]


def test_scopes_and_streams_are_listed_sealed_and_deleted(stack: Stack) -> None:
    manager = pravega_client.StreamManager(stack.uri)
    for scope in ("alpha", "beta"):
        assert manager.create_scope(scope)
    for stream in ("one", "two", "three"):
        assert manager.create_stream("alpha", stream, 1)
    assert {"alpha", "beta"} <= set(manager.list_scope())
    assert sorted(manager.list_stream("alpha")) == ["one", "three", "two"]
    assert list(manager.list_stream("beta")) == []

    writer = manager.create_writer("alpha", "one")
    writer.write_event("before:0")
    writer.flush()
    assert manager.seal_stream("alpha", "one")
    with pytest.raises(Exception):  # noqa: B017 - the binding raises a plain Exception
        writer.write_event("after:0")
        writer.flush()
    for stream in ("one", "two", "three"):
        if stream != "one":
            assert manager.seal_stream("alpha", stream)
        assert manager.delete_stream("alpha", stream)
    assert list(manager.list_stream("alpha")) == []
    assert manager.delete_scope("alpha")
    assert manager.delete_scope("beta")
    assert not {"alpha", "beta"} & set(manager.list_scope())


def test_an_append_whose_ack_is_lost_with_its_connection_is_read_once() -> None:
    served = Stack("--cut-ack", "3")
    try:
        manager = pravega_client.StreamManager(served.uri)
        assert manager.create_scope("shop")
        assert manager.create_stream("shop", "orders", 1)
        writer = manager.create_writer("shop", "orders")
        for n in range(30):
            writer.write_event(f"key:{n}", routing_key="key")
        writer.flush()
        got = read_all(manager, "auditors", "shop", "orders", 30)
    finally:
        exit_lines = served.stop()
    assert by_key(got) == {"key": list(range(30))}
    # the proxy did cut a connection whose block the server had appended
    assert exit_lines[-1]["cuts"] == 1
    assert exit_lines[-1]["acks"] >= 3


async def split_segments_lengths(uri: str, scope: str, stream: str
                                 ) -> tuple[int, list[int]]:
    """The length of the sealed segment of the first scale and of its two
    successors."""
    async with ControllerClient(uri) as controller:
        segments = RemoteSegmentStore(controller_resolver(controller))
        try:
            current = await controller.current_segments(scope, stream)
            split = [s for s in current if s.epoch == 1]
            sealed = next(s for s in await controller.epoch_segments(scope, stream, 0)
                          if s.min_key == 0.0)
            assert (await segments.get_info(sealed.name)).sealed
            return ((await segments.get_info(sealed.name)).length,
                    [(await segments.get_info(s.name)).length for s in split])
        finally:
            await segments.close()


async def scale_first_segment(uri: str, scope: str, stream: str) -> list[tuple[float, float]]:
    """Split the stream's lowest segment in two through Quire's controller
    client; wait until the scale is done; the current key ranges."""
    async with ControllerClient(uri) as controller:
        segments = await controller.current_segments(scope, stream)
        low = min(segments, key=lambda s: s.min_key)
        middle = (low.min_key + low.max_key) / 2
        epoch = await controller.scale(scope, stream, [low.id],
                                       [(low.min_key, middle), (middle, low.max_key)])
        async with asyncio.timeout(20):
            while not await controller.scale_done(scope, stream, epoch):
                await asyncio.sleep(0.05)
        return sorted((s.min_key, s.max_key)
                      for s in await controller.current_segments(scope, stream))


def test_a_stream_scaled_while_written_and_read_keeps_every_event_once_in_order(
        stack: Stack) -> None:
    keys, per_key = 8, 150
    manager = pravega_client.StreamManager(stack.uri)
    assert manager.create_scope("shop")
    assert manager.create_stream("shop", "orders", 2)
    group = manager.create_reader_group("auditors", "shop", "orders")
    reader = group.create_reader("reader-1")
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pravega_writer", stack.uri, "shop", "orders",
         str(keys), str(per_key)], cwd=REPO, stdout=subprocess.PIPE, env=ENV)
    deadline = time.monotonic() + 60
    try:
        while next_line(writer, deadline).get("written", 0) < keys * per_key // 3:
            pass
        got = asyncio.run(read_slices(reader, 1, deadline, go_offline=False))  # before the split
        ranges = asyncio.run(scale_first_segment(stack.uri, "shop", "orders"))
        assert len(ranges) == 3 and ranges[0][0] == 0.0 and ranges[-1][1] == 1.0
        while "done" not in (line := next_line(writer, deadline)):
            assert "error" not in line, line
        assert line["done"] == keys * per_key
        got += asyncio.run(read_slices(reader, keys * per_key - len(got), deadline))
    finally:
        writer.kill()
        writer.wait()
    # the writer wrote on both sides of the split
    before, after = asyncio.run(split_segments_lengths(stack.uri, "shop", "orders"))
    assert before > 0 and len(after) == 2 and all(length > 0 for length in after)
    # every event once, in order per routing key across the split
    assert by_key(got) == {f"key{k}": list(range(per_key)) for k in range(keys)}
