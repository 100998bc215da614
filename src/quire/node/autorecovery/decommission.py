"""Decommissioning a bookie that is still up.

:func:`decommission` marks every ledger whose ensembles name the bookie as
under-replicated with the bookie *leaving* (so it still serves as a source
of copies), runs a replication worker of its own beside any the cluster
runs, and waits until no ensemble names the bookie (ledgers created on it
meanwhile are marked in the next round).  Then it deletes the bookie's
cookie and registration: a bookie process still running is told to stop by
nothing but its operator, and cannot start again with the same directories
(its cookie is gone from metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from quire.errors import MetadataNotFoundError, QuireError
from quire.metadata import MetadataStore
from quire.node.autorecovery.auditor import mark_ledgers_of
from quire.node.autorecovery.records import UnderReplication
from quire.node.autorecovery.service import AutorecoverySettings
from quire.node.autorecovery.worker import ReplicationWorker
from quire.node.entry_copier import EntryCopier
from quire.node.repair import LedgerRecoverer
from quire.peer import BookiePool

log = logging.getLogger("quire.node.autorecovery")


@dataclass(frozen=True)
class DecommissionProgress:
    ledgers_left: int
    """Marked ledgers naming the bookie, not finished yet."""
    entries_copied: int
    """Entries this process copied so far."""


async def decommission(store: MetadataStore, pool: BookiePool, recoverer: LedgerRecoverer,
                       bookie_id: str, settings: AutorecoverySettings,
                       on_progress: Callable[[DecommissionProgress], None] | None = None,
                       max_rounds: int = 20) -> int:
    """Re-replicate everything ``bookie_id`` holds, then remove its cookie
    and registration; returns the number of ledgers re-replicated."""
    copier = EntryCopier(pool, timeout_ms=settings.read_timeout_ms,
                         chunk_max_bytes=settings.chunk_max_bytes,
                         batch_max_bytes=settings.batch_max_bytes)
    worker = ReplicationWorker(store, pool, recoverer, copier, f"decommission-{bookie_id}",
                               open_ledger_grace_ms=0,
                               idle_interval_ms=settings.check_interval_ms,
                               add_timeout_ms=settings.add_timeout_ms)
    marks = UnderReplication(store)
    total = 0
    for _round in range(max_rounds):
        marked = await mark_ledgers_of(store, leaving=[bookie_id])
        if marked == 0:
            break
        total += marked
        while True:
            left = 0
            for ledger_id in await marks.marked():
                mark = await marks.read(ledger_id)
                if mark is not None and bookie_id in mark.bookies:
                    left += 1
            if on_progress is not None:
                on_progress(DecommissionProgress(left, worker.counts.entries))
            if left == 0:
                break
            if not await worker.run_once():
                await asyncio.sleep(settings.check_interval_ms / 1000.0)
    else:
        raise QuireError(f"bookie {bookie_id}: ledgers kept being created on it; stop "
                         f"placing ledgers on it (stop it) and run decommission again")
    with contextlib.suppress(MetadataNotFoundError):
        await store.delete_cookie(bookie_id)
    with contextlib.suppress(MetadataNotFoundError):
        await store.unregister_bookie(bookie_id)
    log.info("bookie %s decommissioned: %d ledgers re-replicated, %d entries copied",
             bookie_id, total, worker.counts.entries)
    return total
