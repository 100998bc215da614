"""The MetadataStore contract, run against every driver (several stores in
one process; the multi-process cases are in test_metadata_multiprocess.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from quire.errors import (
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataVersionError,
    TransactionError,
)
from quire.metadata import (
    BookieInfo,
    CheckRecord,
    CreateLedger,
    CreateRecord,
    DeleteLedger,
    DeleteRecord,
    Election,
    ElectionView,
    Leadership,
    LeaseState,
    LedgerMetadata,
    MetadataStore,
    Op,
    UpdateLedger,
    UpdateRecord,
    Versioned,
    read_leader,
    watch_leader,
)
from quire.metadata.election import leader_key
from quire.security.ledger_keys import LedgerKeys
from quire.types import BookieState, DigestType, LedgerState, LedgerType
from tests.support.metadata import Target, next_matching, target_for

DRIVERS = ["memory", "sqlite", pytest.param("zk", marks=pytest.mark.zookeeper),
           pytest.param("zk-digest", marks=pytest.mark.zookeeper)]
"""``zk-digest``: the ZooKeeper store with digest credentials (every znode
it makes carries the ACL)."""
TIMED = pytest.mark.parametrize("target", DRIVERS[:3], indirect=True)
"""For the tests that wait out a lease or a session: ACLs change nothing
there, so the ``zk-digest`` variant does not spend seconds on them."""


@pytest.fixture(params=DRIVERS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    zookeeper = (request.getfixturevalue("zookeeper_server")
                 if request.param.startswith("zk") else None)
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


def ledger(**changes: Any) -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2,
                          ensembles=((0, ("b1", "b2", "b3")),), **changes)


def bookie(bookie_id: str, state: BookieState = BookieState.WRITABLE) -> BookieInfo:
    return BookieInfo(bookie_id, f"{bookie_id}.example:3181", state)


# --- ledgers -----------------------------------------------------------------


async def test_new_ledger_ids_start_at_one_and_increase(store: MetadataStore) -> None:
    ids = [await store.new_ledger_id() for _ in range(5)]
    assert ids[0] >= 1
    assert ids == sorted(set(ids))


async def test_ledger_lifecycle(store: MetadataStore) -> None:
    md = ledger()
    created = await store.create_ledger(7, md)
    assert created == Versioned(md, 0)
    assert await store.read_ledger(7) == created

    closed = md.with_(state=LedgerState.CLOSED, last_entry_id=41, length=4200)
    updated = await store.write_ledger(7, closed, created.version)
    assert updated == Versioned(closed, 1)
    assert await store.read_ledger(7) == updated

    with pytest.raises(MetadataVersionError):
        await store.write_ledger(7, md, created.version)
    with pytest.raises(MetadataVersionError):
        await store.delete_ledger(7, expected_version=0)
    assert await store.read_ledger(7) == updated

    await store.create_ledger(3, md)
    assert await store.list_ledgers() == [3, 7]
    await store.delete_ledger(7, expected_version=1)
    await store.delete_ledger(3)
    assert await store.list_ledgers() == []
    with pytest.raises(MetadataNotFoundError):
        await store.read_ledger(7)
    with pytest.raises(MetadataNotFoundError):
        await store.write_ledger(7, md, 1)
    with pytest.raises(MetadataNotFoundError):
        await store.delete_ledger(7)


async def test_creating_an_existing_ledger_fails(store: MetadataStore) -> None:
    await store.create_ledger(1, ledger())
    with pytest.raises(MetadataExistsError):
        await store.create_ledger(1, ledger(keys=LedgerKeys.of_password(b"other")))
    assert (await store.read_ledger(1)).value == ledger()


async def test_metadata_round_trips_through_the_store(store: MetadataStore) -> None:
    md = LedgerMetadata(
        ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
        ledger_type=LedgerType.VD_JOURNAL, digest_type=DigestType.HMAC_SHA1,
        keys=LedgerKeys.of_password(b"\x00secret\xff"), state=LedgerState.IN_RECOVERY,
        last_entry_id=99, length=12345,
        ensembles=((0, ("b1", "b2", "b3")), (50, ("b1", "b4", "b3")), (80, ("b5", "b4", "b3"))),
        custom_metadata={"application": b"quire-test", "raw": bytes(range(256))},
        creation_time_ms=1_700_000_000_000)
    await store.create_ledger(12, md)
    read = (await store.read_ledger(12)).value
    assert read == md
    assert read.ensemble_at(60) == ("b1", "b4", "b3")
    assert read.last_ensemble == ("b5", "b4", "b3")
    assert dict(read.custom_metadata) == dict(md.custom_metadata)


# --- transactions ------------------------------------------------------------


async def test_transaction_applies_every_op(store: MetadataStore) -> None:
    await store.create_ledger(1, ledger())
    await store.create_ledger(2, ledger())
    await store.create_record("logs/a", b"v0")
    await store.create_record("logs/b", b"gone soon")
    versions = await store.transaction([
        CreateLedger(3, ledger()),
        UpdateLedger(1, ledger(state=LedgerState.CLOSED), expected_version=0),
        DeleteLedger(2, expected_version=None),
        CreateRecord("logs/c", b"new"),
        UpdateRecord("logs/a", b"v1", expected_version=0),
        CheckRecord("logs/a", expected_version=1),
        DeleteRecord("logs/b", expected_version=0),
    ])
    assert versions == [0, 1, None, 0, 1, None, None]
    assert await store.list_ledgers() == [1, 3]
    assert (await store.read_ledger(1)).value.state is LedgerState.CLOSED
    assert await store.read_record("logs/a") == Versioned(b"v1", 1)
    assert await store.list_records("logs/") == ["logs/a", "logs/c"]
    assert await store.transaction([]) == []


@pytest.mark.parametrize(("failing_op", "cause"), [
    (UpdateRecord("logs/a", b"stale", expected_version=5), MetadataVersionError),
    (CreateLedger(1, ledger()), MetadataExistsError),
    (DeleteRecord("logs/missing", expected_version=None), MetadataNotFoundError),
    (CheckRecord("logs/a", expected_version=3), MetadataVersionError),
])
async def test_failed_transaction_applies_nothing(
        store: MetadataStore, failing_op: Op, cause: type[MetadataError]) -> None:
    await store.create_ledger(1, ledger())
    await store.create_record("logs/a", b"v0")
    with pytest.raises(TransactionError) as failure:
        await store.transaction([
            CreateLedger(2, ledger()),
            UpdateRecord("logs/a", b"v1", expected_version=0),
            failing_op,
            CreateRecord("logs/b", b"late"),
        ])
    assert failure.value.failed_index == 2
    assert isinstance(failure.value.cause, cause)
    assert await store.list_ledgers() == [1]
    assert await store.read_record("logs/a") == Versioned(b"v0", 0)
    assert await store.list_records("logs/") == ["logs/a"]


# --- records -----------------------------------------------------------------


async def test_record_compare_and_set(store: MetadataStore) -> None:
    assert await store.create_record("logs/x", b"a") == 0
    with pytest.raises(MetadataExistsError):
        await store.create_record("logs/x", b"b")
    assert await store.write_record("logs/x", b"b", 0) == 1
    with pytest.raises(MetadataVersionError):
        await store.write_record("logs/x", b"c", 0)
    assert await store.read_record("logs/x") == Versioned(b"b", 1)
    with pytest.raises(MetadataVersionError):
        await store.delete_record("logs/x", 0)
    await store.delete_record("logs/x", 1)
    with pytest.raises(MetadataNotFoundError):
        await store.read_record("logs/x")
    with pytest.raises(MetadataNotFoundError):
        await store.write_record("logs/x", b"d", 1)
    assert await store.create_record("logs/x", b"again") == 0


async def test_records_list_by_prefix(store: MetadataStore) -> None:
    keys = ["logs/mylog", "logs/mylog/ledgers/0000000001", "logs/mylog/ledgers/0000000002",
            "logs/mylog2/ledgers/0000000001", "logs/other", "streams/s1"]
    for key in keys:
        await store.create_record(key, key.encode())
    assert await store.list_records("") == keys
    assert await store.list_records("logs/mylog/") == keys[1:3]
    assert await store.list_records("logs/mylog") == keys[:4]
    assert await store.list_records("logs/mylog/ledgers/000000000") == keys[1:3]
    assert await store.list_records("logs/o") == ["logs/other"]
    assert await store.list_records("nothing/") == []
    assert await store.list_records("logs//") == []

    # deleting a key with sub-keys leaves the sub-keys; deleting them all leaves nothing
    await store.delete_record("logs/mylog")
    assert await store.list_records("logs/mylog/") == keys[1:3]
    for key in keys[1:]:
        await store.delete_record(key)
    assert await store.list_records("") == []


async def test_bad_names_are_rejected(store: MetadataStore) -> None:
    for key in ["", "/a", "a/", "a//b", "a/.hidden", "a\nb"]:
        with pytest.raises(ValueError):
            await store.create_record(key, b"")
    with pytest.raises(ValueError):
        await store.create_ledger(-1, ledger())
    with pytest.raises(ValueError):
        await store.write_cookie("a/b", b"", None)
    with pytest.raises(ValueError):
        await store.write_record("ok", b"", -1)


# --- cookies -----------------------------------------------------------------


async def test_cookie_compare_and_set(store: MetadataStore) -> None:
    with pytest.raises(MetadataNotFoundError):
        await store.read_cookie("bookie-1")
    assert await store.write_cookie("bookie-1", b"c0", None) == 0
    with pytest.raises(MetadataExistsError):
        await store.write_cookie("bookie-1", b"again", None)
    assert await store.write_cookie("bookie-1", b"c1", 0) == 1
    with pytest.raises(MetadataVersionError):
        await store.write_cookie("bookie-1", b"stale", 0)
    assert await store.read_cookie("bookie-1") == Versioned(b"c1", 1)
    with pytest.raises(MetadataVersionError):
        await store.delete_cookie("bookie-1", 0)
    await store.delete_cookie("bookie-1", 1)
    with pytest.raises(MetadataNotFoundError):
        await store.delete_cookie("bookie-1")


async def test_list_cookies(store: MetadataStore, stores: list[MetadataStore]) -> None:
    assert await store.list_cookies() == []
    for bookie_id in ("bookie-2", "127.0.0.1:3181", "bookie-10"):
        await store.write_cookie(bookie_id, b"c", None)
    await store.create_record("cookies", b"a record, not a cookie")
    expected = sorted(["bookie-2", "127.0.0.1:3181", "bookie-10"])
    assert await store.list_cookies() == expected
    assert await stores[0].list_cookies() == expected  # another store sees them
    await store.delete_cookie("bookie-2")
    assert await stores[0].list_cookies() == ["127.0.0.1:3181", "bookie-10"]


# --- bookie registry -----------------------------------------------------------


async def test_bookie_registry(store: MetadataStore) -> None:
    await store.register_bookie(bookie("b2"))
    await store.register_bookie(bookie("b1"))
    assert await store.list_bookies() == [bookie("b1"), bookie("b2")]

    await store.register_bookie(bookie("b1", BookieState.READ_ONLY))
    assert await store.list_bookies() == [bookie("b1", BookieState.READ_ONLY), bookie("b2")]

    await store.unregister_bookie("b2")
    await store.unregister_bookie("never-registered")
    assert await store.list_bookies() == [bookie("b1", BookieState.READ_ONLY)]


@TIMED
async def test_registration_is_renewed(target: Target, store: MetadataStore) -> None:
    await store.register_bookie(bookie("b1"))
    # not synchronisation: the registration must survive past its lease/session
    await asyncio.sleep(target.liveness_period * 1.5)
    assert await store.list_bookies() == [bookie("b1")]


@TIMED
async def test_a_bookie_id_live_elsewhere_cannot_be_registered(
        target: Target, store: MetadataStore) -> None:
    await store.register_bookie(bookie("b1"))
    other = await target.open()
    try:
        with pytest.raises(MetadataExistsError):  # after waiting for it to expire
            await other.register_bookie(bookie("b1", BookieState.READ_ONLY))
    finally:
        await other.close()
    assert await store.list_bookies() == [bookie("b1")]


async def test_closing_a_store_ends_its_registrations(
        target: Target, store: MetadataStore) -> None:
    other = await target.open()
    await other.register_bookie(bookie("b1"))
    assert await store.list_bookies() == [bookie("b1")]
    await other.close()
    assert await store.list_bookies() == []


# --- watches -----------------------------------------------------------------


async def test_ledger_watch_reports_changes(store: MetadataStore) -> None:
    seen: asyncio.Queue[Versioned[LedgerMetadata] | None] = asyncio.Queue()
    watch = store.watch_ledger(5, seen.put_nowait)
    assert await next_matching(seen, lambda v: True) is None  # the current state

    await store.create_ledger(5, ledger())
    await next_matching(seen, lambda v: v is not None and v.version == 0)
    closed = ledger(state=LedgerState.CLOSED)
    await store.write_ledger(5, closed, 0)
    assert await next_matching(seen, lambda v: v is not None and v.version == 1) == \
        Versioned(closed, 1)
    await store.delete_ledger(5)
    await next_matching(seen, lambda v: v is None)
    watch.cancel()
    assert watch.cancelled


async def test_bookie_watch_reports_changes(target: Target, store: MetadataStore) -> None:
    seen: asyncio.Queue[list[BookieInfo]] = asyncio.Queue()
    watch = store.watch_bookies(seen.put_nowait)
    assert await next_matching(seen, lambda v: True) == []

    other = await target.open()
    try:
        await other.register_bookie(bookie("b1"))
        await next_matching(seen, lambda v: v == [bookie("b1")])
        await other.register_bookie(bookie("b1", BookieState.READ_ONLY))
        await next_matching(seen, lambda v: v == [bookie("b1", BookieState.READ_ONLY)])
        await other.unregister_bookie("b1")
        await next_matching(seen, lambda v: v == [])
    finally:
        await other.close()
    watch.cancel()


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


@TIMED
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


async def test_bad_election_arguments_are_rejected(target: Target) -> None:
    store = await target.open()
    for group in ["", "a//b", ".hidden"]:
        with pytest.raises(ValueError):
            store.elect(group, "c0")
    with pytest.raises(ValueError):
        store.elect("auditor", "")
    with pytest.raises(ValueError):
        await store.create_leased_record("a/.b", b"")
    await store.close()
    with pytest.raises(MetadataError):
        store.elect("auditor", "c0")
