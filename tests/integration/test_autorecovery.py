"""Autorecovery on real bookie processes: the auditor marks the ledgers of a
bookie lost for good, workers copy its entries to live bookies and swap them
into the ensembles; a worker killed half way leaves its ledger marked for
another; a decommissioned bookie's data moves while it is still up.  The
idle open ledger's scenario runs again with TLS and mutual TLS on: the
auditor, the recovery (with the keys the metadata holds, no password) and
the copies go over TLS, each bookie showing its own certificate."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quire.client import Client
from quire.client.placement import write_set_bookies
from quire.errors import StatusCode
from quire.metadata import LedgerMetadata, MetadataStore
from quire.node.autorecovery import UnderReplication
from quire.protocol import DigestManager, ReadRequest, ReadResponse
from quire.types import DigestType, LedgerState
from tests.support.bookies import RawBookieClient
from tests.support.cluster import Cluster
from tests.support.repair import scrape
from tests.support.tls import Pki, secure_bookies

Connect = Callable[..., Awaitable[Client]]
PW = b"pw"
FAST = {"lost_bookie_delay_s": 1.0, "autorecovery_interval_ms": 200,
        "open_ledger_grace_ms": 1000}


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"{ledger_id}:{entry_id} ".encode() * 20


async def write_ledgers(client: Client, count: int, entries: int,
                        halfway: Callable[[], None] | None = None) -> list[int]:
    """``count`` ledgers (E3 W2 A2: striped) of ``entries`` entries each,
    written concurrently and closed; ``halfway()`` runs once half of every
    ledger is written."""
    handles = [await client.create_ledger(3, 2, 2, password=PW) for _ in range(count)]

    async def fill(first: int, last: int) -> None:
        await asyncio.gather(*(h.append(payload(h.ledger_id, i))
                               for h in handles for i in range(first, last)))

    await fill(0, entries // 2)
    if halfway is not None:
        await asyncio.to_thread(halfway)
    await fill(entries // 2, entries)
    for h in handles:
        await h.close()
    return [h.ledger_id for h in handles]


async def fully_replicated(store: MetadataStore, ledger_ids: list[int], gone: str,
                           timeout_s: float = 120.0) -> dict[int, LedgerMetadata]:
    """Wait until no ledger is marked and no ensemble names ``gone``."""
    marks = UnderReplication(store)
    deadline = time.monotonic() + timeout_s
    while True:
        found = {i: (await store.read_ledger(i)).value for i in ledger_ids}
        named = [i for i, md in found.items()
                 if any(gone in bookies for _f, bookies in md.ensembles)]
        marked = await marks.marked()
        if not named and not marked:
            return found
        assert time.monotonic() < deadline, f"still naming {gone}: {named}; marked {marked}"
        await asyncio.sleep(0.2)


async def check_every_replica(cluster: Cluster, ledgers: dict[int, LedgerMetadata],
                              entries: int) -> None:
    """Read each entry from each bookie of its write set: all there, all intact."""
    conns = {b.bookie_id: await RawBookieClient.connect(b.address, cluster.client_tls)
             for b in cluster.bookies if b.running}
    try:
        for ledger_id, md in ledgers.items():
            assert md.state is LedgerState.CLOSED and md.last_entry_id == entries - 1
            digest = DigestManager(ledger_id, DigestType.CRC32C, PW)
            for entry_id in range(entries):
                replicas = write_set_bookies(md.ensemble_at(entry_id), entry_id,
                                             md.write_quorum_size)
                for bookie in replicas:
                    raw = conns[bookie]
                    answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, entry_id))
                    assert isinstance(answer, ReadResponse), answer
                    assert answer.status == StatusCode.OK, (ledger_id, entry_id, bookie)
                    assert answer.entry is not None
                    assert digest.verify_payload(answer.entry, entry_id) == \
                        payload(ledger_id, entry_id)
    finally:
        for raw in conns.values():
            raw.close()


def quire(*args: str) -> bytes:
    return subprocess.run([sys.executable, "-m", "quire.cli.main", *args], capture_output=True,
                          timeout=60, check=True).stdout


async def keep_reading(client: Client, ledger_ids: list[int], entries: int,
                       stop: asyncio.Event) -> int:
    """Read every entry of the ledgers again and again until ``stop``;
    return how many reads there were (each checked)."""
    reads = 0
    handles = [await client.open_ledger(i, password=PW, recovery=False) for i in ledger_ids]
    while not stop.is_set():
        for handle in handles:
            got = await handle.read(0, entries - 1)
            assert [e.data for e in got] == [payload(handle.ledger_id, i)
                                             for i in range(entries)]
            reads += len(got)
    return reads


async def test_a_lost_bookie_is_re_replicated_under_writes(
        tmp_path: Path, connect: Connect) -> None:
    cluster = Cluster(tmp_path / "cluster", 4, autorecovery_enabled=True, metrics_port=0,
                      **FAST).start()
    try:
        client = await connect(cluster)
        lost = cluster.bookie_id(3)
        ledger_ids = await write_ledgers(client, 50, 20, halfway=lambda: cluster.kill9(3))
        stop = asyncio.Event()
        reader = asyncio.ensure_future(keep_reading(client, ledger_ids, 20, stop))
        ledgers = await fully_replicated(client.metadata_store, ledger_ids, lost)
        stop.set()
        assert await reader > 0  # reads kept working while fragments moved
        await check_every_replica(cluster, ledgers, 20)
        copied = sum(scrape(b)["quire_autorecovery_entries_copied_total"]
                     for b in cluster.bookies[:3])
        assert copied >= 20  # the workers' metrics count what they copied
    finally:
        cluster.close()


async def test_a_worker_killed_half_way_leaves_the_ledger_marked_for_another(
        tmp_path: Path, connect: Connect) -> None:
    cluster = Cluster(tmp_path / "cluster", 4).start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        client = await connect(cluster)
        ledger_ids = await write_ledgers(client, 30, 40)
        lost = cluster.bookie_id(3)
        cluster.kill9(3)
        store = client.metadata_store
        deadline = time.monotonic() + 30
        while lost in {b.bookie_id for b in await store.list_bookies()}:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        audit = subprocess.run(
            [sys.executable, "-m", "quire.cli.main", "autorecovery", "audit", "--metadata",
             cluster.metadata_uri, "--json"], capture_output=True, timeout=60, check=True)
        marked = json.loads(audit.stdout)
        assert marked["lost_bookies"] == [lost] and marked["ledgers_marked"] > 0
        listed = json.loads(quire("ledger", "underreplicated", "--metadata",
                                  cluster.metadata_uri, "--json"))
        assert len(listed) == marked["ledgers_marked"]
        assert all(row["lost"] == [lost] and row["worker"] is None for row in listed)
        state = json.loads(quire("autorecovery", "status", "--metadata", cluster.metadata_uri,
                                 "--json"))
        assert state["auditor"] is None and state["lost_bookies"] == [lost]
        assert [r["ledger_id"] for r in state["underreplicated"]] == \
            [r["ledger_id"] for r in listed]

        def worker(name: str) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                [sys.executable, "-m", "quire.cli.main", "autorecovery", "start", "--metadata",
                 cluster.metadata_uri, "--worker-id", name, "--lost-bookie-delay-s", "3600"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            workers.append(proc)
            return proc

        first = worker("first")
        marks = UnderReplication(store)
        deadline = time.monotonic() + 60
        while not any([await marks.holder(i) == "first" for i in await marks.marked()]):
            assert time.monotonic() < deadline, "the first worker never took a ledger"
            await asyncio.sleep(0.01)
        first.kill()  # kill -9, lock held, copy under way
        first.wait(10)
        assert await marks.marked(), "a killed worker left nothing marked"
        worker("second")
        ledgers = await fully_replicated(store, ledger_ids, lost)
        await check_every_replica(cluster, ledgers, 40)
    finally:
        for proc in workers:
            proc.kill()
            proc.wait(10)
        cluster.close()


async def test_decommission_moves_everything_off_a_running_bookie(
        tmp_path: Path, connect: Connect) -> None:
    cluster = Cluster(tmp_path / "cluster", 4).start()
    try:
        client = await connect(cluster)
        ledger_ids = await write_ledgers(client, 10, 30)
        leaving = cluster.bookie_id(0)
        result = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "quire.cli.main", "bookie", "decommission",
                             leaving, "--metadata", cluster.metadata_uri, "--json"],
            capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr.decode()
        report = json.loads(result.stdout)
        assert report["ledgers_replicated"] > 0
        store = client.metadata_store
        assert leaving not in await store.list_cookies()
        cluster.stop(0)
        ledgers = await fully_replicated(store, ledger_ids, leaving)
        await check_every_replica(cluster, ledgers, 30)
    finally:
        cluster.close()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_an_idle_open_ledger_is_closed_after_its_grace_and_re_replicated(
        tmp_path: Path, connect: Connect, tls: bool) -> None:
    cluster = Cluster(tmp_path / "cluster", 4, autorecovery_enabled=True, **FAST)
    if tls:
        secure_bookies(cluster, Pki(tmp_path / "pki"))
    cluster.start()
    try:
        client = await connect(cluster)
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(payload(writer.ledger_id, i)) for i in range(10)))
        lost = writer.ensemble[0]  # the writer goes idle, its ledger open
        cluster.kill9(cluster.index_of(lost))
        ledgers = await fully_replicated(client.metadata_store, [writer.ledger_id], lost)
        assert ledgers[writer.ledger_id].state is LedgerState.CLOSED  # recovered first
        await check_every_replica(cluster, ledgers, 10)
    finally:
        cluster.close()
