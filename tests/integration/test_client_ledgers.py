"""The ledger client against real bookie processes: writing, reading,
striping, fencing, passwords, tailing (no bookie is killed here: one cluster
serves the whole module)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quire.client import Client, SyncClient, WriteHandle
from quire.errors import (
    LedgerClosedError,
    LedgerFencedError,
    MetadataNotFoundError,
    NotEnoughBookiesError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quire.security import LedgerKeys
from quire.types import DigestType, LedgerState
from tests.support.cluster import Cluster

Connect = Callable[..., Awaitable[Client]]


def payload(i: int) -> bytes:
    return b"entry-%d-" % i + bytes([i % 251]) * (i % 97)


async def test_write_close_and_read_back(shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await client.create_ledger(3, 3, 2, password=b"pw",
                                        custom_metadata={"owner": b"etl"})
    ids = await asyncio.gather(*[ledger.append(payload(i)) for i in range(100)])
    assert ids == list(range(100))
    assert ledger.last_add_confirmed == 99 and ledger.last_add_pushed == 99
    await ledger.close()
    with pytest.raises(LedgerClosedError):
        ledger.append(b"after close")
    reader = await (await connect(shared_cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                              recovery=False)
    md = reader.metadata
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 99
    assert md.length == sum(len(payload(i)) for i in range(100))
    assert md.custom_metadata == {"owner": b"etl"}
    entries = await reader.read(0, 99)
    assert [(e.entry_id, e.data) for e in entries] == [(i, payload(i)) for i in range(100)]
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await reader.read(99, 100)


async def test_striped_ledger_reads_back_whole(shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await client.create_ledger(5, 3, 2, password=b"pw",
                                        digest_type=DigestType.HMAC_SHA1)
    assert len(set(ledger.ensemble)) == 5
    await asyncio.gather(*[ledger.append(payload(i)) for i in range(60)])
    await ledger.close()
    reader = await (await connect(shared_cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                              recovery=False)
    assert [e.data for e in await reader.read(0, 59)] == [payload(i) for i in range(60)]


async def test_not_enough_bookies(shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    with pytest.raises(NotEnoughBookiesError):
        await client.create_ledger(6, 3, 2)


async def test_wrong_password_is_refused_by_client_and_bookies(
        shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await client.create_ledger(3, 3, 2, password=b"right")
    await ledger.append(b"secret")
    other = await connect(shared_cluster)
    for recovery in (False, True):
        with pytest.raises(UnauthorizedError):
            await other.open_ledger(ledger.ledger_id, password=b"wrong", recovery=recovery)
    # metadata that lies about the password: the bookies refuse the master key
    store = other.metadata_store
    current = await store.read_ledger(ledger.ledger_id)
    await store.write_ledger(ledger.ledger_id, current.value.with_(
        keys=LedgerKeys.of_password(b"wrong")), current.version)
    with pytest.raises(UnauthorizedError):
        await other.open_ledger(ledger.ledger_id, password=b"wrong", recovery=True)


async def test_fencing_stops_the_old_writer(shared_cluster: Cluster, connect: Connect) -> None:
    writer_client = await connect(shared_cluster)
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    await asyncio.gather(*[ledger.append(payload(i)) for i in range(20)])
    recovered = await (await connect(shared_cluster)).open_ledger(
        ledger.ledger_id, password=b"pw", recovery=True)
    assert recovered.is_closed and recovered.last_add_confirmed == 19
    with pytest.raises(LedgerFencedError):
        await ledger.append(b"too late")
    with pytest.raises(LedgerFencedError):
        await ledger.close()
    assert [e.data for e in await recovered.read(0, 19)] == [payload(i) for i in range(20)]
    md = (await writer_client.metadata_store.read_ledger(ledger.ledger_id)).value
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 19


async def keep_writing(ledger: WriteHandle, acknowledged: list[int],
                       started: asyncio.Event) -> BaseException:
    """Append with up to 32 adds in flight until the writer fails; return why."""
    window = asyncio.Semaphore(32)
    failure: list[BaseException] = []

    def done(future: asyncio.Future[int]) -> None:
        window.release()
        if future.exception() is not None:
            failure.append(future.exception())  # type: ignore[arg-type]
        else:
            acknowledged.append(future.result())
            if len(acknowledged) >= 50:
                started.set()

    entry_id = 0
    while not failure:
        await window.acquire()
        try:
            ledger.append(payload(entry_id)).add_done_callback(done)
        except LedgerFencedError as e:
            return e
        entry_id += 1
    return failure[0]


async def test_concurrent_recoveries_agree_while_the_writer_runs(
        shared_cluster: Cluster, connect: Connect) -> None:
    writer_client = await connect(shared_cluster)
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    acknowledged: list[int] = []
    started = asyncio.Event()
    writer = asyncio.create_task(keep_writing(ledger, acknowledged, started))
    await started.wait()
    first, second = await connect(shared_cluster), await connect(shared_cluster)
    one, two = await asyncio.gather(
        first.open_ledger(ledger.ledger_id, password=b"pw", recovery=True),
        second.open_ledger(ledger.ledger_id, password=b"pw", recovery=True))
    end = one.metadata.last_entry_id
    assert two.metadata.last_entry_id == end and two.metadata.length == one.metadata.length
    assert isinstance(await writer, LedgerFencedError)
    # every acknowledged entry is inside the ledger; none was acknowledged after
    assert acknowledged and max(acknowledged) <= end
    assert acknowledged == list(range(len(acknowledged)))
    entries = await one.read(0, end)
    assert [e.data for e in entries] == [payload(i) for i in range(end + 1)]


async def test_reader_tails_an_open_ledger_through_explicit_lac(
        shared_cluster: Cluster, connect: Connect) -> None:
    writer_client = await connect(shared_cluster, explicit_lac_interval_ms=100)
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    reader = await (await connect(shared_cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                              recovery=False)
    assert reader.last_add_confirmed == -1
    await asyncio.gather(*[ledger.append(payload(i)) for i in range(30)])
    # every add went out before any completed: only WRITE_LAC can tell the
    # reader that entry 29 is confirmed, once the writer is idle
    deadline = asyncio.get_running_loop().time() + 10
    while await reader.read_last_add_confirmed() < 29:
        assert asyncio.get_running_loop().time() < deadline, "reader never learnt LAC 29"
        await asyncio.sleep(0.05)
    assert reader.last_add_confirmed == 29
    assert [e.data for e in await reader.read(0, 29)] == [payload(i) for i in range(30)]
    await ledger.close()


async def test_delete_ledger(shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await client.create_ledger(3, 3, 2)
    await ledger.append(b"x")
    await ledger.close()
    await client.delete_ledger(ledger.ledger_id)
    with pytest.raises(MetadataNotFoundError):
        await client.open_ledger(ledger.ledger_id, recovery=False)


async def test_sync_client(shared_cluster: Cluster) -> None:
    def use() -> tuple[int, list[bytes]]:
        with SyncClient.connect(shared_cluster.metadata_uri) as client:
            ledger = client.create_ledger(3, 3, 2, password=b"pw")
            ids = ledger.append_many([payload(i) for i in range(50)])
            assert ids == list(range(50))
            ledger.close()
            reader = client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
            return reader.read_last_add_confirmed(), [e.data for e in reader.read(0, 49)]

    lac, data = await asyncio.to_thread(use)
    assert lac == 49 and data == [payload(i) for i in range(50)]
