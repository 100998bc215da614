"""The few ledger-client calls the log layer makes that are still being
added to the client (BP-62 ``batch_read``, BP-14 ``sync``), with the
fallbacks used until they land: plain ``read`` and ``close``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import cast

from quire.client import LedgerEntry, ReadHandle, WriteHandle
from quire.types import LedgerType

DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
"""Bytes one batched read asks for (a loose limit: at least one entry comes back)."""


async def read_batch(handle: ReadHandle, first: int, last: int,
                     max_bytes: int = DEFAULT_BATCH_BYTES) -> list[LedgerEntry]:
    """Entries ``first, first+1, ...`` of the ledger, in order: at least one
    and none past ``last`` (which must be <= the handle's LAC).  Uses one
    BP-62 batched read when the client has it (which may return fewer than
    asked: callers loop), else a pipelined ``read(first, last)``."""
    batch_read = getattr(handle, "batch_read", None)
    if batch_read is not None:
        call = cast(Callable[[int, int, int], Awaitable[list[LedgerEntry]]], batch_read)
        entries = await call(first, last - first + 1, max_bytes)
        if entries:
            return entries[: last - first + 1]
    return await handle.read(first, last)


async def sync_if_volatile(handle: WriteHandle) -> None:
    """BP-14: make a VD_JOURNAL ledger's acknowledged entries durable
    (``sync()``) when the client has it; a no-op for PD_JOURNAL ledgers.
    ``close()`` of a VD ledger syncs too, so this only narrows the window."""
    if handle.metadata.ledger_type is not LedgerType.VD_JOURNAL:
        return
    sync = getattr(handle, "sync", None)
    if sync is not None:
        await cast(Callable[[], Awaitable[int]], sync)()
