"""Reads, passwords and recovery against in-process fake bookies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from quire.client import LedgerPasswords, SyncClient, WriteHandle
from quire.errors import (
    DigestMismatchError,
    EntryNotAvailableError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataNotFoundError,
    ReadBeyondLastAddConfirmedError,
    StatusCode,
    UnauthorizedError,
)
from quire.types import DigestType, LedgerState
from tests.support.fake_bookie import FakeBookie, FakeCluster


@pytest.fixture
async def fakes() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster.start(5)
    yield cluster
    await cluster.close()


def bookies_of(fakes: FakeCluster, ledger: WriteHandle) -> list[FakeBookie]:
    return [fakes.bookie(b) for b in ledger.ensemble]


async def written(fakes: FakeCluster, count: int, *, ensemble: int = 3, write: int = 3,
                  ack: int = 2, digest_type: DigestType = DigestType.CRC32C
                  ) -> WriteHandle:
    client = await fakes.client()
    ledger = await client.create_ledger(ensemble, write, ack, password=b"pw",
                                        digest_type=digest_type)
    ids = await asyncio.gather(*[ledger.append(b"entry-%d" % i) for i in range(count)])
    assert ids == list(range(count))
    return ledger


@pytest.mark.parametrize("digest_type", list(DigestType))
async def test_read_back_with_every_digest(fakes: FakeCluster, digest_type: DigestType) -> None:
    ledger = await written(fakes, 5, digest_type=digest_type)
    await ledger.close()
    reader = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                      recovery=False)
    assert reader.is_closed and reader.last_add_confirmed == 4
    entries = await reader.read(0, 4)
    assert [(e.entry_id, e.data) for e in entries] == [(i, b"entry-%d" % i) for i in range(5)]


async def test_reads_are_refused_beyond_the_lac(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 2)
    await ledger.append(b"entry-2")  # sent after 0 and 1 completed: carries LAC 1
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await ledger.read(0, 3)
    reader = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                      recovery=False)
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await reader.read(0, 0)  # an open ledger's reader knows no LAC yet
    assert await reader.read_last_add_confirmed() >= 1  # piggy-backed on entry 2
    await ledger.close()


async def test_wrong_password_is_refused(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 1)
    client = await fakes.client()
    with pytest.raises(UnauthorizedError):
        await client.open_ledger(ledger.ledger_id, password=b"nope", recovery=False)
    with pytest.raises(UnauthorizedError):
        await client.open_ledger(ledger.ledger_id, password=b"nope", recovery=True)
    md = (await client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert md.state is LedgerState.OPEN  # a refused recovery changed nothing


async def test_each_ledger_opens_with_the_password_it_was_made_with(fakes: FakeCluster) -> None:
    client = await fakes.client()
    rotated = LedgerPasswords(b"new", previous=(b"old",))
    old = await client.create_ledger(3, 3, 2, password=b"old")
    new = await client.create_ledger(3, 3, 2, password=rotated)  # its current password
    for ledger in (old, new):
        await ledger.append(b"x")
        await ledger.close()
    other = await fakes.client()
    for ledger_id in (old.ledger_id, new.ledger_id):
        reader = await other.open_ledger(ledger_id, password=rotated, recovery=True)
        assert [e.data for e in await reader.read(0, 0)] == [b"x"]
    await other.open_ledger(new.ledger_id, password=b"new", recovery=False)
    with pytest.raises(UnauthorizedError):
        await other.open_ledger(old.ledger_id, password=b"new", recovery=False)
    with pytest.raises(UnauthorizedError):
        await other.open_ledger(new.ledger_id, password=b"old", recovery=False)
    assert "new" not in repr(rotated) and "old" not in repr(rotated)


async def test_an_admin_recovers_with_the_stored_keys_no_password(fakes: FakeCluster) -> None:
    # an HMAC ledger: the stored mac key verifies its entries, the stored
    # master key fences it and writes the recovered entries back
    ledger = await written(fakes, 4, digest_type=DigestType.HMAC_SHA1)
    admin = await fakes.client()
    recovered = await admin.open_ledger_as_admin(ledger.ledger_id, recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == 3
    assert [e.data for e in await recovered.read(0, 3)] == [b"entry-%d" % i for i in range(4)]
    with pytest.raises(LedgerFencedError):
        await ledger.append(b"after the recovery")


async def test_corrupt_replica_is_skipped_and_all_corrupt_is_an_error(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 4)
    await ledger.close()
    bookies = bookies_of(fakes, ledger)
    bookies[0].corrupt_reads = True
    bookies[1].corrupt_reads = True
    assert [e.data for e in await ledger.read(0, 3)] == [b"entry-%d" % i for i in range(4)]
    bookies[2].corrupt_reads = True
    with pytest.raises(DigestMismatchError):
        await ledger.read(0, 3)


async def test_unknown_replica_answer_is_entry_not_available(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 2)
    await ledger.close()
    bookies = bookies_of(fakes, ledger)
    bookies[0].read_status = lambda ledger_id, entry_id: StatusCode.NO_SUCH_ENTRY
    bookies[1].read_status = lambda ledger_id, entry_id: StatusCode.UNKNOWN
    bookies[2].read_status = lambda ledger_id, entry_id: StatusCode.NO_SUCH_ENTRY
    with pytest.raises(EntryNotAvailableError):
        await ledger.read(1, 1)


async def test_reader_of_an_open_ledger_follows_ensemble_changes(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 3)
    reader = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                      recovery=False)
    for bookie in bookies_of(fakes, ledger)[:2]:
        bookie.add_status = StatusCode.IO_ERROR
    await asyncio.gather(*[ledger.append(b"entry-%d" % i) for i in range(3, 6)])
    assert len(ledger.metadata.ensembles) == 2
    assert await reader.read_last_add_confirmed() >= 2
    deadline = asyncio.get_running_loop().time() + 5
    while await reader.read_last_add_confirmed() < 4:  # piggy-backed on entry 5
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    assert [e.data for e in await reader.read(0, 4)] == [b"entry-%d" % i for i in range(5)]


async def test_striped_ledger_reads_back(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 20, ensemble=5, write=3, ack=2)
    await ledger.close()
    for bookie in bookies_of(fakes, ledger):  # each bookie holds only its stripes
        assert len(bookie.stored(ledger.ledger_id)) == 12
    assert [e.data for e in await ledger.read(0, 19)] == [b"entry-%d" % i for i in range(20)]


async def test_delete_ledger(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 1)
    await ledger.close()
    client = await fakes.client()
    await client.delete_ledger(ledger.ledger_id)
    with pytest.raises(MetadataNotFoundError):
        await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)


# --- recovery ---------------------------------------------------------------


async def test_recovery_keeps_a_single_surviving_copy_and_stops_at_a_gone_entry(
        fakes: FakeCluster) -> None:
    ledger = await written(fakes, 10)  # acknowledged: 0..9
    bookies = bookies_of(fakes, ledger)
    for bookie in bookies:
        bookie.hold_adds = {10, 11}
    ledger.append(b"entry-10")
    ledger.append(b"entry-11")
    deadline = asyncio.get_running_loop().time() + 5
    while not all(10 in b.stored(ledger.ledger_id) and 11 in b.stored(ledger.ledger_id)
                  for b in bookies):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    # entry 10 reached one bookie only (two say no: it was never acknowledged,
    # yet its one good copy makes it recoverable); entry 11 reached none: gone
    for bookie in bookies[1:]:
        del bookie.ledgers[ledger.ledger_id].entries[10]
    for bookie in bookies:
        del bookie.ledgers[ledger.ledger_id].entries[11]
    recovered = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                         recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == 10
    assert recovered.metadata.length == sum(len(b"entry-%d" % i) for i in range(11))
    for bookie in bookies:  # written back everywhere
        assert 10 in bookie.stored(ledger.ledger_id)
    assert [e.data for e in await recovered.read(0, 10)] == [b"entry-%d" % i for i in range(11)]


async def test_recovery_with_unknown_answers_fails_and_changes_nothing(
        fakes: FakeCluster) -> None:
    ledger = await written(fakes, 3)
    bookies = bookies_of(fakes, ledger)
    bookies[0].read_status = lambda ledger_id, entry_id: (
        StatusCode.UNKNOWN if entry_id >= 0 else None)
    bookies[1].read_status = bookies[0].read_status
    bookies[2].read_status = lambda ledger_id, entry_id: (
        StatusCode.NO_SUCH_ENTRY if entry_id >= 0 else None)
    client = await fakes.client()
    with pytest.raises(LedgerRecoveryError):
        await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=True)
    md = (await client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert md.state is LedgerState.IN_RECOVERY  # not closed on a guess
    for bookie in bookies:
        bookie.read_status = None
    recovered = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=True)
    assert recovered.last_add_confirmed == 2


async def test_recovery_fails_when_fencing_cannot_reach_coverage(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 2)
    for bookie in bookies_of(fakes, ledger)[:2]:
        bookie.silent = True
    client = await fakes.client(read_timeout_ms=200, timeout_check_interval_ms=20)
    with pytest.raises(LedgerRecoveryError):
        await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=True)


async def test_concurrent_recoveries_agree(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 6)
    for bookie in bookies_of(fakes, ledger):
        bookie.hold_adds = {6}
    ledger.append(b"entry-6")  # stored everywhere, never acknowledged
    first, second = await fakes.client(), await fakes.client()
    one, two = await asyncio.gather(
        first.open_ledger(ledger.ledger_id, password=b"pw", recovery=True),
        second.open_ledger(ledger.ledger_id, password=b"pw", recovery=True))
    assert one.metadata.last_entry_id == two.metadata.last_entry_id == 6
    assert one.metadata.length == two.metadata.length


async def test_recovering_a_closed_ledger_returns_it(fakes: FakeCluster) -> None:
    ledger = await written(fakes, 2)
    await ledger.close()
    recovered = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                         recovery=True)
    assert recovered.last_add_confirmed == 1


async def test_recovering_an_empty_ledger(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    recovered = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                         recovery=True)
    assert recovered.last_add_confirmed == -1 and recovered.metadata.length == 0


async def test_sync_client(fakes: FakeCluster) -> None:
    # the blocking calls run in a worker thread: this loop keeps serving the fakes
    await asyncio.to_thread(use_sync_client, fakes.uri)


def use_sync_client(uri: str) -> None:
    with SyncClient.connect(uri) as client:
        ledger = client.create_ledger(3, 3, 2, password=b"pw")
        assert ledger.append(b"first") == 0
        assert ledger.append_many([b"x%d" % i for i in range(50)]) == list(range(1, 51))
        assert ledger.last_add_confirmed == 50 and ledger.last_add_pushed == 50
        ledger.close()
        reader = client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
        assert [e.data for e in reader.read(49, 50)] == [b"x48", b"x49"]
        assert reader.read_last_add_confirmed() == 50

