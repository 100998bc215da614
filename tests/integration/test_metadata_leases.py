"""The MetadataStore contract for leased records, record watches and leader
election, run against every driver (several stores in one process; the
multi-process cases are in test_metadata_multiprocess.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from quire.errors import MetadataError, MetadataExistsError, MetadataNotFoundError
from quire.metadata import (
    CheckRecord,
    Election,
    ElectionView,
    Leadership,
    LeaseState,
    MetadataStore,
    UpdateRecord,
    Versioned,
    read_leader,
    watch_leader,
)
from quire.metadata.election import leader_key
from tests.support.metadata import LEASE_MS, Target, target_for

T = TypeVar("T")

DRIVERS = ["memory", "sqlite", pytest.param("zk", marks=pytest.mark.zookeeper)]


@pytest.fixture(params=DRIVERS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    zookeeper = request.getfixturevalue("zookeeper_server") if request.param == "zk" else None
    return target_for(request.param, tmp_path, zookeeper)


@pytest.fixture
async def store(target: Target) -> AsyncIterator[MetadataStore]:
    store = await target.open()
    yield store
    await store.close()


@pytest.fixture
async def stores(target: Target) -> AsyncIterator[list[MetadataStore]]:
    """Three more stores on the same target (closing one twice is harmless)."""
    opened = [await target.open() for _ in range(3)]
    yield opened
    for store in opened:
        await store.close()


async def next_matching(queue: asyncio.Queue[T], predicate: Callable[[T], bool],
                        timeout: float = 10.0) -> T:
    """The first value from ``queue`` that satisfies ``predicate``."""
    async def scan() -> T:
        while not predicate(value := await queue.get()):
            pass
        return value
    return await asyncio.wait_for(scan(), timeout)


async def leader_among(elections: list[Election], timeout: float = 10.0) -> Election:
    """The one election that leads, once all of them agree on it."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = [e for e in elections if e.is_leader]
        assert len(leaders) <= 1, f"two leaders: {[e.candidate for e in leaders]}"
        if leaders and all(e.leader == leaders[0].candidate for e in elections):
            return leaders[0]
        assert time.monotonic() < deadline, [e.state for e in elections]
        await asyncio.sleep(0.02)


# --- leased records --------------------------------------------------------------


async def test_a_leased_record_is_a_record_while_its_store_is_open(
        target: Target, store: MetadataStore) -> None:
    owner = await target.open()
    try:
        assert await owner.create_leased_record("locks/a", b"mine") == 0
        with pytest.raises(MetadataExistsError):
            await store.create_leased_record("locks/a", b"theirs")
        with pytest.raises(MetadataExistsError):
            await store.create_record("locks/a", b"theirs")
        assert await store.read_record("locks/a") == Versioned(b"mine", 0)
        assert await store.list_records("locks/") == ["locks/a"]
        # written by another store, in a transaction too: still leased by its owner
        assert await store.write_record("locks/a", b"changed", 0) == 1
        assert await store.transaction([CheckRecord("locks/a", 1),
                                        UpdateRecord("locks/a", b"again", 1)]) == [None, 2]
        await store.create_record("locks/a/durable", b"stays")
        assert owner.lease is LeaseState.LIVE
    finally:
        await owner.close()
    assert owner.lease is LeaseState.CLOSED
    with pytest.raises(MetadataNotFoundError):
        await store.read_record("locks/a")
    assert await store.list_records("locks/") == ["locks/a/durable"]
    assert await store.create_record("locks/a", b"durable now") == 0


async def test_a_deleted_leased_record_is_gone_for_good(
        target: Target, store: MetadataStore) -> None:
    owner = await target.open()
    try:
        await owner.create_leased_record("locks/b", b"1")
        with pytest.raises(MetadataNotFoundError):
            await store.delete_record("locks/other")
        await store.delete_record("locks/b", 0)
        with pytest.raises(MetadataNotFoundError):
            await owner.read_record("locks/b")
        await store.create_record("locks/b", b"durable")  # not leased: outlives the owner
        assert await owner.create_leased_record("locks/c", b"2") == 0
    finally:
        await owner.close()
    assert await store.read_record("locks/b") == Versioned(b"durable", 0)
    with pytest.raises(MetadataNotFoundError):
        await store.read_record("locks/c")


async def test_a_leased_record_outlives_its_lease_while_renewed(
        target: Target, store: MetadataStore) -> None:
    leases: asyncio.Queue[LeaseState] = asyncio.Queue()
    store.watch_lease(leases.put_nowait)
    await store.create_leased_record("locks/d", b"held")
    # not synchronisation: the record must survive past its lease/session
    await asyncio.sleep(target.liveness_period * 1.5)
    assert await store.read_record("locks/d") == Versioned(b"held", 0)
    assert store.lease is LeaseState.LIVE
    assert leases.get_nowait() is LeaseState.LIVE
    assert leases.empty()  # never uncertain meanwhile


async def test_closing_a_store_ends_its_lease(target: Target) -> None:
    store = await target.open()
    leases: asyncio.Queue[LeaseState] = asyncio.Queue()
    store.watch_lease(leases.put_nowait)
    assert await next_matching(leases, lambda s: True) is LeaseState.LIVE
    await store.close()
    assert store.lease is LeaseState.CLOSED
    assert await next_matching(leases, lambda s: True) is LeaseState.CLOSED


async def test_record_watch_reports_changes(target: Target, store: MetadataStore) -> None:
    seen: asyncio.Queue[Versioned[bytes] | None] = asyncio.Queue()
    watch = store.watch_record("locks/e", seen.put_nowait)
    assert await next_matching(seen, lambda v: True) is None  # the current state

    await store.create_record("locks/e", b"v0")
    assert await next_matching(seen, lambda v: v is not None) == Versioned(b"v0", 0)
    await store.write_record("locks/e", b"v1", 0)
    assert await next_matching(seen, lambda v: v is not None and v.version == 1) == \
        Versioned(b"v1", 1)
    await store.delete_record("locks/e")
    await next_matching(seen, lambda v: v is None)

    owner = await target.open()
    try:
        await owner.create_leased_record("locks/e", b"leased")
        assert await next_matching(seen, lambda v: v is not None) == Versioned(b"leased", 0)
    finally:
        await owner.close()
    await next_matching(seen, lambda v: v is None)
    watch.cancel()
    assert watch.cancelled


# --- elections -------------------------------------------------------------------


async def test_one_candidate_leads_and_everyone_agrees(
        store: MetadataStore, stores: list[MetadataStore]) -> None:
    elections = [s.elect("auditor", f"c{i}") for i, s in enumerate(stores)]
    leader = await leader_among(elections)
    await leader.wait_leader()  # returns at once
    assert await read_leader(store, "auditor") == leader.candidate
    for election in elections:
        if election is not leader:
            assert election.state is Leadership.FOLLOWER
            assert election.leader == leader.candidate
    # another group is another election
    other = stores[0].elect("containers/7", "c0")
    await other.wait_leader()
    assert await read_leader(store, "containers/7") == "c0"
    assert await read_leader(store, "nobody") is None


async def test_closing_the_leaders_store_elects_another(
        target: Target, store: MetadataStore, stores: list[MetadataStore]) -> None:
    seen: asyncio.Queue[str | None] = asyncio.Queue()
    watch_leader(store, "auditor", seen.put_nowait)
    elections = [s.elect("auditor", f"c{i}") for i, s in enumerate(stores)]
    first = await leader_among(elections)
    await next_matching(seen, lambda name: name == first.candidate)

    views: asyncio.Queue[ElectionView] = asyncio.Queue()
    first.watch(views.put_nowait)
    await stores[elections.index(first)].close()
    assert first.state is Leadership.ENDED and not first.is_leader
    await next_matching(views, lambda v: v.state is Leadership.ENDED)

    rest = [e for e in elections if e is not first]
    second = await leader_among(rest, timeout=target.liveness_period + 10)
    assert await next_matching(seen, lambda name: name not in (None, first.candidate)) == \
        second.candidate


async def test_resigning_hands_over_and_a_watcher_sees_each_leader(
        store: MetadataStore, stores: list[MetadataStore]) -> None:
    seen: asyncio.Queue[str | None] = asyncio.Queue()
    watch_leader(store, "auditor", seen.put_nowait)
    assert await next_matching(seen, lambda name: True) is None

    elections = [s.elect("auditor", f"c{i}") for i, s in enumerate(stores)]
    waiting = [asyncio.ensure_future(e.wait_leader()) for e in elections]
    led = []
    while len(led) < 3:
        leader = await leader_among([e for e in elections if e.state is not Leadership.ENDED])
        assert await next_matching(seen, lambda name: name is not None) == leader.candidate
        assert waiting[elections.index(leader)].done()
        led.append(leader.candidate)
        await leader.resign()
        assert leader.state is Leadership.ENDED
        with pytest.raises(MetadataError):
            await leader.wait_leader()
    assert sorted(led) == ["c0", "c1", "c2"]
    assert await next_matching(seen, lambda name: True) is None
    assert await read_leader(store, "auditor") is None
    await elections[0].resign()  # again: no effect


async def test_a_candidates_view_follows_its_election(stores: list[MetadataStore]) -> None:
    first = stores[0].elect("auditor", "c0")
    await first.wait_leader()
    views: asyncio.Queue[ElectionView] = asyncio.Queue()
    second = stores[1].elect("auditor", "c1")
    second.watch(views.put_nowait)
    assert await next_matching(views, lambda v: v.leader is not None) == \
        ElectionView(Leadership.FOLLOWER, "c0")
    await first.resign()
    assert await next_matching(views, lambda v: v.leader != "c0") == \
        ElectionView(Leadership.LEADER, "c1")
    await second.resign()
    assert await next_matching(views, lambda v: True) == \
        ElectionView(Leadership.ENDED, "c1")


async def test_candidates_of_one_name_are_told_apart(stores: list[MetadataStore]) -> None:
    """A restarted candidate keeps its name but not the previous bid."""
    first = stores[0].elect("auditor", "same")
    await first.wait_leader()
    second = stores[1].elect("auditor", "same")
    views: asyncio.Queue[ElectionView] = asyncio.Queue()
    second.watch(views.put_nowait)
    assert await next_matching(views, lambda v: v.leader is not None) == \
        ElectionView(Leadership.FOLLOWER, "same")
    assert first.is_leader and not second.is_leader
    assert (await stores[2].read_record(leader_key("auditor"))).version == 0


# --- embedded drivers: a leader whose store cannot renew ---------------------------


@pytest.mark.parametrize("driver", ["memory", "sqlite"])
async def test_a_leader_that_cannot_renew_steps_down_before_another_leads(
        driver: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = target_for(driver, tmp_path, None)
    cut_off, other = await target.open(), await target.open()
    try:
        first = cut_off.elect("auditor", "a")
        await first.wait_leader()
        second = other.elect("auditor", "b")
        loop = asyncio.get_running_loop()
        changes: list[tuple[float, str, ElectionView]] = []
        first.watch(lambda view: changes.append((loop.time(), "a", view)))
        second.watch(lambda view: changes.append((loop.time(), "b", view)))

        async def unreachable(*_args: object) -> None:
            raise MetadataError("injected: the store cannot be reached")

        # Every transaction of this store fails from now on (the driver's seam).
        monkeypatch.setattr(cut_off, "_write", unreachable)
        monkeypatch.setattr(cut_off, "_read", unreachable)
        await asyncio.wait_for(second.wait_leader(), LEASE_MS / 1000 + 10)
        doubted = next(t for t, who, v in changes if who == "a"
                       and v.state is Leadership.UNCERTAIN)
        taken_over = next(t for t, who, v in changes if who == "b"
                          and v.state is Leadership.LEADER)
        assert doubted < taken_over
        assert cut_off.lease is LeaseState.UNCERTAIN and not first.is_leader

        # Reachable again: its next renewal finds the lease expired, and it
        # campaigns again, as a follower.
        views: asyncio.Queue[ElectionView] = asyncio.Queue()
        first.watch(views.put_nowait)
        leases: asyncio.Queue[LeaseState] = asyncio.Queue()
        cut_off.watch_lease(leases.put_nowait)
        monkeypatch.undo()
        await next_matching(leases, lambda state: state is LeaseState.EXPIRED)
        await next_matching(views, lambda v: v == ElectionView(Leadership.FOLLOWER, "b"))
        assert second.is_leader
        await second.resign()
        await first.wait_leader()  # a new lease
        assert cut_off.lease is LeaseState.LIVE
    finally:
        await cut_off.close()
        await other.close()
