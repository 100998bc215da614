"""Acknowledged adds and fences survive ``kill -9`` and emulated power loss.

``kill -9`` keeps the page cache, so it cannot show a missing fsync; the
power-loss emulation drops every byte written after the last fsync of each
journal and entry-log file.  ``test_power_loss_catches_a_missing_fsync``
proves the emulation has teeth: with the journal fsync disabled, entries the
bookie acknowledged are lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from quire.errors import StatusCode
from quire.protocol import FLAG_DO_FENCING, AddRequest, DigestManager, ReadRequest, master_key
from quire.types import DigestType
from tests.support.bookies import BookieProcess, RawBookieClient

KEY = master_key(b"pw")
ENTRIES = 300


def entry(ledger_id: int, entry_id: int) -> bytes:
    return DigestManager(ledger_id, DigestType.CRC32C, b"pw").encode(
        entry_id, entry_id - 1, 0, b"x" * 100 + str(entry_id).encode())


async def add_all(address: str, ledger_ids: list[int]) -> None:
    client = await RawBookieClient.connect(address)
    try:
        futures = [client.send(AddRequest(client.next_id(), KEY, entry(ledger_id, i)))
                   for i in range(ENTRIES) for ledger_id in ledger_ids]
        responses = await asyncio.wait_for(asyncio.gather(*futures), 60)
        assert all(r.status == StatusCode.OK for r in responses)  # type: ignore[union-attr]
    finally:
        client.close()


async def count_readable(address: str, ledger_ids: list[int]) -> dict[int, int]:
    client = await RawBookieClient.connect(address)
    try:
        found = {}
        for ledger_id in ledger_ids:
            futures = [client.send(ReadRequest(client.next_id(), ledger_id, i))
                       for i in range(ENTRIES)]
            responses = await asyncio.wait_for(asyncio.gather(*futures), 60)
            good = [r for i, r in enumerate(responses)
                    if r.status == StatusCode.OK and r.entry == entry(ledger_id, i)]  # type: ignore[union-attr]
            found[ledger_id] = len(good)
        return found
    finally:
        client.close()


def crash(bookie: BookieProcess, mode: str) -> None:
    if mode == "kill9":
        bookie.kill9()
    else:
        bookie.power_loss()


@pytest.mark.parametrize("mode", ["kill9", "power_loss"])
@pytest.mark.parametrize("flush_interval_ms", [50, 600_000], ids=["checkpointed", "journal-only"])
@pytest.mark.parametrize("sync_on_loop_max_ms", [1e6, 0.0], ids=["sync-on-loop", "fsync-thread"])
async def test_acknowledged_adds_survive_crash(tmp_path: Path, mode: str, flush_interval_ms: int,
                                               sync_on_loop_max_ms: float) -> None:
    bookie = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "b1",
                           flush_interval_ms=flush_interval_ms,
                           journal_sync_on_loop_max_ms=sync_on_loop_max_ms)
    bookie.start()
    try:
        ledgers = [1, 2, 3]
        await add_all(bookie.address, ledgers)
        crash(bookie, mode)
        bookie.start()
        assert await count_readable(bookie.address, ledgers) == {1: ENTRIES, 2: ENTRIES,
                                                                  3: ENTRIES}
    finally:
        bookie.kill9()


@pytest.mark.parametrize("mode", ["kill9", "power_loss"])
async def test_fence_survives_crash(tmp_path: Path, mode: str) -> None:
    bookie = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "b1",
                           flush_interval_ms=600_000)
    bookie.start()
    try:
        client = await RawBookieClient.connect(bookie.address)
        assert (await client.call(AddRequest(client.next_id(), KEY, entry(9, 0)))).status == 0  # type: ignore[union-attr]
        fenced = await client.call(ReadRequest(client.next_id(), 9, -1, FLAG_DO_FENCING, KEY))
        assert fenced.status == StatusCode.OK  # type: ignore[union-attr]
        client.close()
        crash(bookie, mode)
        bookie.start()
        client = await RawBookieClient.connect(bookie.address)
        response = await client.call(AddRequest(client.next_id(), KEY, entry(9, 1)))
        assert response.status == StatusCode.FENCED  # type: ignore[union-attr]
        client.close()
    finally:
        bookie.kill9()


async def test_power_loss_catches_a_missing_fsync(tmp_path: Path) -> None:
    """The emulation must fail a bookie that acknowledges before fsync."""
    bookie = BookieProcess(tmp_path, f"sqlite:///{tmp_path / 'meta.db'}", "b1",
                           flush_interval_ms=600_000, test_skip_journal_fsync=True)
    bookie.start()
    try:
        await add_all(bookie.address, [1])
        bookie.kill9()  # page cache kept: still all there
        bookie.start()
        assert await count_readable(bookie.address, [1]) == {1: ENTRIES}
        await add_all(bookie.address, [2])
        bookie.power_loss()
        bookie.start()
        assert (await count_readable(bookie.address, [2]))[2] < ENTRIES
    finally:
        bookie.kill9()
