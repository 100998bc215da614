"""Container ownership: a sticky, balanced assignment of containers to live
segment stores, and hosts converging on it (quire.segmentstore.ownership),
on the in-memory metadata store and tier-1 twin."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quire.metadata import LeaseState, MetadataStore, open_store
from quire.pravega_wire import WrongHost
from quire.segmentserver.replies import error_reply
from quire.segmentstore import (
    ContainerFencedError,
    ContainerNotOwnedError,
    SegmentStore,
    SegmentStoreConfig,
)
from quire.segmentstore.ownership import (
    ASSIGNMENT_KEY,
    HOSTS_PREFIX,
    ContainerOwnership,
    OwnershipSettings,
    balanced_assignment,
    live_hosts,
    owner_address,
    read_assignment,
)
from quire.testing.memory_data_log import MemoryDataLogs

COUNT = 4
FAST = OwnershipSettings(rebalance_interval_ms=50)


@given(count=st.integers(1, 40),
       hosts=st.sets(st.sampled_from("abcdefgh"), max_size=6),
       current=st.dictionaries(st.integers(0, 39), st.sampled_from("abcdefghij")))
def test_the_assignment_is_total_balanced_and_sticky(count: int, hosts: set[str],
                                                     current: dict[int, str]) -> None:
    live = sorted(hosts)
    result = balanced_assignment(count, live, current)
    if not live:
        assert result == {}
        return
    assert sorted(result) == list(range(count))
    assert set(result.values()) <= hosts
    loads = [list(result.values()).count(h) for h in live]
    assert max(loads) - min(loads) <= 1
    fair = math.ceil(count / len(live))
    # a container whose host lives keeps it unless that host was above its share
    for host in live:
        kept = [c for c in range(count) if current.get(c) == host]
        moved = [c for c in kept if result[c] != host]
        assert not moved or len(kept) > fair
    # and a balanced assignment of live hosts is left as it is
    assert balanced_assignment(count, live, result) == result


async def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` until it holds (a condition with a deadline)."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


class Host:
    """One segment store 'process': its own metadata session, store and ownership."""

    def __init__(self, uri: str, logs: MemoryDataLogs, name: str, lease_ms: int = 400) -> None:
        self.uri, self.logs, self.name, self.lease_ms = uri, logs, name, lease_ms

    async def start(self) -> Host:
        self.metadata: MetadataStore = await open_store(self.uri, lease_ms=self.lease_ms)
        self.store = await SegmentStore.open(
            None, (), config=SegmentStoreConfig(container_count=COUNT),
            metadata_store=self.metadata, open_log=lambda c: self.logs.open(f"c{c}"))
        self.ownership = ContainerOwnership(self.metadata, self.store, self.name,
                                            f"127.0.0.1:{1000 + ord(self.name[-1])}", FAST)
        await self.ownership.start()
        return self

    async def close(self) -> None:
        await self.ownership.close()
        await self.metadata.close()


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[str, MemoryDataLogs, list[Host]]]:
    uri = f"memory://ownership-{uuid.uuid4().hex}"
    hosts: list[Host] = []
    yield uri, MemoryDataLogs(), hosts
    for host in hosts:
        await host.close()


async def test_two_hosts_split_the_containers_and_one_takes_over_from_a_dead_one(
        cluster: tuple[str, MemoryDataLogs, list[Host]]) -> None:
    uri, logs, hosts = cluster
    a = await Host(uri, logs, "host-a").start()
    hosts.append(a)
    await until(lambda: set(a.store.container_ids) == set(range(COUNT)))
    names = [f"sc/st/{i}" for i in range(40)]
    for name in names:
        await a.store.create_segment(name)
        await a.store.append(name, name.encode())

    b = await Host(uri, logs, "host-b").start()
    hosts.append(b)
    # the second host gets half, the first gives them up: no container on both
    await until(lambda: len(b.store.container_ids) == COUNT // 2
                and len(a.store.container_ids) == COUNT // 2)
    assert set(a.store.container_ids).isdisjoint(b.store.container_ids)
    for c in b.store.container_ids:
        address = await owner_address(b.metadata, c)
        assert address == b.ownership.address
    for name in names:  # every segment where its container went, with its data
        owner = a.store if a.store.owns(name) else b.store
        assert (await owner.read(name, 0, 100)).data == name.encode()

    # host a loses its session (a partition from the store): it must stop serving,
    # and host b takes every container over, fencing a's tier-1 logs
    a_containers = set(a.store.container_ids)
    hosts.remove(a)
    await a.metadata.close()
    await until(lambda: set(b.store.container_ids) == set(range(COUNT)))
    assignment, _ = await read_assignment(b.metadata)
    assert set(assignment.values()) == {"host-b"}
    zombie_names = [n for n in names if a.store.container_for(n) in a_containers]
    for name in zombie_names:  # whatever a still has, nothing it takes is acknowledged
        with pytest.raises((ContainerFencedError, ContainerNotOwnedError)):
            await a.store.append(name, b"lost")
    for name in names:
        assert (await b.store.read(name, 0, 100)).data == name.encode()
    await until(lambda: not a.store.container_ids)  # a stopped them on losing its lease
    await a.ownership.close()


async def test_a_host_whose_lease_expired_and_came_back_at_once_registers_again(
        cluster: tuple[str, MemoryDataLogs, list[Host]]) -> None:
    """A host cut off from ZooKeeper past its session: the server drops its
    host record and the others take its containers.  Healed, its client
    reports the expiry and a new live session one right after the other,
    before the host's converging loop looks: it must still stop its
    containers and register again, and get its share back.  (Found by a
    network round: the segment store never rejoined.)"""
    uri, logs, hosts = cluster
    a = await Host(uri, logs, "host-a").start()
    b = await Host(uri, logs, "host-b").start()
    hosts += [a, b]
    await until(lambda: len(a.store.container_ids) == len(b.store.container_ids) == COUNT // 2)
    await b.metadata.delete_record(HOSTS_PREFIX + "host-a")  # the session expired
    await until(lambda: set(b.store.container_ids) == set(range(COUNT))
                and not a.store.container_ids)
    a.metadata._set_lease(LeaseState.EXPIRED)  # type: ignore[attr-defined]
    a.metadata._set_lease(LeaseState.LIVE)  # type: ignore[attr-defined]
    await until(lambda: len(a.store.container_ids) == len(b.store.container_ids) == COUNT // 2)
    assert "host-a" in await live_hosts(b.metadata)


async def test_a_host_restarted_before_its_old_lease_ended_waits_for_it_and_starts(
        cluster: tuple[str, MemoryDataLogs, list[Host]]) -> None:
    """kill -9 and a restart faster than the old session's timeout: the old
    run's host record is still there; the new run waits for it to go
    instead of refusing to start.  (Found by a network round: a segment
    store restarted 2-4 s after kill -9 exited with "record
    segmentstore/hosts/ss-1 already exists".)"""
    uri, logs, hosts = cluster
    dead = await open_store(uri, lease_ms=300)  # the killed run's session
    await dead.create_leased_record(HOSTS_PREFIX + "host-a", b'{"address": "gone:1"}')
    dead._heartbeat.cancel()  # type: ignore[attr-defined]  # it renews no more
    a = await asyncio.wait_for(Host(uri, logs, "host-a").start(), 10)
    hosts.append(a)
    await until(lambda: set(a.store.container_ids) == set(range(COUNT)))
    assert (await live_hosts(a.metadata))["host-a"] == a.ownership.address
    await dead.close()


async def test_a_host_that_closes_hands_its_containers_over(
        cluster: tuple[str, MemoryDataLogs, list[Host]]) -> None:
    uri, logs, hosts = cluster
    a = await Host(uri, logs, "host-a").start()
    b = await Host(uri, logs, "host-b").start()
    hosts.append(b)
    await until(lambda: len(a.store.container_ids) + len(b.store.container_ids) == COUNT
                and bool(a.store.container_ids) and bool(b.store.container_ids))
    await a.close()
    await until(lambda: set(b.store.container_ids) == set(range(COUNT)))
    await b.ownership.wait_converged()
    assert all(b.store.container(c).failure is None for c in range(COUNT))


async def test_a_host_whose_lease_is_uncertain_confirms_ownership_before_each_read(
        cluster: tuple[str, MemoryDataLogs, list[Host]]) -> None:
    """A host cut off from the metadata store (its lease UNCERTAIN) keeps
    its containers, but each read first writes a probe to its container's
    tier-1 log; once another store took the container over (fencing the
    log) and wrote on, the read is refused as not owned (WrongHost on the
    wire), never answered from the old state.  (Found by a network round: a
    quiet store cut off from ZooKeeper answered the length it had.)"""
    uri, logs, hosts = cluster
    a = await Host(uri, logs, "host-a", lease_ms=60_000).start()  # (no expiry meanwhile)
    hosts.append(a)
    await until(lambda: set(a.store.container_ids) == set(range(COUNT)))
    name = "sc/st/0"
    await a.store.create_segment(name)
    await a.store.append(name, b"x" * 10)
    c = a.store.container_for(name)
    oplog = a.store.container(c).operation_log

    written = oplog.operations_written
    assert (await a.store.get_info(name)).length == 10  # a live lease: nothing written
    assert (await a.store.read(name, 0, 100)).data == b"x" * 10
    assert oplog.operations_written == written and not a.store.confirm_reads

    a.metadata._heartbeat.cancel()  # type: ignore[attr-defined]  # cut off: no renewals
    a.metadata._set_lease(LeaseState.UNCERTAIN)  # type: ignore[attr-defined]
    await until(lambda: a.store.confirm_reads)  # (the watch calls back on the loop)
    assert (await a.store.get_info(name)).length == 10  # still its own: confirmed first
    assert oplog.operations_written == written + 1
    await asyncio.gather(a.store.read(name, 0, 100), a.store.get_attributes(name, [1]))
    assert oplog.operations_written == written + 3
    assert set(a.store.container_ids) == set(range(COUNT))  # it kept its containers
    a.metadata._set_lease(LeaseState.LIVE)  # type: ignore[attr-defined]  # back in time
    await until(lambda: not a.store.confirm_reads)
    await a.store.get_info(name)
    assert oplog.operations_written == written + 3
    a.metadata._set_lease(LeaseState.UNCERTAIN)  # type: ignore[attr-defined]  # cut off again
    await until(lambda: a.store.confirm_reads)

    # another store takes the container over (as once a's session is gone) and writes
    other_metadata = await open_store(uri)
    other = await SegmentStore.open(None, (c,), config=SegmentStoreConfig(container_count=COUNT),
                                    metadata_store=other_metadata,
                                    open_log=lambda i: logs.open(f"c{i}"))
    try:
        await other.append(name, b"y" * 10)
        for read in (a.store.get_info(name), a.store.read(name, 0, 100)):
            with pytest.raises(ContainerFencedError) as refused:
                await read
            assert isinstance(error_reply(refused.value, 1, name, 0), WrongHost)
        assert (await other.get_info(name)).length == 20
    finally:
        await other.close()
        await other_metadata.close()


async def test_a_read_answered_after_the_watch_never_puts_an_older_assignment_back(
        cluster: tuple[str, MemoryDataLogs, list[Host]], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """A host rereads the assignment before reopening a failed container.
    A read that started before the assigner's change can answer after the
    watch delivered the change, and the watch does not deliver it again: the
    host must keep the newer one.  (Found by the stream simulation, seed
    106609: a store went back to an assignment two versions old and never
    opened the container the newer one gave it.)"""
    uri, logs, hosts = cluster
    a = await Host(uri, logs, "host-a").start()
    hosts.append(a)
    await until(lambda: set(a.store.container_ids) == set(range(COUNT)))
    started_before = await a.metadata.read_record(ASSIGNMENT_KEY)  # the read's answer...
    b = await Host(uri, logs, "host-b").start()
    hosts.append(b)
    await until(lambda: len(a.store.container_ids) == len(b.store.container_ids) == COUNT // 2)
    newer = dict(a.ownership.assignment)

    async def late(key: str) -> object:  # ...arriving only now
        assert key == ASSIGNMENT_KEY
        return started_before
    monkeypatch.setattr(a.metadata, "read_record", late)
    failed = min(a.store.container_ids)
    takeover = logs.open(f"c{failed}")
    await takeover.initialize()  # another owner fences the log: the container fails
    with pytest.raises(ContainerFencedError):
        await a.store.container(failed).create_segment("sc/st/fenced")
    await takeover.close()
    await until(lambda: failed in a.store.container_ids
                and a.store.container(failed).failure is None)  # reopened, as its own
    assert a.ownership.assignment == newer
    assert set(a.store.container_ids).isdisjoint(b.store.container_ids)
