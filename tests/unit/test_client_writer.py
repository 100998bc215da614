"""The writer against in-process fake bookies: ordering, flow control,
ensemble changes, fencing, closing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from quire.client import WriteHandle
from quire.errors import (
    ClientClosedError,
    EnsembleChangeRefusedError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    QueueFullError,
    StatusCode,
)
from quire.protocol import FLAG_VOLATILE_DURABILITY
from quire.types import LedgerState, LedgerType
from tests.support.fake_bookie import FakeBookie, FakeCluster


@pytest.fixture
async def fakes() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster.start(5)
    yield cluster
    await cluster.close()


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def ensemble_bookies(fakes: FakeCluster, handle: WriteHandle) -> list[FakeBookie]:
    return [fakes.bookie(b) for b in handle.ensemble]


async def test_appends_complete_in_entry_order(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    first, second, third = ensemble_bookies(fakes, ledger)
    first.hold_adds = {0}
    second.hold_adds = {0}
    third.hold_adds = {0}  # entry 0 is stored everywhere but nobody answers yet
    order: list[int] = []
    futures = [ledger.append(b"e%d" % i) for i in range(3)]
    for future in futures:
        future.add_done_callback(lambda f: order.append(f.result()))
    assert ledger.last_add_pushed == 2
    pending = list(ledger._pending)  # white box: watch the acks arrive
    await eventually(lambda: pending[1].ack_count == 3 and pending[2].ack_count == 3)
    assert order == [] and ledger.last_add_confirmed == -1  # entry 0 holds them back
    first.release()  # one ack for entry 0: below the ack quorum
    await eventually(lambda: pending[0].ack_count == 1)
    assert order == []
    third.release()
    assert await asyncio.gather(*futures) == [0, 1, 2]
    assert order == [0, 1, 2]
    assert ledger.last_add_confirmed == 2
    second.release()
    await ledger.close()


async def test_at_most_max_pending_adds_on_the_wire(fakes: FakeCluster) -> None:
    client = await fakes.client(max_pending_adds=2)
    ledger = await client.create_ledger(1, 1, 1)
    (bookie,) = ensemble_bookies(fakes, ledger)
    bookie.hold_adds = set(range(100))
    futures = [ledger.append(b"x") for _ in range(6)]
    await eventually(lambda: len(bookie.held) == 2)
    assert len(ledger._pending) == 2 and len(ledger._queued) == 4  # white box
    assert bookie.requests.count("AddRequest") == 2
    bookie.release()
    assert await asyncio.gather(*futures) == list(range(6))


async def test_queue_beyond_max_queued_bytes_is_refused(fakes: FakeCluster) -> None:
    client = await fakes.client(max_pending_adds=1, max_queued_bytes=10)
    ledger = await client.create_ledger(1, 1, 1)
    (bookie,) = ensemble_bookies(fakes, ledger)
    bookie.hold_adds = {0}
    on_wire = ledger.append(b"a" * 100)  # the wire slot takes any size
    queued = ledger.append(b"b" * 8)
    with pytest.raises(QueueFullError):
        ledger.append(b"c" * 8)
    bookie.release()
    assert await on_wire == 0 and await queued == 1
    assert await ledger.append(b"d") == 2  # the refused append took no entry id
    await ledger.close()
    assert ledger.metadata.length == 100 + 8 + 1


async def test_close_records_the_end_and_later_appends_fail(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 2, 2, password=b"pw")
    ids = [ledger.append(b"%d" % i) for i in range(5)]
    await ledger.close()  # waits for the pending adds
    assert [f.result() for f in ids] == [0, 1, 2, 3, 4]
    stored = (await client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert stored.state is LedgerState.CLOSED
    assert stored.last_entry_id == 4 and stored.length == 5
    with pytest.raises(LedgerClosedError):
        ledger.append(b"late")
    await ledger.close()  # idempotent


async def test_failed_bookie_is_replaced_without_error(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2)
    assert await asyncio.gather(*[ledger.append(b"a%d" % i) for i in range(5)]) == list(range(5))
    victim = ensemble_bookies(fakes, ledger)[1]
    victim.add_status = StatusCode.IO_ERROR
    ids = await asyncio.gather(*[ledger.append(b"b%d" % i) for i in range(5)])
    assert ids == list(range(5, 10))
    await eventually(lambda: victim.bookie_id not in ledger.ensemble)
    ids = await asyncio.gather(*[ledger.append(b"c%d" % i) for i in range(5)])
    assert ids == list(range(10, 15))
    md = ledger.metadata
    # entries 5..9 may complete (two good acks) before the victim's error
    # arrives: the new fragment starts at the LAC + 1 of that moment
    assert len(md.ensembles) == 2
    (_, old), (first, new) = md.ensembles
    assert 5 <= first <= 10
    assert victim.bookie_id in old and victim.bookie_id not in new
    replacement = fakes.bookie(next(b for b in new if b not in old))
    await eventually(lambda: set(replacement.stored(ledger.ledger_id)) == set(range(first, 15)))
    stored = (await client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert stored.ensembles == md.ensembles
    await ledger.close()
    assert [e.data for e in await ledger.read(0, 14)] == \
        [b"%s%d" % (p, i) for p in (b"a", b"b", b"c") for i in range(5)]


async def test_failure_before_any_ack_replaces_the_fragment_in_place(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2)
    victim = ensemble_bookies(fakes, ledger)[0]
    victim.add_status = StatusCode.IO_ERROR
    assert await ledger.append(b"x") == 0
    assert len(ledger.metadata.ensembles) == 1
    assert victim.bookie_id not in ledger.metadata.ensembles[0][1]
    await ledger.close()


async def test_lost_connection_and_timeouts_trigger_ensemble_changes(fakes: FakeCluster) -> None:
    client = await fakes.client(add_entry_timeout_ms=300, timeout_check_interval_ms=20)
    ledger = await client.create_ledger(3, 3, 2)
    await ledger.append(b"0")
    silent, vanished = ensemble_bookies(fakes, ledger)[:2]
    silent.silent = True
    assert await ledger.append(b"1") == 1  # the two others answer in time
    await vanished.stop(fakes.registry)
    ids = await asyncio.gather(*[ledger.append(b"%d" % i) for i in range(2, 6)])
    assert ids == [2, 3, 4, 5]
    await eventually(lambda: not {silent.bookie_id, vanished.bookie_id} & set(ledger.ensemble))
    await ledger.close()
    assert [e.data for e in await ledger.read(0, 5)] == [b"%d" % i for i in range(6)]


async def test_no_replacement_left_fails_pending_adds(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(5, 5, 3)
    await ledger.append(b"ok")
    ensemble_bookies(fakes, ledger)[2].add_status = StatusCode.IO_ERROR
    ensemble_bookies(fakes, ledger)[3].add_status = StatusCode.IO_ERROR
    ensemble_bookies(fakes, ledger)[4].add_status = StatusCode.IO_ERROR
    with pytest.raises(NotEnoughBookiesError):
        await ledger.append(b"stuck")
    with pytest.raises(NotEnoughBookiesError):
        ledger.append(b"later")
    await ledger.close()  # closes at the LAC
    assert ledger.metadata.last_entry_id == 0


async def test_fenced_answer_fails_the_writer(fakes: FakeCluster) -> None:
    writer_client = await fakes.client()
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*[ledger.append(b"%d" % i) for i in range(3)])
    other = await fakes.client()
    recovered = await other.open_ledger(ledger.ledger_id, password=b"pw", recovery=True)
    assert recovered.last_add_confirmed == 2
    with pytest.raises(LedgerFencedError):
        await ledger.append(b"after fencing")
    with pytest.raises(LedgerFencedError):
        ledger.append(b"and again")
    with pytest.raises(LedgerFencedError):
        await ledger.close()
    md = (await other.metadata_store.read_ledger(ledger.ledger_id)).value
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 2


async def test_ensemble_change_after_recovery_started_is_fenced(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    await ledger.append(b"0")
    store = client.metadata_store
    current = await store.read_ledger(ledger.ledger_id)
    await store.write_ledger(ledger.ledger_id, current.value.with_(state=LedgerState.IN_RECOVERY),
                             current.version)
    for bookie in ensemble_bookies(fakes, ledger)[:2]:  # no ack quorum without a change
        bookie.add_status = StatusCode.IO_ERROR
    with pytest.raises(LedgerFencedError):
        await ledger.append(b"1")


async def test_vd_ledgers_carry_the_flag_and_refuse_ensemble_changes(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(3, 3, 2, ledger_type=LedgerType.VD_JOURNAL)
    await ledger.append(b"0")
    bookies = ensemble_bookies(fakes, ledger)
    assert all(b.add_flags == [FLAG_VOLATILE_DURABILITY] for b in bookies)
    bookies[0].add_status = bookies[1].add_status = StatusCode.IO_ERROR
    with pytest.raises(EnsembleChangeRefusedError):
        await ledger.append(b"1")


async def test_idle_writer_sends_explicit_lac(fakes: FakeCluster) -> None:
    client = await fakes.client(explicit_lac_interval_ms=30)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*[ledger.append(b"%d" % i) for i in range(3)])
    reader = await (await fakes.client()).open_ledger(ledger.ledger_id, password=b"pw",
                                                      recovery=False)
    assert reader.last_add_confirmed == -1
    deadline = asyncio.get_running_loop().time() + 5
    while await reader.read_last_add_confirmed() < 2:
        assert asyncio.get_running_loop().time() < deadline, "reader never saw LAC 2"
        await asyncio.sleep(0.02)
    assert [e.data for e in await reader.read(0, 2)] == [b"0", b"1", b"2"]
    assert any("WriteLacRequest" in b.requests for b in ensemble_bookies(fakes, ledger))


async def test_closing_the_client_fails_pending_adds(fakes: FakeCluster) -> None:
    client = await fakes.client()
    ledger = await client.create_ledger(1, 1, 1)
    ensemble_bookies(fakes, ledger)[0].hold_adds = {0}
    future = ledger.append(b"never acknowledged")
    await client.close()
    with pytest.raises(ClientClosedError):
        await future
