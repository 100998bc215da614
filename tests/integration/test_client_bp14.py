"""BP-14 VD_JOURNAL ledgers end to end: LAC from LastAddSynced, sync(), close.

The cluster's bookies checkpoint often but only SYNC and PD traffic fsync
their journals, so an acknowledged VD entry is in the page cache only; the
power-loss emulation then shows which entries the LAC may cover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from quire import DigestType, LedgerType
from quire.client import Client, WriteHandle
from quire.errors import EnsembleChangeRefusedError, LedgerFencedError
from tests.support.cluster import Cluster

Connect = Callable[..., Awaitable[Client]]


@pytest.fixture
def quiet_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Bookies that never checkpoint during a test: only SYNC and PD traffic
    fsync anything, so an unsynced VD entry stays unsynced."""
    started = Cluster(tmp_path / "quiet", 3, flush_interval_ms=600_000).start()
    yield started
    started.close()


async def vd_ledger(client: Client, ensemble: int = 3, ack: int = 2) -> WriteHandle:
    return await client.create_ledger(ensemble, ensemble, ack, ledger_type=LedgerType.VD_JOURNAL,
                                      digest_type=DigestType.CRC32C, password=b"pw")


def payload(i: int) -> bytes:
    return f"vd-entry-{i}".encode()


async def append(ledger: WriteHandle, start: int, count: int) -> list[int]:
    return list(await asyncio.gather(*(ledger.append(payload(i))
                                       for i in range(start, start + count))))


def power_loss_all(cluster: Cluster) -> None:
    for bookie in cluster.bookies:
        bookie.power_loss()
    cluster.start()


async def recovered_entries(connect: Connect, cluster: Cluster, ledger_id: int) -> list[bytes]:
    client = await connect(cluster)
    reader = await client.open_ledger(ledger_id, password=b"pw", recovery=True)
    last = reader.last_add_confirmed
    return [e.data for e in await reader.read(0, last)] if last >= 0 else []


async def test_lac_stays_put_without_sync_then_sync_moves_it(quiet_cluster: Cluster,
                                                             connect: Connect) -> None:
    cluster = quiet_cluster
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    assert await append(ledger, 0, 50) == list(range(50))
    assert ledger.last_add_completed == 49
    assert ledger.last_add_confirmed == -1  # acknowledged is not persistent
    assert await ledger.sync() == 49
    assert ledger.last_add_confirmed == 49
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                        recovery=False)
    deadline = time.monotonic() + 10
    while await reader.read_last_add_confirmed() < 49:  # WRITE_LAC after sync
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert [e.data for e in await reader.read(0, 49)] == [payload(i) for i in range(50)]


async def test_read_unconfirmed_reads_past_the_lac(quiet_cluster: Cluster,
                                                  connect: Connect) -> None:
    cluster = quiet_cluster
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 5)
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                        recovery=False)
    assert await reader.read_last_add_confirmed() == -1
    assert [e.data for e in await reader.read_unconfirmed(0, 4)] == [payload(i)
                                                                     for i in range(5)]


async def test_sync_names_only_entries_acknowledged_before_it(cluster: Cluster,
                                                              connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 10)
    syncing = asyncio.ensure_future(ledger.sync())
    later = [ledger.append(payload(i)) for i in range(10, 200)]
    assert await syncing == 9
    await asyncio.gather(*later)
    assert ledger.last_add_confirmed <= ledger.last_add_completed == 199


async def test_pd_traffic_may_move_the_lac_but_never_past_fsynced(cluster: Cluster,
                                                                   connect: Connect) -> None:
    client = await connect(cluster)
    vd = await vd_ledger(client)
    pd = await client.create_ledger(3, 3, 2, password=b"pw")
    await append(vd, 0, 20)
    await append(pd, 0, 20)  # each PD add fsyncs the journals, VD entries included
    deadline, next_id = time.monotonic() + 10, 20
    while vd.last_add_confirmed < 19:  # LastAddSynced arrives on later add answers
        assert time.monotonic() < deadline, "PD fsyncs never moved the VD LAC"
        await append(vd, next_id, 1)
        next_id += 1
    lac = vd.last_add_confirmed
    assert lac <= vd.last_add_completed
    power_loss_all(cluster)  # nothing at or below the LAC may be lost
    entries = await recovered_entries(connect, cluster, vd.ledger_id)
    assert entries[:lac + 1] == [payload(i) for i in range(lac + 1)]


@pytest.mark.parametrize("crash", ["kill9", "power_loss"])
async def test_sync_survives_crash_of_every_bookie(cluster: Cluster, connect: Connect,
                                                   crash: str) -> None:
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 100)
    synced = await ledger.sync()
    assert synced == 99
    await append(ledger, 100, 50)  # not synced: may go on power loss
    for bookie in cluster.bookies:
        bookie.kill9() if crash == "kill9" else bookie.power_loss()
    cluster.start()
    entries = await recovered_entries(connect, cluster, ledger.ledger_id)
    assert entries[:synced + 1] == [payload(i) for i in range(synced + 1)]
    if crash == "kill9":  # the page cache kept the acknowledged tail too
        assert len(entries) == 150


async def test_close_without_sync_keeps_every_acknowledged_entry(cluster: Cluster,
                                                                 connect: Connect) -> None:
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 30)
    await ledger.close()
    assert ledger.metadata.last_entry_id == 29
    power_loss_all(cluster)
    reader = await (await connect(cluster)).open_ledger(ledger.ledger_id, password=b"pw",
                                                        recovery=False)
    assert [e.data for e in await reader.read(0, 29)] == [payload(i) for i in range(30)]


@pytest.mark.parametrize("cluster", [4], indirect=True)
async def test_ensemble_change_is_refused_and_recovery_keeps_acknowledged(
        cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster, add_entry_timeout_ms=2000)
    ledger = await vd_ledger(client)
    acknowledged = await append(ledger, 0, 20)
    victim = cluster.index_of(ledger.ensemble[0])
    cluster.kill9(victim)
    more = [ledger.append(payload(i)) for i in range(20, 40)]
    results = await asyncio.gather(*more, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    acknowledged += [r for r in results if isinstance(r, int)]
    # a refused ensemble change fails the pending appends with a clear error
    assert failures and all(isinstance(f, EnsembleChangeRefusedError) for f in failures)
    assert len(ledger.metadata.ensembles) == 1  # no new fragment was written
    entries = await recovered_entries(connect, cluster, ledger.ledger_id)
    assert len(entries) >= len(acknowledged)
    assert entries[:len(acknowledged)] == [payload(i) for i in range(len(acknowledged))]
    with pytest.raises(LedgerFencedError):
        await ledger.close()


async def test_close_with_one_bookie_down_syncs_the_other_two(cluster: Cluster,
                                                              connect: Connect) -> None:
    client = await connect(cluster, add_entry_timeout_ms=2000)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 25)
    cluster.kill9(cluster.index_of(ledger.ensemble[2]))
    await ledger.close()  # A=2 bookies sync: nothing acknowledged is dropped
    assert ledger.metadata.last_entry_id == 24


async def test_pd_and_vd_ledgers_on_the_same_bookies(cluster: Cluster,
                                                     connect: Connect) -> None:
    client = await connect(cluster)
    vd = await vd_ledger(client)
    pd = await client.create_ledger(3, 3, 2, password=b"pw")
    futures = []
    for i in range(100):
        futures.append(vd.append(payload(i)))
        futures.append(pd.append(payload(i)))
    await asyncio.gather(*futures)
    assert pd.last_add_confirmed == 99
    assert await vd.sync() == 99
    await vd.close()
    await pd.close()
    for ledger_id in (vd.ledger_id, pd.ledger_id):
        reader = await client.open_ledger(ledger_id, password=b"pw", recovery=False)
        assert [e.data for e in await reader.read(0, 99)] == [payload(i) for i in range(100)]


async def test_striped_vd_ledgers_are_refused(cluster: Cluster, connect: Connect) -> None:
    client = await connect(cluster)
    with pytest.raises(ValueError, match="striped"):
        await client.create_ledger(3, 2, 2, ledger_type=LedgerType.VD_JOURNAL)


async def test_checkpoints_move_the_lac_of_a_never_synced_ledger(cluster: Cluster,
                                                                 connect: Connect) -> None:
    """A checkpoint fsyncs entries into the entry logs: the sync cursors move
    over them (so a VD ledger that is never synced does not pile up state),
    and the LAC follows on later add answers."""
    client = await connect(cluster)
    ledger = await vd_ledger(client)
    await append(ledger, 0, 20)
    deadline, next_id = time.monotonic() + 20, 20
    while ledger.last_add_confirmed < 19:  # the cluster checkpoints every 200 ms
        assert time.monotonic() < deadline, "checkpoints never moved the VD LAC"
        await append(ledger, next_id, 1)
        next_id += 1
        await asyncio.sleep(0.05)
    assert ledger.last_add_confirmed <= ledger.last_add_completed
