"""BP-46's journal bypass (``journal_write_data = false``) on a real bookie
process: adds are answered from the write cache without entry data in the
journal, SYNC answers only what a checkpoint made durable, and an
unprotected bookie says so loudly."""

from __future__ import annotations

import asyncio
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
PAYLOAD = b"p" * 1024


def entry(ledger_id: int, entry_id: int, lac: int = -1) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(
        entry_id, lac, 0, PAYLOAD + str(entry_id).encode())


def bookie_at(tmp_path: Path, **settings: object) -> BookieProcess:
    # No periodic checkpoint: only SYNC (or a full write cache) checkpoints.
    return BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "nj",
                         flush_interval_ms=600_000, **settings)


async def add_many(client: RawBookieClient, ledger_id: int, first: int, count: int,
                   flags: int) -> list[AddResponse]:
    """Pipelined adds; each piggy-backs the previous id as its LAC."""
    futures = [client.send(AddRequest(client.next_id(), KEY, entry(ledger_id, i, i - 1), flags))
               for i in range(first, first + count)]
    responses = await asyncio.wait_for(asyncio.gather(*futures), 60)
    assert all(isinstance(r, AddResponse) and r.status == StatusCode.OK for r in responses)
    return responses  # type: ignore[return-value]


async def sync(client: RawBookieClient, ledger_id: int) -> int:
    response = await client.call(SyncRequest(client.next_id(), ledger_id))
    assert isinstance(response, SyncResponse) and response.status == StatusCode.OK
    return response.last_add_synced


async def readable(client: RawBookieClient, ledger_id: int, count: int) -> list[int]:
    """The entry ids below ``count`` read back intact."""
    futures = [client.send(ReadRequest(client.next_id(), ledger_id, i)) for i in range(count)]
    responses = await asyncio.wait_for(asyncio.gather(*futures), 60)
    return [i for i, r in enumerate(responses)
            if r.status == StatusCode.OK and r.entry == entry(ledger_id, i, i - 1)]  # type: ignore[union-attr]


def file_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()
               and not p.name.startswith(".") and p.name != "LOCK")


@pytest.mark.parametrize("journal_write_data", [False, True], ids=["journal-off", "journal-on"])
async def test_entry_data_skips_the_journal(tmp_path: Path, journal_write_data: bool) -> None:
    """Journal off: adds are answered and readable (before and after the
    checkpoint), and the journal holds no entry data; the journal-on run
    shows the measure would catch it (its journal holds every entry)."""
    bookie = bookie_at(tmp_path, journal_write_data=journal_write_data,
                       data_integrity_checking=True, journal_preallocate=False)
    count = 2000
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        await add_many(client, 1, 0, count, 0)
        assert await readable(client, 1, count) == list(range(count))  # from the write cache
        assert await sync(client, 1) == count - 1  # journal off: a checkpoint ran
        assert await readable(client, 1, count) == list(range(count))
        client.close()
        bookie.stop()
    finally:
        bookie.kill9()
    entry_bytes = count * len(PAYLOAD)
    journal = file_bytes(bookie.data_dir / "journal" / "journal")
    entry_logs = file_bytes(bookie.data_dir / "ledgers" / "ledgers" / "entrylog")
    assert entry_logs > entry_bytes
    if journal_write_data:
        assert journal > entry_bytes
    else:
        assert journal < entry_bytes // 20


@pytest.mark.parametrize("flags", [FLAG_VOLATILE_DURABILITY, 0], ids=["vd", "pd"])
async def test_power_loss_after_sync_loses_nothing_synced(tmp_path: Path, flags: int) -> None:
    """Journal off, no periodic checkpoint: nothing at or below what SYNC
    returned is lost to a power loss right after it.  The acknowledged
    but unsynced tail is lost (it was in the write cache only): the
    emulation catches a bookie that would report the write cache as synced."""
    bookie = bookie_at(tmp_path, journal_write_data=False)
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        answers = await add_many(client, 1, 0, 300, flags)
        # LACs piggy-backed on the adds confirm nothing without the journal
        assert {a.last_add_synced for a in answers} == {-1}
        synced = await sync(client, 1)
        assert synced == 299
        answers = await add_many(client, 1, 300, 200, flags)
        if flags & FLAG_VOLATILE_DURABILITY:  # the cursor moved with the checkpoint only
            assert {a.last_add_synced for a in answers} == {synced}
        client.close()
        bookie.power_loss()
        bookie.start()
        client = await RawBookieClient.connect(bookie.address)
        found = await readable(client, 1, 500)
        client.close()
    finally:
        bookie.kill9()
    assert found[:synced + 1] == list(range(synced + 1))
    assert len(found) < 500  # the acknowledged, unsynced tail was in the write cache only


async def test_unprotected_bookie_warns_at_start(tmp_path: Path) -> None:
    bookie = bookie_at(tmp_path, journal_write_data=False)
    bookie.start()
    bookie.stop()
    assert "UNSAFE: journal_write_data = false" in bookie.log_path.read_text()
    protected = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta2.db'}", "nj2",
                              journal_write_data=False, data_integrity_checking=True)
    protected.start()
    protected.stop()
    log_text = protected.log_path.read_text()
    assert "UNSAFE" not in log_text
    assert "phase two starts" in log_text  # the protection runs instead
