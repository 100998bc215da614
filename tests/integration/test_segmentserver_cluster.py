"""The segment server on real bookies (3 bookie processes, E3 W3 A2): a
writer's pipelined blocks and a table's versions over the wire, then the
store restarted on the same tier-1 logs (a new SegmentStore takes the
containers over) and served again: the writer's last event number survives,
its resent blocks are duplicates, every event is there once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quire.client import Client
from quire.pravega_wire import (
    KEY_NOT_EXISTS,
    NO_EVENT_NUMBER,
    AppendSetup,
    CreateSegment,
    CreateTableSegment,
    DataAppended,
    GetStreamSegmentInfo,
    ReadSegment,
    ReadTableEntriesDelta,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
    TableEntriesDeltaRead,
    TableEntriesUpdated,
    TableKey,
    TableValue,
    UpdateTableEntries,
)
from quire.segmentserver import SegmentServer
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from tests.support.cluster import Cluster
from tests.support.pravega_wire_client import WireClient, block, events_of

S = "sc/st/0.#epoch.0"
T = "sc/_rg_kvtable/0.#epoch.0"
WRITER = 0x1234 << 64 | 1
BLOCKS = 200


async def serve(client: Client) -> tuple[SegmentStore, SegmentServer]:
    store = await SegmentStore.open(client, range(2), config=SegmentStoreConfig(container_count=2))
    server = SegmentServer(store)
    await server.start("127.0.0.1", 0)
    return store, server


async def test_wire_appends_and_tables_on_bookies_across_a_store_restart(
        cluster: Cluster, connect: Callable[..., Awaitable[Client]]) -> None:
    client = await connect(cluster)
    store, server = await serve(client)
    c = await WireClient.connect(server.host, server.port)
    assert await c.request(CreateSegment(1, S, 0, 0, "")) == SegmentCreated(1, S)
    assert await c.request(SetupAppend(2, WRITER, S, "")) == \
        AppendSetup(2, S, WRITER, NO_EVENT_NUMBER)
    await c.send(*(block(WRITER, n, 1000 + n, b"event-%d" % n, b"+") for n in range(1, BLOCKS + 1)))
    acks = [await c.recv() for _ in range(BLOCKS)]
    assert [a.event_number for a in acks if isinstance(a, DataAppended)] == \
        list(range(1, BLOCKS + 1))
    assert await c.request(CreateTableSegment(3, T, "")) == SegmentCreated(3, T)
    updated = await c.request(UpdateTableEntries(4, T, "", (
        (TableKey(b"config", KEY_NOT_EXISTS), TableValue(b"v1")),), -1))
    assert isinstance(updated, TableEntriesUpdated)
    await c.close()
    await server.close()
    await store.close()

    other_client = await connect(cluster)
    store, server = await serve(other_client)  # takes both containers over, replays tier-1
    try:
        c = await WireClient.connect(server.host, server.port)
        assert await c.request(SetupAppend(5, WRITER, S, "")) == AppendSetup(5, S, WRITER, BLOCKS)
        await c.send(*(block(WRITER, n, 2000 + n, b"event-%d" % n, b"+")
                       for n in range(BLOCKS - 9, BLOCKS + 6)))
        acks = [await c.recv() for _ in range(15)]
        assert [a.request_id for a in acks if isinstance(a, DataAppended)] == \
            list(range(2000 + BLOCKS - 9, 2000 + BLOCKS + 6))
        info = await c.request(GetStreamSegmentInfo(6, S, ""))
        assert isinstance(info, StreamSegmentInfo)
        read = await c.request(ReadSegment(S, 0, info.write_offset, "", 7))
        assert isinstance(read, SegmentRead) and len(read.data) == info.write_offset
        expected: list[bytes] = []
        for n in range(1, BLOCKS + 6):
            expected += [b"event-%d" % n, b"+"]
        assert events_of(read.data) == expected
        delta = await c.request(ReadTableEntriesDelta(8, T, "", 0, 10))
        assert isinstance(delta, TableEntriesDeltaRead)
        assert delta.entries == ((TableKey(b"config", updated.updated_versions[0]),
                                  TableValue(b"v1")),)
        await c.close()
    finally:
        await server.close()
        await store.close()
