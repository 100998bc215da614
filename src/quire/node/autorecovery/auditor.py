"""The auditor: notices lost bookies and marks what they held.

One auditor at a time in a cluster, chosen by the metadata store's leader
election (:data:`~quire.node.autorecovery.records.AUDITOR_GROUP`); any
process running autorecovery is a candidate, and another takes over within
about a lease when the auditor's process dies.

The auditor compares the bookies that have a cookie (every bookie that ever
joined and was not decommissioned) with the registry every
``check_interval_ms``.  A bookie missing from the registry for
``lost_bookie_delay_s`` is lost: every ledger whose ensembles name it is
marked under-replicated (:func:`mark_ledgers_of`).  A bookie that comes back
before that is forgotten; one that comes back after is left to the workers,
which skip a lost bookie that is registered again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

from quire.clock import SYSTEM_CLOCK
from quire.errors import MetadataNotFoundError, QuireError
from quire.metadata import MetadataStore
from quire.node.autorecovery.records import AUDITOR_GROUP, UnderReplicated, UnderReplication

log = logging.getLogger("quire.node.autorecovery")

_READS_IN_FLIGHT = 32


async def mark_ledgers_of(store: MetadataStore, *, lost: Collection[str] = (),
                          leaving: Collection[str] = ()) -> int:
    """Mark every ledger whose ensembles name a bookie of ``lost`` or
    ``leaving``; return how many were marked."""
    wanted = set(lost) | set(leaving)
    if not wanted:
        return 0
    marks = UnderReplication(store)
    now_ms = SYSTEM_CLOCK.wall_ms()
    slots = asyncio.Semaphore(_READS_IN_FLIGHT)
    marked = 0

    async def one(ledger_id: int) -> None:
        nonlocal marked
        async with slots:
            try:
                metadata = (await store.read_ledger(ledger_id)).value
            except MetadataNotFoundError:
                return
            named = {b for _first, bookies in metadata.ensembles for b in bookies} & wanted
            if named:
                await marks.mark(UnderReplicated(ledger_id, frozenset(named & set(lost)),
                                                 frozenset(named - set(lost)), now_ms))
                marked += 1

    await asyncio.gather(*(one(ledger_id) for ledger_id in await store.list_ledgers()))
    return marked


async def lost_bookies(store: MetadataStore) -> set[str]:
    """Bookies with a cookie that are not registered now."""
    registered = {b.bookie_id for b in await store.list_bookies()}
    return set(await store.list_cookies()) - registered


class Auditor:
    """A candidate for the auditor's job, and the job once elected."""

    def __init__(self, store: MetadataStore, candidate: str, *, lost_bookie_delay_s: float,
                 check_interval_ms: int) -> None:
        self._store = store
        self._candidate = candidate
        self._delay_s = lost_bookie_delay_s
        self._interval_s = check_interval_ms / 1000.0
        self.ledgers_marked = 0
        self.under_replicated = 0
        """Ledgers marked under-replicated as of the last check (0 unless
        this process is the auditor)."""

    async def run(self) -> None:
        election = self._store.elect(AUDITOR_GROUP, self._candidate)
        try:
            while True:
                await election.wait_leader()
                log.info("auditor: %s is the auditor", self._candidate)
                missing_since: dict[str, float] = {}
                marked_for: set[str] = set()
                while election.is_leader:
                    try:
                        await self.check(missing_since, marked_for)
                        self.under_replicated = len(
                            await UnderReplication(self._store).marked())
                    except QuireError as e:
                        log.warning("auditor: check failed: %s", e)
                    await asyncio.sleep(self._interval_s)
                self.under_replicated = 0
        finally:
            await election.resign()

    async def check(self, missing_since: dict[str, float], marked_for: set[str]) -> None:
        """One look at the registry; marks the ledgers of bookies lost for
        the delay."""
        missing = await lost_bookies(self._store)
        now = time.monotonic()
        for bookie in missing:
            if bookie not in missing_since:
                log.info("auditor: bookie %s is not registered; lost in %.0f s unless it "
                         "returns", bookie, self._delay_s)
                missing_since[bookie] = now
        for bookie in set(missing_since) - missing:
            del missing_since[bookie]
            marked_for.discard(bookie)
        due = {b for b, since in missing_since.items()
               if now - since >= self._delay_s and b not in marked_for}
        if due:
            count = await mark_ledgers_of(self._store, lost=due)
            marked_for.update(due)
            self.ledgers_marked += count
            log.warning("auditor: bookies %s lost: %d ledgers marked under-replicated",
                        ", ".join(sorted(due)), count)
