"""One naming rule, at the door, and tier-2 holding every name it lets in.

The rule is Pravega's (``NameUtils``): the controller and the segment store
call the one function (:func:`quire.segmentstore.names.check_name`), the
controller answering INVALID_ARGUMENT (or the request's own INVALID_*_NAME
status) and the segment store the wire's ErrorMessage, which Quire's client
turns back into :class:`~quire.errors.InvalidNameError`.  Names Pravega
accepts that a file system cannot hold as they are (a leading ``.``, 201
and 255 characters) are written, flushed to a ``file://`` tier-2, checked
clean, and recovered from tier-2 alone with their real names.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from quire.controller_api import Controller_pb2 as pb
from quire.errors import InvalidNameError
from quire.metadata import open_store
from quire.pravega_wire import CreateSegment, CreateTableSegment, ErrorMessage, SegmentCreated
from quire.segmentserver import SegmentServer, SegmentServerConfig
from quire.segmentstore import SegmentStore, SegmentStoreConfig, SegmentType
from quire.segmentstore.disaster_recovery import recover
from quire.segmentstore.names import NAME_KINDS, check_name
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.tier2_check import check
from quire.segmentstore.tier2_reader import read_records
from quire.streams.refusals import error_of
from quire.testing.memory_data_log import MemoryDataLogs
from quire.testing.memory_writer_source import MemoryWriterSource
from quire.tier2 import chunk_path, open_chunk_storage
from tests.support.controller import make_cluster
from tests.support.fake_bookie import FakeCluster
from tests.support.pravega_wire_client import WireClient

ACCEPTED = {"scope": ["a", "A-b.c", ".", "..", ".hidden", "0" * 255],
            "stream": ["a", "A-b.c", ".", "..", ".hidden", "s" * 201, "s" * 255],
            "reader group": ["g", "g.1-x", "g" * 250]}
REFUSED = {"scope": ["", "_system", "a_b", "a/b", "a b", "é", "0" * 256, "a\n"],
           "stream": ["", "_RGx", "a_b", "a/b", "a b", "é", "s" * 256, "x#y", "x$y"],
           "reader group": ["", "g_1", "g" * 251, "g/h"]}
FLUSH = StorageWriterConfig(flush_threshold_bytes=1, flush_threshold_ms=0,
                            iteration_interval_ms=10)
ODD_NAMES = ["sc/.hidden/0.#epoch.0", "sc/../0.#epoch.0", "./st/1.#epoch.0",
             f"sc/{'s' * 201}/0.#epoch.0", f"{'c' * 255}/{'s' * 255}/0.#epoch.0"]
"""Stream segments of names Pravega accepts: a leading ".", "." and "..",
201 and 255 characters."""


def test_the_rule_is_pravegas() -> None:
    assert set(NAME_KINDS) == {"scope", "stream", "reader group", "segment"}
    for kind, names in ACCEPTED.items():
        for name in names:
            assert check_name(kind, name) == name
    for kind, names in REFUSED.items():
        for name in names:
            with pytest.raises(InvalidNameError, match=f"invalid {kind} name"):
                check_name(kind, name)
    for good in [*ODD_NAMES, "_system/containers/storage_metadata_0", "sc/g_kvtable/0.#epoch.0",
                 "sc/st/0.#epoch.0#transaction.00ff$attributes", "x"]:
        check_name("segment", good)
    for bad in ["", "/a", "a/", "a//b", "a b", "é/x", "a~b", "a@b", "x" * 1025, None]:
        with pytest.raises(InvalidNameError):
            check_name("segment", bad)


def test_every_accepted_name_has_a_chunk_path_a_file_system_holds() -> None:
    paths = set()
    for name in [*ODD_NAMES, "sc/st/0.#epoch.0", "/".join(["p" * 150] * 6)]:
        path = chunk_path(name)
        paths.add(path)
        assert len(path) <= 448
        for part in path.split("/"):
            assert part and not part.startswith(".") and len(part) <= 150
    assert chunk_path("sc/st/0.#epoch.0") == "sc/st/0.#epoch.0"  # names that fit stay as they are
    assert len(paths) == len(ODD_NAMES) + 2


async def test_the_container_and_its_twin_refuse_what_the_rule_refuses() -> None:
    store = await SegmentStore.open(None, [0], metadata_store=await open_store("memory://"),
                                    open_log=MemoryDataLogs().open,
                                    config=SegmentStoreConfig(container_count=1))
    twin = MemoryWriterSource()
    try:
        for bad in ("sc/st ü/0", "a//b", "x" * 1025):
            with pytest.raises(InvalidNameError):
                await store.create_segment(bad)
            with pytest.raises(InvalidNameError):
                await twin.create_segment(bad)
        for good in ODD_NAMES:
            await store.create_segment(good)
            await twin.create_segment(good)
    finally:
        await store.close()


@pytest.fixture
async def served() -> AsyncIterator[SegmentServer]:
    store = await SegmentStore.open(None, [0], metadata_store=await open_store("memory://"),
                                    open_log=MemoryDataLogs().open,
                                    config=SegmentStoreConfig(container_count=1))
    server = SegmentServer(store, SegmentServerConfig())
    await server.start("127.0.0.1", 0)
    yield server
    await server.close()
    await store.close()


async def test_the_wire_answers_a_refused_name_with_an_error_message_the_client_reports(
        served: SegmentServer) -> None:
    c = await WireClient.connect(served.host, served.port, True)
    for request_id, bad in enumerate(("sc/st ü/0", "sc//0"), 1):
        reply = await c.request(CreateSegment(request_id, bad, 0, 0, ""))
        assert isinstance(reply, ErrorMessage) and reply.error_code == 0, reply
        assert isinstance(error_of(reply, bad), InvalidNameError)
        reply = await c.request(CreateTableSegment(request_id + 10, bad, ""))
        assert isinstance(reply, ErrorMessage) and reply.error_code == 0, reply
    name = "sc/.hidden/0.#epoch.0"
    assert await c.request(CreateSegment(30, name, 0, 0, "")) == SegmentCreated(30, name)


async def test_the_controller_refuses_what_pravega_refuses_and_takes_what_it_takes() -> None:
    cluster = await make_cluster()
    stub = cluster.stub
    try:
        for scope in REFUSED["scope"]:
            answer = await stub.createScope(pb.ScopeInfo(scope=scope))
            assert answer.status == pb.CreateScopeStatus.INVALID_SCOPE_NAME, scope
        for scope in ("..", "c" * 255):
            answer = await stub.createScope(pb.ScopeInfo(scope=scope))
            assert answer.status == pb.CreateScopeStatus.SUCCESS, scope
        for stream in REFUSED["stream"]:
            answer = await stub.createStream(pb.StreamConfig(
                streamInfo=pb.StreamInfo(scope="..", stream=stream),
                scalingPolicy=pb.ScalingPolicy(minNumSegments=1)))
            assert answer.status == pb.CreateStreamStatus.INVALID_STREAM_NAME, stream
        for stream in (".hidden", "s" * 201, "s" * 255):
            answer = await stub.createStream(pb.StreamConfig(
                streamInfo=pb.StreamInfo(scope="c" * 255, stream=stream),
                scalingPolicy=pb.ScalingPolicy(minNumSegments=2)))
            assert answer.status == pb.CreateStreamStatus.SUCCESS, stream
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.getCurrentSegments(pb.StreamInfo(scope="a_b", stream="st"))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert cluster.controller is not None
        for group in REFUSED["reader group"]:
            answer = await stub.createReaderGroup(pb.ReaderGroupConfiguration(
                scope="..", readerGroupName=group))
            assert answer.status == pb.CreateReaderGroupResponse.INVALID_RG_NAME, group
            with pytest.raises(InvalidNameError):  # the core's door too, not only the RPC's
                await cluster.controller.core.create_reader_group("..", group, {})
        for group in ACCEPTED["reader group"]:
            answer = await stub.createReaderGroup(pb.ReaderGroupConfiguration(
                scope="..", readerGroupName=group))
            assert answer.status == pb.CreateReaderGroupResponse.SUCCESS, group
    finally:
        await cluster.stop()
        await cluster.metadata.close()


async def _iterated(store: SegmentStore) -> None:
    """Every writer ran 2 whole iterations after now: all is in tier-2."""
    start = {cid: w.iterations for cid, w in store.writers.items()}
    async with asyncio.timeout(30):
        while any(w.iterations < start[cid] + 2 for cid, w in store.writers.items()):
            await asyncio.sleep(0.01)  # polling the writers' progress, with a deadline


async def test_odd_names_are_flushed_checked_clean_and_recovered_with_their_real_names(
        tmp_path: Path) -> None:
    uri = (tmp_path / "tier2").as_uri()
    written = {name: f"bytes of {name[:20]}".encode() * 50 for name in ODD_NAMES}
    table = "sc/.kv_kvtable/0.#epoch.0"
    old = await FakeCluster.start(3)
    try:
        store = await SegmentStore.open(await old.client(), range(2), uri,
                                        config=SegmentStoreConfig(container_count=2,
                                                                  storage_writer=FLUSH))
        try:
            for name, data in written.items():
                await store.create_segment(name)
                await store.append(name, data)
            await store.create_segment(table, SegmentType.TABLE)
            await store.table_put(table, [(b"k", b"v", None)])
            await store.seal(ODD_NAMES[0])
            await _iterated(store)
        finally:
            await store.close()
    finally:
        await old.close()
    assert await check(uri) == []
    for directory, subdirectories, files in os.walk(tmp_path / "tier2"):
        for part in subdirectories + files:
            assert not part.startswith(".") and len(part) < 200, (directory, part)
    storage = await open_chunk_storage(uri)
    try:
        recorded = {name for cid in range(2)
                    for name in (await read_records(storage, cid)).layouts}
    finally:
        await storage.close()
    assert set(written) | {table} <= recorded
    new = await FakeCluster.start(3)
    try:
        client = await new.client()
        report = await recover(client, uri)
        assert report.orphans == () and report.segments == len(written) + 1
        store = await SegmentStore.open(client, range(2), uri,
                                        config=SegmentStoreConfig(storage_writer=FLUSH))
        try:
            for name, data in written.items():
                assert (await store.read(name, 0, 1 << 20)).data == data
            assert (await store.get_info(ODD_NAMES[0])).sealed
            assert [e and e.value for e in await store.table_get(table, [b"k"])] == [b"v"]
        finally:
            await store.close()
    finally:
        await new.close()
