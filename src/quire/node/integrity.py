"""BP-46 phase one: protect, before serving, what this bookie may have lost.

Run by :class:`~quire.node.bookie_node.BookieNode` at boot, after the
storage opened and before the server answers anything, when a directory's
cookie was missing (an emptied or replaced disk) or when the previous run
crashed while acknowledging adds the journal did not hold
(``journal_write_data = false``) and ``data_integrity_checking`` is on; and by
``quire cookie fix``.

Every ledger whose ensembles (any fragment) name this bookie is fenced here,
so that no writer can add to it through this bookie again (the spec's
scenario 1: a fence lost with the crash would let a writer that missed the
close reach its ack quorum).  Those not CLOSED are also put in limbo: this
bookie may have lost entries of them, so it must never answer "no such
entry" for them until phase two (:mod:`~quire.node.repair`) has recovered and
repaired them (scenario 2: two such noes would let a recovery close the
ledger short).  A ledger this bookie never stored is created, fenced (and in
limbo if open).  All of it is durable when :func:`protect_ledgers` returns.

The spec fences "non-closed" ledgers only; fencing closed ones as well costs
nothing (nobody may add to a closed ledger) and covers a writer that has not
yet seen the close (see ARCHITECTURE.md, decisions).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from quire.bookie.storage import BookieStorage
from quire.errors import MetadataNotFoundError
from quire.metadata import LedgerMetadata, MetadataStore
from quire.types import LedgerState

log = logging.getLogger("quire.node.integrity")

_METADATA_READS_IN_FLIGHT = 32


@dataclass(frozen=True)
class Protection:
    """What phase one did."""

    fenced: int
    """Ledgers fenced (all of this bookie's)."""
    limbo: int
    """Of those, the ones put in limbo (not CLOSED)."""


def holds(metadata: LedgerMetadata, bookie_id: str) -> bool:
    """True if any fragment's ensemble names ``bookie_id``."""
    return any(bookie_id in bookies for _first, bookies in metadata.ensembles)


async def ledgers_of(store: MetadataStore, bookie_id: str) -> dict[int, LedgerMetadata]:
    """The metadata of every ledger whose ensembles name ``bookie_id``
    (ledgers deleted while listing are left out).  A metadata error
    propagates: without the list, nothing can be protected."""
    ledger_ids = await store.list_ledgers()
    found: dict[int, LedgerMetadata] = {}
    slots = asyncio.Semaphore(_METADATA_READS_IN_FLIGHT)

    async def read(ledger_id: int) -> None:
        async with slots:
            try:
                metadata = (await store.read_ledger(ledger_id)).value
            except MetadataNotFoundError:
                return
        if holds(metadata, bookie_id):
            found[ledger_id] = metadata

    await asyncio.gather(*(read(ledger_id) for ledger_id in ledger_ids))
    return found


async def protect_ledgers(store: MetadataStore, storage: BookieStorage,
                          bookie_id: str) -> Protection:
    """Phase one (see the module docstring); durable when it returns."""
    ledgers = await ledgers_of(store, bookie_id)
    open_ids = sorted(i for i, md in ledgers.items() if md.state is not LedgerState.CLOSED)
    closed_ids = sorted(i for i, md in ledgers.items() if md.state is LedgerState.CLOSED)
    await asyncio.to_thread(storage.mark_fenced, closed_ids)
    await asyncio.to_thread(storage.mark_limbo, open_ids)
    protection = Protection(fenced=len(ledgers), limbo=len(open_ids))
    log.warning("phase one: fenced %d ledgers (%d in limbo)", protection.fenced,
                protection.limbo)
    return protection


async def protect_if_needed(store: MetadataStore, storage: BookieStorage, bookie_id: str, *,
                            cookie_failed: bool, data_integrity_checking: bool
                            ) -> Protection | None:
    """Phase one when it is due: a directory lost its cookie, or the last
    run crashed while acknowledging adds only its write cache held (and
    ``data_integrity_checking`` is on).  The protection is durable before
    the running mark stops saying "crashed without the journal", so a crash
    in between runs phase one again.  None when nothing was due."""
    lost_writes = storage.last_shutdown.may_have_lost_acknowledged_entries
    if lost_writes and not data_integrity_checking:
        log.warning("bookie %s: the last run crashed without the journal and "
                    "data_integrity_checking is off: acknowledged entries it held may be "
                    "lost, undetected", bookie_id)
        lost_writes = False  # (the mark keeps saying so until a clean shutdown)
    if not (lost_writes or cookie_failed):
        return None
    protection = await protect_ledgers(store, storage, bookie_id)
    if storage.last_shutdown.may_have_lost_acknowledged_entries:
        await asyncio.to_thread(storage.unclean_shutdown_handled)
    return protection
