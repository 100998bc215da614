"""Replication workers: re-replicate marked ledgers onto live bookies.

A worker takes one marked ledger at a time under its lock (a leased record:
a worker that dies drops it) and, for each fragment whose ensemble names a
bookie to replace:

1. picks a writable bookie not in that ensemble (the placement policy);
2. copies every entry the replaced bookie held in the fragment (its write
   sets, striping included) from the other replicas to the new bookie with
   the :class:`~quire.node.entry_copier.EntryCopier` (each copy
   digest-checked; written with RECOVERY_ADD); a *lost* bookie is never
   read from, a *leaving* one (decommission) is;
3. swaps the new bookie into the fragment's ensemble by compare-and-set.

A ledger still OPEN is left alone for ``open_ledger_grace_ms`` after it was
marked (its writer replaces failed bookies itself), then fenced and closed
by recovery first, as upstream does.  The mark is deleted once no ensemble
names a bookie to replace; anything that fails leaves it, and the ledger is
tried again later by any worker.  A lost bookie that is registered again is
no longer replaced.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

from quire.client.placement import RandomPlacement, write_set
from quire.clock import SYSTEM_CLOCK
from quire.errors import MetadataNotFoundError, MetadataVersionError, QuireError
from quire.metadata import LedgerMetadata, MetadataStore
from quire.node.autorecovery.records import UnderReplicated, UnderReplication
from quire.node.entry_copier import EntryCopier, RemoteSink
from quire.node.repair import LedgerRecoverer
from quire.peer import BookiePool
from quire.types import LedgerState

log = logging.getLogger("quire.node.autorecovery")


@dataclass
class WorkerCounts:
    """What a worker did (its metrics)."""

    ledgers: int = 0
    fragments: int = 0
    entries: int = 0
    failures: int = 0


class _NotDone(QuireError):
    """The ledger cannot be finished now; its mark stays."""


class ReplicationWorker:
    """Takes marked ledgers one at a time (see the module docstring)."""

    def __init__(self, store: MetadataStore, pool: BookiePool, recoverer: LedgerRecoverer,
                 copier: EntryCopier, worker_id: str, *, open_ledger_grace_ms: int,
                 idle_interval_ms: int, add_timeout_ms: int) -> None:
        self._store = store
        self._marks = UnderReplication(store)
        self._pool = pool
        self._recoverer = recoverer
        self._copier = copier
        self._worker_id = worker_id
        self._grace_ms = open_ledger_grace_ms
        self._idle_s = idle_interval_ms / 1000.0
        self._add_timeout_ms = add_timeout_ms
        self._placement = RandomPlacement()
        self.counts = WorkerCounts()

    async def run(self) -> None:
        """Work until cancelled."""
        while True:
            try:
                worked = await self.run_once()
            except QuireError as e:
                log.warning("replication worker %s: %s", self._worker_id, e)
                worked = False
            if not worked:
                await asyncio.sleep(self._idle_s)

    async def run_once(self) -> bool:
        """Try each marked ledger once (random order, so workers spread);
        True if any was finished."""
        ledgers = await self._marks.marked()
        random.shuffle(ledgers)
        finished = False
        for ledger_id in ledgers:
            if not await self._marks.lock(ledger_id, self._worker_id):
                continue
            try:
                finished |= await self.replicate(ledger_id)
            except QuireError as e:
                self.counts.failures += 1
                log.warning("replication worker %s: ledger %d not done: %s", self._worker_id,
                            ledger_id, e)
            finally:
                await self._marks.unlock(ledger_id)
        return finished

    async def replicate(self, ledger_id: int) -> bool:
        """Re-replicate one marked ledger (lock held); True when its mark
        could be removed, False when it must wait (an open ledger in its
        grace period)."""
        mark = await self._marks.read(ledger_id)
        if mark is None:
            return False
        try:
            metadata = (await self._store.read_ledger(ledger_id)).value
        except MetadataNotFoundError:
            await self._marks.unmark(ledger_id)  # deleted: nothing to keep
            return True
        registered = {b.bookie_id for b in await self._store.list_bookies()}
        replace = (mark.lost - registered) | mark.leaving
        named = {b for _first, bookies in metadata.ensembles for b in bookies}
        if not replace & named:
            await self._marks.unmark(ledger_id)
            return True
        if metadata.state is not LedgerState.CLOSED:
            if SYSTEM_CLOCK.wall_ms() - mark.marked_ms < self._grace_ms:
                return False
            log.info("ledger %d: still open after the grace period: recovering it first",
                     ledger_id)
            metadata = await self._recoverer.recover(ledger_id)
        for index in range(len(metadata.ensembles)):
            _first, bookies = metadata.ensembles[index]
            for bookie in sorted(replace & set(bookies)):
                metadata = await self._replace(ledger_id, metadata, index, bookie, mark)
        await self._marks.unmark(ledger_id)
        self.counts.ledgers += 1
        log.info("ledger %d re-replicated (replaced %s)", ledger_id,
                 ", ".join(sorted(replace & named)))
        return True

    async def _replace(self, ledger_id: int, metadata: LedgerMetadata, index: int,
                       bookie: str, mark: UnderReplicated) -> LedgerMetadata:
        """Copy fragment ``index``'s entries of ``bookie`` to a new bookie and
        swap it in; returns the new metadata."""
        first, ensemble = metadata.ensembles[index]
        end = (metadata.ensembles[index + 1][0] - 1 if index + 1 < len(metadata.ensembles)
               else metadata.last_entry_id)
        position = ensemble.index(bookie)
        size, quorum = metadata.ensemble_size, metadata.write_quorum_size
        entry_ids = [e for e in range(first, end + 1) if position in write_set(e, size, quorum)]
        target = self._placement.replace_bookie(ensemble, self._pool.writable_bookies(),
                                                exclude=mark.bookies)
        sink = RemoteSink(self._pool, target, timeout_ms=self._add_timeout_ms)
        report = await self._copier.copy(ledger_id, metadata, entry_ids, sink, target=target,
                                         avoid=mark.lost)
        if report.unavailable:
            raise _NotDone(f"ledger {ledger_id}: {len(report.unavailable)} entries of "
                           f"{bookie} had no good copy now (first {report.unavailable[0]})")
        self.counts.entries += report.copied
        self.counts.fragments += 1
        return await self._swap(ledger_id, first, bookie, target)

    async def _swap(self, ledger_id: int, first: int, old: str, new: str) -> LedgerMetadata:
        """Put ``new`` in place of ``old`` in the fragment starting at
        ``first``, by compare-and-set."""
        for _ in range(10):
            versioned = await self._store.read_ledger(ledger_id)
            metadata = versioned.value
            ensembles = list(metadata.ensembles)
            at = next((i for i, (f, _b) in enumerate(ensembles) if f == first), None)
            if at is None or old not in ensembles[at][1]:
                raise _NotDone(f"ledger {ledger_id}: fragment {first} changed meanwhile")
            ensembles[at] = (first, tuple(new if b == old else b for b in ensembles[at][1]))
            updated = metadata.with_(ensembles=tuple(ensembles))
            try:
                await self._store.write_ledger(ledger_id, updated, versioned.version)
                return updated
            except MetadataVersionError:
                continue
        raise _NotDone(f"ledger {ledger_id}: its metadata kept changing")
