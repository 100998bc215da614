"""The two ledger chores of the log layer, through the public client API:
finding a ledger's end by recovering it, and deleting ledgers that left a
log (best effort)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from quire.client import Client, Password
from quire.errors import MetadataError, MetadataNotFoundError

log = logging.getLogger("quire.log")


@dataclass(frozen=True)
class LedgerEnd:
    """Where a closed ledger ends: its entry count and payload bytes."""

    entries: int
    bytes: int


async def recover_end(client: Client, ledger_id: int, password: Password) -> LedgerEnd:
    """Fence the ledger and close it at its last recoverable entry (at once
    if it is closed already); its end.  A ledger that no longer exists ends
    at 0 entries."""
    try:
        handle = await client.open_ledger(ledger_id, password=password, recovery=True)
    except MetadataNotFoundError:
        return LedgerEnd(0, 0)
    try:
        return LedgerEnd(handle.metadata.last_entry_id + 1, handle.metadata.length)
    finally:
        await handle.close()


async def delete_ledgers(client: Client, ledger_ids: Iterable[int]) -> list[int]:
    """Delete ledgers, best effort (one already gone is fine; a failure is
    logged and left for a later garbage collection); returns those deleted."""
    deleted = []
    for ledger_id in ledger_ids:
        try:
            await client.delete_ledger(ledger_id)
        except MetadataNotFoundError:
            pass
        except MetadataError as e:
            log.warning("could not delete ledger %d: %s", ledger_id, e)
            continue
        deleted.append(ledger_id)
    return deleted
