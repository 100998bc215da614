"""BP-46 phases one and two on real bookie processes.

A bookie running without the journal that loses power loses what only its
write cache held.  At its next start (``data_integrity_checking = true``)
phase one fences its ledgers and puts the open ones in limbo before it
answers anything; phase two, while it serves, recovers the limbo ledgers
and copies every entry it should hold back from its peers, each copy
checked against the ledger's digest, retrying what it cannot do yet.
The first scenario runs again with TLS and mutual TLS on: phase two
recovers and copies over TLS, the bookie showing its own certificate.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from quire.client import Client
from quire.errors import LedgerClosedError, LedgerFencedError, StatusCode
from quire.protocol import (
    FLAG_RECOVERY_ADD,
    AddRequest,
    DigestManager,
    ReadRequest,
    ReadResponse,
    master_key,
)
from quire.types import DigestType, LedgerState
from tests.support.bookies import RawBookieClient, wait_until_stored
from tests.support.cluster import Cluster
from tests.support.repair import wait_for_repair
from tests.support.tls import Pki, secure_bookies

Connect = Callable[..., Awaitable[Client]]
PW = b"pw"
PROTECTED = {"journal_write_data": False, "data_integrity_checking": True, "metrics_port": 0,
             "repair_retry_interval_ms": 200}
"""Bookies without the journal, with BP-46's protection."""
VOLATILE = {"flush_interval_ms": 600_000}
"""No checkpoint while the test runs: acknowledged adds sit in the write cache."""


def payload(ledger: int, entry_id: int) -> bytes:
    return f"ledger {ledger} entry {entry_id} ".encode() * 8


async def stored_on(cluster: Cluster, index: int, ledger_id: int,
                    entry_ids: range) -> dict[int, bytes]:
    """The entries bookie ``index`` serves (entry id -> stored bytes)."""
    raw = await RawBookieClient.connect(cluster.bookies[index].address, cluster.client_tls)
    try:
        found = {}
        for entry_id in entry_ids:
            answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, entry_id))
            if isinstance(answer, ReadResponse) and answer.entry is not None \
                    and answer.status == StatusCode.OK:
                found[entry_id] = answer.entry
        return found
    finally:
        raw.close()


@pytest.fixture
def protected_cluster(tmp_path: Path) -> Cluster:
    cluster = Cluster(tmp_path / "cluster", 3, **PROTECTED)
    cluster.bookies[2].settings.update(VOLATILE)
    return cluster


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_power_lost_bookie_fences_recovers_and_copies_back_what_it_lost(
        protected_cluster: Cluster, connect: Connect, tls: bool, tmp_path: Path) -> None:
    if tls:
        secure_bookies(protected_cluster, Pki(tmp_path / "pki"))
    cluster = protected_cluster.start()
    try:
        client = await connect(cluster)
        closed = await client.create_ledger(3, 3, 2, password=PW)
        for i in range(40):
            await closed.append(payload(closed.ledger_id, i))
        await closed.close()
        writing = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writing.append(payload(writing.ledger_id, i)) for i in range(40)))
        for ledger_id in (closed.ledger_id, writing.ledger_id):
            await wait_until_stored(cluster.bookies[2].address, ledger_id, 39,
                                    cluster.client_tls)

        victim = cluster.bookies[2]
        victim.power_loss()  # kill -9, and the write cache never reached the disk
        assert await asyncio.to_thread(victim.start) is None
        assert "phase one: fenced 2 ledgers (1 in limbo)" in victim.log()
        metrics = await wait_for_repair(victim)

        # the open ledger was recovered: closed at its last acknowledged entry
        reader = await client.open_ledger(writing.ledger_id, password=PW, recovery=False)
        assert reader.metadata.state is LedgerState.CLOSED
        assert reader.metadata.last_entry_id == 39
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await writing.append(b"after the recovery")
        # and the bookie holds every entry again, byte for byte as its peers (the
        # closed ledger's copied by repair; the recovered one's rewritten by
        # the recovery or copied)
        assert metrics["entries_copied_total"] >= 40
        for ledger_id in (closed.ledger_id, writing.ledger_id):
            mine = await stored_on(cluster, 2, ledger_id, range(40))
            assert mine == await stored_on(cluster, 0, ledger_id, range(40))
            assert [DigestManager(ledger_id, DigestType.CRC32C, PW).verify_payload(e, i)
                    for i, e in sorted(mine.items())] == [payload(ledger_id, i)
                                                           for i in range(40)]
        # the closed ledger is fenced on it too: a writer that missed the close is refused
        raw = await RawBookieClient.connect(victim.address, cluster.client_tls)
        try:
            late = DigestManager(closed.ledger_id, DigestType.CRC32C, PW).encode(
                40, 39, 0, b"late")
            answer = await raw.call(AddRequest(raw.next_id(), master_key(PW), late))
            assert answer.status == StatusCode.FENCED
        finally:
            raw.close()
    finally:
        cluster.close()


async def test_repair_waits_for_its_peers_and_retries(
        protected_cluster: Cluster, connect: Connect) -> None:
    cluster = protected_cluster.start()
    try:
        client = await connect(cluster)
        ledger = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(ledger.append(payload(ledger.ledger_id, i)) for i in range(20)))
        await wait_until_stored(cluster.bookies[2].address, ledger.ledger_id, 19)
        cluster.stop(0)
        cluster.stop(1)
        victim = cluster.bookies[2]
        victim.power_loss()
        await asyncio.to_thread(victim.start)
        # no peer: the ledger can be neither recovered nor repaired, and stays in limbo
        stuck = await wait_for_repair(victim, lambda m: m["failures_total"] >= 2)
        assert stuck["limbo_ledgers"] == 1
        assert (await stored_on(cluster, 2, ledger.ledger_id, range(20))) == {}
        await asyncio.to_thread(cluster.start)
        await wait_for_repair(victim)
        reader = await client.open_ledger(ledger.ledger_id, password=PW, recovery=False)
        assert reader.metadata.last_entry_id == 19
        assert sorted(await stored_on(cluster, 2, ledger.ledger_id, range(20))) == \
            list(range(20))
    finally:
        cluster.close()


async def test_repair_refuses_a_corrupted_copy_and_takes_a_good_one(
        tmp_path: Path, connect: Connect) -> None:
    # journal on: phase two also checks closed ledgers of a bookie whose
    # journal loses nothing (here: one that never got the entries)
    cluster = Cluster(tmp_path / "cluster", 3, data_integrity_checking=True, metrics_port=0)
    cluster.start()
    try:
        client = await connect(cluster)
        ledger = await client.create_ledger(3, 3, 2, password=PW)
        ledger_id = ledger.ledger_id
        digest = DigestManager(ledger_id, DigestType.CRC32C, PW)
        good = [digest.encode(i, i - 1, 0, payload(ledger_id, i)) for i in range(10)]
        bad = [g[:-1] + bytes([g[-1] ^ 0xFF]) for g in good]  # one payload bit flipped
        bad_only = 9  # no good copy anywhere: must not be stored
        await asyncio.to_thread(cluster.stop, 2)
        for index, copies in ((0, bad), (1, good[:bad_only] + bad[bad_only:])):
            raw = await RawBookieClient.connect(cluster.bookies[index].address)
            try:
                for entry in copies:
                    answer = await raw.call(AddRequest(raw.next_id(), master_key(PW), entry))
                    assert answer.status == StatusCode.OK
            finally:
                raw.close()
        # the writer "crashed"; the ledger is closed at 9 (as a recovery would)
        store = client.metadata_store
        versioned = await store.read_ledger(ledger_id)
        await store.write_ledger(ledger_id, versioned.value.with_(
            state=LedgerState.CLOSED, last_entry_id=9, length=0), versioned.version)

        await asyncio.to_thread(cluster.start)
        metrics = await wait_for_repair(cluster.bookies[2])
        assert metrics["copies_refused_total"] >= 2  # entry 9 from both peers, at least
        assert metrics["entries_copied_total"] == 9
        assert metrics["failures_total"] >= 1
        copied = await stored_on(cluster, 2, ledger_id, range(10))
        assert copied == dict(enumerate(good[:bad_only]))
    finally:
        cluster.close()


@pytest.mark.parametrize("stamping", [True, False], ids=["stamping", "quire-cookie-fix"])
async def test_an_emptied_ledger_dir_is_caught_by_its_cookie_and_repaired_from_peers(
        tmp_path: Path, connect: Connect, stamping: bool) -> None:
    # journal on: a replaced disk loses what a journal cannot bring back
    cluster = Cluster(tmp_path / "cluster", 3, data_integrity_checking=True, metrics_port=0,
                      repair_retry_interval_ms=200)
    victim = cluster.bookies[2]
    victim.settings["data_integrity_stamp_missing_cookies"] = stamping
    cluster.start()
    try:
        client = await connect(cluster)
        closed = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(closed.append(payload(closed.ledger_id, i)) for i in range(30)))
        await closed.close()
        writing = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writing.append(payload(writing.ledger_id, i)) for i in range(30)))
        for ledger_id in (closed.ledger_id, writing.ledger_id):
            await wait_until_stored(victim.address, ledger_id, 29)
        await asyncio.to_thread(victim.stop)
        ledger_dir = Path(victim.settings["ledger_dirs"][0])
        shutil.rmtree(ledger_dir)
        ledger_dir.mkdir()

        if stamping:
            await asyncio.to_thread(victim.start)
            assert f"stamped the missing cookies of {ledger_dir}" in victim.log()
            assert "phase one: fenced 2 ledgers (1 in limbo)" in victim.log()
        else:
            victim.start(expect_ready=False)
            assert await asyncio.to_thread(victim.wait_exit, 60) != 0
            assert f"{ledger_dir} has no cookie" in victim.log()
            assert "quire cookie fix bookie-2 --config" in victim.log()
            fixed = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "quire.cli.main", "cookie", "fix",
                                 "bookie-2", "--config", str(victim.write_config()), "--json"],
                capture_output=True, timeout=60)
            assert fixed.returncode == 0, fixed.stderr.decode()
            assert json.loads(fixed.stdout)["stamped_dirs"] == [str(ledger_dir)]
            await asyncio.to_thread(victim.start)
            assert "phase two starts (1 ledgers in limbo)" in victim.log()

        await wait_for_repair(victim)
        reader = await client.open_ledger(writing.ledger_id, password=PW, recovery=False)
        assert reader.metadata.state is LedgerState.CLOSED
        assert reader.metadata.last_entry_id == 29
        for ledger_id in (closed.ledger_id, writing.ledger_id):
            assert await stored_on(cluster, 2, ledger_id, range(30)) == \
                await stored_on(cluster, 1, ledger_id, range(30))
            assert len(await stored_on(cluster, 2, ledger_id, range(30))) == 30
    finally:
        cluster.close()


async def test_repair_progress_survives_a_power_loss_half_way(
        protected_cluster: Cluster, connect: Connect) -> None:
    """Copies are durable before they count: a bookie that loses power in the
    middle of phase two keeps what it copied and copies only the rest."""
    cluster = protected_cluster.start()
    victim = cluster.bookies[2]
    try:
        client = await connect(cluster)
        done_first, held_back = [await client.create_ledger(3, 3, 2, password=PW)
                                 for _ in range(2)]
        for handle in (done_first, held_back):
            await asyncio.gather(*(handle.append(payload(handle.ledger_id, i))
                                   for i in range(50)))
            await handle.close()
            await wait_until_stored(victim.address, handle.ledger_id, 49)
        # entry 7 of the second ledger: a corrupted copy on both peers, so
        # phase two finishes the first ledger and stays stuck on the second
        digest = DigestManager(held_back.ledger_id, DigestType.CRC32C, PW)
        good = (await stored_on(cluster, 0, held_back.ledger_id, range(7, 8)))[7]
        bad = good[:-1] + bytes([good[-1] ^ 0xFF])
        for index in (0, 1):
            await overwrite(cluster, index, bad)

        victim.power_loss()
        await asyncio.to_thread(victim.start)
        half = await wait_for_repair(
            victim, lambda m: m["passes_total"] >= 1 and m["entries_copied_total"] == 99)
        assert half["copies_refused_total"] >= 2
        victim.power_loss()  # half way: the first ledger copied, entry 7 not
        await asyncio.to_thread(victim.start)
        again = await wait_for_repair(victim, lambda m: m["failures_total"] >= 1)
        assert again["entries_copied_total"] == 0  # nothing copied twice
        assert sorted(await stored_on(cluster, 2, done_first.ledger_id, range(50))) == \
            list(range(50))
        await overwrite(cluster, 1, good)  # a good copy appears: the retry takes it
        await wait_for_repair(victim, lambda m: m["entries_copied_total"] == 1)
        mine = await stored_on(cluster, 2, held_back.ledger_id, range(50))
        assert [digest.verify_payload(e, i) for i, e in sorted(mine.items())] == \
            [payload(held_back.ledger_id, i) for i in range(50)]
    finally:
        cluster.close()


async def overwrite(cluster: Cluster, index: int, entry: bytes) -> None:
    """Store ``entry`` on bookie ``index`` in place of its copy (as a
    recovery add does)."""
    raw = await RawBookieClient.connect(cluster.bookies[index].address)
    try:
        answer = await raw.call(AddRequest(raw.next_id(), master_key(PW), entry,
                                           FLAG_RECOVERY_ADD))
        assert answer.status == StatusCode.OK
    finally:
        raw.close()
