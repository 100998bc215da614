"""BP-46 (running without the journal) on real bookie processes: clusters of
journal-less bookies with or without the boot-time protection, and the
single-bookie calls the spec's scenarios are made of.

Bookies here never checkpoint on a timer (``flush_interval_ms`` is long), so
an entry they acknowledged lives in their write cache only until something
else checkpoints: a power loss (:meth:`BookieProcess.reboot_after_power_loss`)
loses it, as the spec's "boots again with all unflushed operations lost".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from quire.client import Client, ReadHandle
from quire.errors import LedgerRecoveryError, StatusCode
from quire.protocol import (
    FLAG_DO_FENCING,
    AddRequest,
    DigestManager,
    ReadRequest,
    ReadResponse,
    master_key,
)
from quire.types import DigestType
from tests.support.bookies import BookieProcess, RawBookieClient
from tests.support.cluster import Cluster

PASSWORD = b"bp46"
KEY = master_key(PASSWORD)


def journal_less_cluster(root: Path, *, protected: bool, size: int = 3,
                         **settings: Any) -> Cluster:
    """``size`` bookies with ``journal_write_data = false``, metrics on a free
    port, no periodic checkpoint; ``protected`` sets ``data_integrity_checking``."""
    return Cluster(root, size, **{"journal_write_data": False,
                                  "data_integrity_checking": protected,
                                  "flush_interval_ms": 600_000, "metrics_port": 0,
                                  "repair_retry_interval_ms": 200,
                                  **settings})


def stored_entry(ledger_id: int, entry_id: int, payload: bytes, lac: int = -1,
                 length: int = 0) -> bytes:
    """An entry as the client stores it (CRC32C digest under :data:`PASSWORD`)."""
    return DigestManager(ledger_id, DigestType.CRC32C, PASSWORD).encode(
        entry_id, lac, length, payload)


async def add_to(bookie: BookieProcess, entry: bytes) -> StatusCode:
    """One add of a stored entry to one bookie, under :data:`KEY`; its status."""
    raw = await RawBookieClient.connect(bookie.address)
    try:
        return (await raw.call(AddRequest(raw.next_id(), KEY, entry))).status
    finally:
        raw.close()


async def read_from(bookie: BookieProcess, ledger_id: int,
                    entry_id: int) -> tuple[StatusCode, bytes | None]:
    """One plain read from one bookie: (status, the stored entry or None)."""
    raw = await RawBookieClient.connect(bookie.address)
    try:
        answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, entry_id, 0, None))
        assert isinstance(answer, ReadResponse)
        return answer.status, answer.entry
    finally:
        raw.close()


async def fence_on(bookie: BookieProcess, ledger_id: int) -> StatusCode:
    """A recovery's fencing read (entry -1) to one bookie; its status."""
    raw = await RawBookieClient.connect(bookie.address)
    try:
        answer = await raw.call(ReadRequest(raw.next_id(), ledger_id, -1, FLAG_DO_FENCING, KEY))
        return answer.status
    finally:
        raw.close()


async def add_everywhere(bookies: list[BookieProcess], entry: bytes) -> list[StatusCode]:
    """The same add sent to every bookie at once (a writer's write set)."""
    return list(await asyncio.gather(*(add_to(b, entry) for b in bookies)))


async def recover_until_closed(client: Client, ledger_id: int,
                               timeout_s: float = 60.0) -> ReadHandle:
    """Open with recovery, again while the end cannot be decided yet (a
    restarted bookie may still be in limbo, a peer may be down)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
        except LedgerRecoveryError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
