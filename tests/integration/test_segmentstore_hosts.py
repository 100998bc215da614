"""Segment store processes (``quire segmentstore start``) sharing containers
through the ownership records, and one taking over from another killed
with ``kill -9``: every acknowledged event there, the writer's number kept,
the dead host's address never answered as the owner again."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quire.metadata import MetadataStore, open_store
from quire.pravega_wire import (
    AppendBlockEnd,
    AppendSetup,
    CreateSegment,
    DataAppended,
    GetStreamSegmentInfo,
    ReadSegment,
    SegmentCreated,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
    WrongHost,
)
from quire.sandbox import SegmentStoreProcess, start_all, stop_all
from quire.segmentstore import owner_address
from quire.segmentstore.names import container_of
from quire.segmentstore.ownership import read_assignment
from tests.support.cluster import Cluster
from tests.support.pravega_wire_client import WireClient, event, events_of

COUNT = 4
SETTINGS = {"container_count": COUNT, "lease_ms": 1500, "rebalance_interval_ms": 100,
            "tail_read_wait_ms": 500, "metrics_port": 0}


@pytest.fixture
def hosts(cluster: Cluster, tmp_path: Path) -> Iterator[list[SegmentStoreProcess]]:
    procs = [SegmentStoreProcess(tmp_path / "hosts", cluster.metadata_uri, f"ss-{i}",
                                 **SETTINGS) for i in (1, 2)]
    start_all(procs)  # type: ignore[arg-type]
    yield procs
    stop_all(procs)  # type: ignore[arg-type]


async def until(check: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Poll ``check`` (sync or async) until it is truthy (a condition with a deadline)."""
    async with asyncio.timeout(timeout_s):
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)


def metric_values(address: str) -> dict[str, float]:
    """Unlabelled samples of a process's /metrics (labelled ones summed)."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


async def connect(address: str) -> WireClient:
    host, port = address.rsplit(":", 1)
    return await WireClient.connect(host, int(port))


async def test_two_hosts_serve_their_containers_and_one_takes_over_after_kill9(
        cluster: Cluster, hosts: list[SegmentStoreProcess]) -> None:
    metadata: MetadataStore = await open_store(cluster.metadata_uri)
    try:
        async def both_assigned() -> bool:
            assignment, _ = await read_assignment(metadata)
            return len(assignment) == COUNT and set(assignment.values()) == {"ss-1", "ss-2"}

        await until(both_assigned)
        name = "sc/st/0.#epoch.0"
        owner = await owner_address(metadata, container_of(name, COUNT))
        assert owner is not None
        other = next(h.address for h in hosts if h.address != owner)

        async def created() -> bool:  # the owner answers once its container is open
            client = await connect(owner)
            try:
                reply = await client.request(CreateSegment(1, name, 0, 0, ""))
                return isinstance(reply, SegmentCreated)
            finally:
                await client.close()

        await until(created)
        # the host that does not own the container says so, never "no such segment"
        client = await connect(other)
        assert isinstance(await client.request(ReadSegment(name, 0, 100, "", 2)), WrongHost)
        await client.close()

        writer_id = 0x1234
        client = await connect(owner)
        setup = await client.request(SetupAppend(3, writer_id, name, ""))
        assert isinstance(setup, AppendSetup) and setup.last_event_number < 0
        events = [b"event-%03d" % i for i in range(50)]
        for i in range(0, 50, 10):  # blocks of 10 events, event numbers i+1 .. i+10
            block = b"".join(event(e) for e in events[i:i + 10])
            await client.send(AppendBlockEnd(writer_id, len(block), block, 10, i + 10, 10 + i))
            reply = await client.recv()
            assert isinstance(reply, DataAppended) and reply.event_number == i + 10
        await client.close()

        owner_process = next(h for h in hosts if h.address == owner)
        # /metrics of the owner: the events it acknowledged, its containers, latency
        assert owner_process.metrics_address is not None
        scraped = metric_values(owner_process.metrics_address)
        assert scraped["quire_segmentstore_events_appended_total"] == 50
        assert scraped["quire_segmentstore_append_latency_seconds_count"] == 5
        assert scraped["quire_segmentstore_containers_hosted"] == COUNT // 2
        owner_process.kill9()

        async def taken_over() -> bool:
            address = await owner_address(metadata, container_of(name, COUNT))
            if address != other:
                return False
            probe = await connect(other)
            try:
                reply = await probe.request(GetStreamSegmentInfo(4, name, ""))
                return isinstance(reply, StreamSegmentInfo) and reply.exists
            finally:
                await probe.close()

        await until(taken_over)
        client = await connect(other)
        read = await client.request(ReadSegment(name, 0, 1 << 20, "", 5))
        assert isinstance(read, SegmentRead) and read.offset == 0
        assert events_of(read.data) == events
        setup = await client.request(SetupAppend(6, writer_id, name, ""))
        assert isinstance(setup, AppendSetup) and setup.last_event_number == 50
        # a writer that never saw the last ack resends it: a duplicate, not written twice
        block = b"".join(event(e) for e in events[40:])
        await client.send(AppendBlockEnd(writer_id, len(block), block, 10, 50, 7))
        reply = await client.recv()
        assert isinstance(reply, DataAppended) and reply.event_number == 50
        info = await client.request(GetStreamSegmentInfo(8, name, ""))
        assert isinstance(info, StreamSegmentInfo) and info.write_offset == len(read.data)
        await client.close()
    finally:
        await metadata.close()
