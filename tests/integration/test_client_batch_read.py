"""BP-62 batch reads through the client, against real bookies."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quire.client import Client, WriteHandle
from quire.errors import DigestMismatchError, ReadBeyondLastAddConfirmedError, StatusCode
from quire.protocol import FLAG_RECOVERY_ADD, AddRequest, DigestManager, master_key
from quire.types import DigestType
from tests.support.bookies import RawBookieClient
from tests.support.cluster import Cluster

Connect = Callable[..., Awaitable[Client]]


def payload(i: int, size: int = 100) -> bytes:
    return (f"{i:08d}" * (size // 8 + 1)).encode()[:size]


async def closed_ledger(client: Client, count: int, e: int = 3, w: int = 3, a: int = 2,
                        sizes: list[int] | None = None) -> WriteHandle:
    ledger = await client.create_ledger(e, w, a, password=b"pw")
    for i in range(count):
        await ledger.append(payload(i, sizes[i] if sizes else 100))
    await ledger.close()
    return ledger


async def test_limits_by_count_size_and_the_end_of_the_ledger(shared_cluster: Cluster,
                                                              connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await closed_ledger(client, 50)
    reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
    by_count = await reader.batch_read(5, 10, 1 << 20)
    assert [e.entry_id for e in by_count] == list(range(5, 15))
    assert [e.data for e in by_count] == [payload(i) for i in range(5, 15)]
    by_size = await reader.batch_read(0, 50, 350)
    assert 1 <= len(by_size) <= 3 and sum(len(e.data) for e in by_size) <= 350
    tail = await reader.batch_read(45, 100, 1 << 20)
    assert [e.entry_id for e in tail] == list(range(45, 50))  # never past the last entry
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await reader.batch_read(50, 10, 1 << 20)
    no_limit = await reader.batch_read(0, 0, 0)  # max_count <= 0: no count limit
    assert [e.entry_id for e in no_limit] == list(range(50))
    clamped = await reader.batch_read(0, -1, 1 << 62)
    assert clamped == no_limit


async def test_oversized_first_entry_comes_alone(shared_cluster: Cluster,
                                                 connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await closed_ledger(client, 3, sizes=[5000, 10, 10])
    reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
    first = await reader.batch_read(0, 10, 100)
    assert [e.data for e in first] == [payload(0, 5000)]


async def test_open_ledger_batch_stops_at_the_lac(shared_cluster: Cluster,
                                                  connect: Connect) -> None:
    writer_client = await connect(shared_cluster, explicit_lac_interval_ms=0)
    ledger = await writer_client.create_ledger(3, 3, 2, password=b"pw")
    for i in range(10):
        await ledger.append(payload(i))
    reader = await (await connect(shared_cluster)).open_ledger(
        ledger.ledger_id, password=b"pw", recovery=False)
    lac = await reader.read_last_add_confirmed()
    assert lac == 8  # entry 9 is stored but only entry 8 carries LAC 8
    entries = await reader.batch_read(0, 100, 1 << 20)
    assert [e.entry_id for e in entries] == list(range(9))  # the bookies hold 9: dropped
    with pytest.raises(ReadBeyondLastAddConfirmedError):
        await reader.batch_read(9, 1, 1 << 20)


async def test_striped_ledger_falls_back_and_gives_the_same_entries(shared_cluster: Cluster,
                                                                    connect: Connect) -> None:
    client = await connect(shared_cluster)
    ledger = await closed_ledger(client, 30, e=5, w=3, a=2)
    reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
    got: list[bytes] = []
    position = 0
    while position < 30:  # loose limits: keep asking from where a batch ended
        batch = await reader.batch_read(position, 30 - position, 1 << 20)
        assert batch and batch[0].entry_id == position
        got += [e.data for e in batch]
        position = batch[-1].entry_id + 1
    assert got == [payload(i) for i in range(30)]
    assert [e.data for e in await reader.read(0, 29)] == got


async def test_unsupported_bookies_fall_back_and_are_remembered(tmp_path: Path,
                                                                connect: Connect) -> None:
    old = Cluster(tmp_path / "old", 3, batch_read_enabled=False).start()
    try:
        client = await connect(old)
        ledger = await closed_ledger(client, 20)
        reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
        first = await reader.batch_read(0, 20, 1 << 20)
        assert [e.data for e in first] == [payload(i) for i in range(len(first))]
        assert first
        assert client._ctx.batch_unsupported == set(ledger.ensemble)
        assert [e.data for e in await reader.read(0, 19)] == [payload(i) for i in range(20)]
    finally:
        old.close()


async def test_batch_reads_off_in_the_client(shared_cluster: Cluster, connect: Connect) -> None:
    client = await connect(shared_cluster, batch_read_enabled=False)
    ledger = await closed_ledger(client, 10)
    reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
    assert [e.data for e in await reader.read(0, 9)] == [payload(i) for i in range(10)]
    assert [e.entry_id for e in await reader.batch_read(0, 3, 1 << 20)] == [0, 1, 2]


async def test_failover_when_a_replica_is_down(cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster, read_timeout_ms=2000)
    ledger = await closed_ledger(client, 40)
    cluster.kill9(cluster.index_of(ledger.ensemble[0]))
    reader = await (await connect(cluster, read_timeout_ms=2000)).open_ledger(
        ledger.ledger_id, password=b"pw", recovery=False)
    assert [e.data for e in await reader.read(0, 39)] == [payload(i) for i in range(40)]
    batch = await reader.batch_read(0, 40, 1 << 20)
    assert [e.data for e in batch] == [payload(i) for i in range(40)]


@pytest.mark.parametrize("cluster", [1], indirect=True)
async def test_digest_mismatch_returns_the_verified_prefix(cluster: Cluster,
                                                           connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await closed_ledger(client, 6, e=1, w=1, a=1)
    raw = await RawBookieClient.connect(cluster.bookies[0].address)
    good = DigestManager(ledger.ledger_id, DigestType.CRC32C, b"pw").encode(
        3, 2, 400, payload(3))
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])  # same entry, payload flipped
    answer = await raw.call(AddRequest(raw.next_id(), master_key(b"pw"), bad, FLAG_RECOVERY_ADD))
    assert answer.status == StatusCode.OK  # type: ignore[union-attr]
    raw.close()
    reader = await client.open_ledger(ledger.ledger_id, password=b"pw", recovery=False)
    prefix = await reader.batch_read(0, 6, 1 << 20)
    assert [e.entry_id for e in prefix] == [0, 1, 2]
    with pytest.raises(DigestMismatchError):
        await reader.batch_read(3, 3, 1 << 20)  # only copy is corrupt: never "no such entry"
