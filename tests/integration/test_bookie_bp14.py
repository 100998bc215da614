"""BP-14 on a real bookie: volatile adds, the sync cursor, SYNC, restarts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from quire.errors import StatusCode
from quire.protocol import (
    FLAG_VOLATILE_DURABILITY,
    AddRequest,
    AddResponse,
    DigestManager,
    ReadRequest,
    SyncRequest,
    SyncResponse,
    master_key,
)
from quire.types import DigestType
from tests.support.bookies import BookieProcess, RawBookieClient

KEY = master_key(b"pw")


def entry(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(
        entry_id, lac, 0, f"vd-{ledger_id}-{entry_id}".encode())


async def vd_add(client: RawBookieClient, ledger_id: int, entry_id: int,
                 lac: int = -1) -> AddResponse:
    response = await client.call(AddRequest(client.next_id(), KEY, entry(ledger_id, entry_id, lac),
                                            FLAG_VOLATILE_DURABILITY))
    assert isinstance(response, AddResponse) and response.status == StatusCode.OK
    return response


async def pd_add(client: RawBookieClient, ledger_id: int, entry_id: int) -> None:
    stored = DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(entry_id, -1, 0, b"pd")
    response = await client.call(AddRequest(client.next_id(), KEY, stored))
    assert response.status == StatusCode.OK  # type: ignore[union-attr]


async def sync(client: RawBookieClient, ledger_id: int) -> int:
    response = await client.call(SyncRequest(client.next_id(), ledger_id))
    assert isinstance(response, SyncResponse) and response.status == StatusCode.OK
    return response.last_add_synced


@pytest.fixture
def bookie(tmp_path: Path) -> BookieProcess:
    # No checkpoints and no other traffic: only SYNC (or PD adds) fsync the journal.
    return BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "vd-bookie",
                         flush_interval_ms=600_000, metrics_port=0)


async def test_vd_adds_report_nothing_synced_until_sync(bookie: BookieProcess) -> None:
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        responses = [await vd_add(client, 1, i) for i in range(20)]
        assert {r.last_add_synced for r in responses} == {-1}
        assert await sync(client, 1) == 19
        assert (await vd_add(client, 1, 20)).last_add_synced == 19
        client.close()
    finally:
        bookie.kill9()


async def test_pd_fsync_advances_a_vd_cursor(bookie: BookieProcess) -> None:
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        for i in range(5):
            assert (await vd_add(client, 1, i)).last_add_synced == -1
        deadline, entry_id, las = time.monotonic() + 10, 5, -1
        while las < 4:
            # PD traffic beside it: each PD add fsyncs the journal, which
            # covers the VD entries, then (a later fsync) the cursor record
            assert time.monotonic() < deadline, "PD fsyncs never advanced the VD cursor"
            await pd_add(client, 2, entry_id - 5)
            las = (await vd_add(client, 1, entry_id)).last_add_synced
            entry_id += 1
        assert las >= 4
        client.close()
    finally:
        bookie.kill9()


async def test_piggybacked_lac_advances_the_cursor(bookie: BookieProcess) -> None:
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        for i in range(10):
            await vd_add(client, 1, i)
        await vd_add(client, 1, 10, lac=7)  # the writer says 0..7 are on an ack quorum
        await pd_add(client, 2, 0)  # an fsync for other reasons makes the cursor durable
        las = (await vd_add(client, 1, 11)).last_add_synced
        # The fsync that made the cursor record durable also covered the
        # entries journaled before it, so the cursor may pass 7 - never stop short.
        assert las >= 7
        client.close()
    finally:
        bookie.kill9()


@pytest.mark.parametrize("mode", ["clean", "kill9", "power_loss"])
async def test_restart_never_moves_the_cursor_backwards(bookie: BookieProcess,
                                                        mode: str) -> None:
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        for i in range(30):
            await vd_add(client, 1, i)
        synced = await sync(client, 1)
        assert synced == 29
        for i in range(30, 40):  # unsynced tail: may be lost on power loss
            await vd_add(client, 1, i)
        client.close()
        {"clean": bookie.stop, "kill9": bookie.kill9, "power_loss": bookie.power_loss}[mode]()
        bookie.start()
        client = await RawBookieClient.connect(bookie.address)
        for i in range(synced + 1):  # everything at or below the synced id is there
            response = await client.call(ReadRequest(client.next_id(), 1, i))
            assert response.status == StatusCode.OK  # type: ignore[union-attr]
        first = await client.call(ReadRequest(client.next_id(), 1, 40))
        next_id = 40 if first.status == StatusCode.NO_SUCH_ENTRY else 41  # type: ignore[union-attr]
        assert (await vd_add(client, 1, next_id)).last_add_synced >= synced
        assert await sync(client, 1) >= synced
        client.close()
    finally:
        bookie.kill9()


async def test_sync_on_unknown_ledger_is_an_error_not_a_value(bookie: BookieProcess) -> None:
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        response = await client.call(SyncRequest(client.next_id(), 404))
        assert response.status == StatusCode.NO_SUCH_LEDGER  # type: ignore[union-attr]
        client.close()
    finally:
        bookie.kill9()


async def test_vd_traffic_alone_causes_no_journal_fsync(bookie: BookieProcess) -> None:
    """Persisting a moved cursor never kicks an fsync of its own: VD-only
    traffic, even with LACs that keep moving, leaves the journal unsynced."""
    bookie.start()
    try:
        assert bookie.metrics_address is not None
        client = await RawBookieClient.connect(bookie.address)
        before = _fsyncs(bookie.metrics_address)
        for i in range(200):
            await vd_add(client, 1, i, lac=i - 1)  # the piggy-backed LAC moves every add
        assert _fsyncs(bookie.metrics_address) == before
        client.close()
    finally:
        bookie.kill9()


def _fsyncs(metrics_address: str) -> float:
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read().decode()
    found = re.search(r"^quire_bookie_journal_fsync_latency_count ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0
