"""BP-46 phase two: recover limbo ledgers and copy back what this bookie lacks.

Runs in the background of a serving bookie (started by
:class:`~quire.node.bookie_node.BookieNode` once registered), in passes.  A
pass looks at every ledger whose ensembles name this bookie (limbo ledgers
first) and for each one:

1. a ledger this bookie keeps in limbo and whose metadata is not CLOSED is
   opened with recovery (fenced on its ensemble and closed at its last
   recoverable entry) through the client (:class:`LedgerRecoverer`);
2. for a CLOSED ledger, every entry up to its last one that this bookie
   should hold (each fragment's write sets, striping included) and does
   not store is copied from a peer with the :class:`~quire.node.entry_copier.EntryCopier`
   (each copy digest-checked) into this bookie's storage, durably;
3. its limbo ends (journaled and synced).

A ledger that is still OPEN and not in limbo is being written by a live
writer and is left alone.  A ledger deleted from metadata leaves limbo at
once (garbage collection drops it).  A ledger that cannot be finished now
(recovery cannot decide, no peer answers, an entry has no good copy) stays
in limbo, so this bookie keeps answering UNKNOWN for what it lacks, and is
tried again in the next pass, ``repair_retry_interval_ms`` later.  Passes
repeat until nothing is left in limbo.  Everything a pass needs is in the
index (limbo marks) and metadata, so a restart half way simply starts again.

Progress: a log line per ``repair_progress_every_ledgers`` ledgers and one
per pass, and the ``quire_bookie_repair_*`` metrics (:class:`RepairMetrics`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge

from quire.bookie.storage import BookieStorage
from quire.client import Client
from quire.client.placement import write_set
from quire.errors import MetadataNotFoundError, QuireError
from quire.metadata import LedgerMetadata, MetadataStore
from quire.node.entry_copier import EntryCopier
from quire.node.integrity import holds, ledgers_of
from quire.types import LedgerState

log = logging.getLogger("quire.node.repair")

_MAX_PAUSE_MS = 60_000
"""Longest pause between passes (the pause doubles from
``repair_retry_interval_ms`` while passes leave work)."""


class LedgerRecoverer(Protocol):
    """Closes a ledger the way a recovering reader does.

    :meth:`recover` fences the ledger on its current ensemble, closes it at
    its last recoverable entry and returns the CLOSED metadata (at once if
    it is closed already).  It raises :class:`~quire.errors.QuireError`
    when the end cannot be decided now (to be tried again later),
    :class:`~quire.errors.MetadataNotFoundError` if the ledger is gone.  It
    needs no password: the keys are the metadata's."""

    async def recover(self, ledger_id: int) -> LedgerMetadata: ...


class ClientRecoverer:
    """:class:`~quire.node.repair.LedgerRecoverer` through the client: open
    with recovery and the keys the metadata holds (BookKeeperAdmin's
    openLedger)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def recover(self, ledger_id: int) -> LedgerMetadata:
        handle = await self._client.open_ledger_as_admin(ledger_id, recovery=True)
        metadata = handle.metadata
        await handle.close()
        return metadata


@dataclass(frozen=True)
class RepairSettings:
    start_delay_ms: int
    """Pause before the first pass."""
    retry_interval_ms: int
    """Pause between passes while some ledger is still in limbo."""
    parallel_ledgers: int
    """Ledgers repaired at once."""
    progress_every_ledgers: int
    """A progress log line per this many ledgers checked."""


class RepairMetrics:
    """The ``quire_bookie_repair_*`` metrics (counters are plain ints read
    at scrape time, like the bookie's)."""

    def __init__(self, registry: CollectorRegistry, limbo_count: Callable[[], int]) -> None:
        self.passes = 0
        self.ledgers_checked = 0
        self.ledgers_repaired = 0
        self.entries_copied = 0
        self.copies_refused = 0
        self.failures = 0
        self.pending = 0

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(f"quire_bookie_repair_{name}", doc, registry=registry).set_function(value)

        gauge("limbo_ledgers", "Ledgers in limbo now", lambda: limbo_count())
        gauge("pending_ledgers", "Ledgers left in the current pass", lambda: self.pending)
        gauge("passes_total", "Phase-two passes completed (counter)", lambda: self.passes)
        gauge("ledgers_checked_total", "Ledgers checked (counter)",
              lambda: self.ledgers_checked)
        gauge("ledgers_repaired_total", "Ledgers that needed entries or recovery and got "
              "them (counter)", lambda: self.ledgers_repaired)
        gauge("entries_copied_total", "Entries copied from peers (counter)",
              lambda: self.entries_copied)
        gauge("copies_refused_total", "Peer copies refused for a bad digest (counter)",
              lambda: self.copies_refused)
        gauge("failures_total", "Ledgers left for a later pass (counter)",
              lambda: self.failures)


class LocalSink:
    """:class:`~quire.node.entry_copier.EntrySink` into this bookie's own
    storage: recovery adds (past the fence) into the write cache, durable
    once a checkpoint covers them (``covering``)."""

    def __init__(self, storage: BookieStorage,
                 covering: Callable[[int], Awaitable[None]]) -> None:
        self._storage = storage
        self._covering = covering

    async def store(self, ledger_id: int, master_key: bytes,
                    entries: Sequence[tuple[int, bytes]]) -> None:
        storage = self._storage
        if storage.get_master_key(ledger_id) != master_key:
            # known without a key (created by phase one) or not at all: the
            # fence takes the key (the ledger stays fenced)
            storage.fence(ledger_id, master_key)
        results = storage.add_entries([(ledger_id, e, data, master_key) for e, data in entries],
                                      recovery=True, journal=False)
        epochs = []
        for result in results:
            if isinstance(result, Exception):
                raise result
            epochs.append(result)
        await self._covering(max(epochs))


class _NotYet(QuireError):
    """A ledger that cannot be finished in this pass."""


class LedgerRepair:
    """Phase two for one bookie (see the module docstring)."""

    def __init__(self, bookie_id: str, store: MetadataStore, storage: BookieStorage,
                 recoverer: LedgerRecoverer, copier: EntryCopier, sink: LocalSink,
                 wait_journal: Callable[[int], Awaitable[None]], settings: RepairSettings,
                 metrics: RepairMetrics) -> None:
        self._bookie_id = bookie_id
        self._store = store
        self._storage = storage
        self._recoverer = recoverer
        self._copier = copier
        self._sink = sink
        self._wait_journal = wait_journal
        self._settings = settings
        self.metrics = metrics
        self._idle = asyncio.Event()

    async def run(self, *, everything_first: bool) -> None:
        """Passes until nothing is left to do.  With ``everything_first``
        (``data_integrity_checking``) the first pass looks at every ledger
        of this bookie, else at the limbo ones; later passes at the limbo
        ones and those the pass before could not finish."""
        everything = everything_first
        unfinished: set[int] = set()
        pause_ms = self._settings.retry_interval_ms
        if self._settings.start_delay_ms > 0:
            await asyncio.sleep(self._settings.start_delay_ms / 1000.0)
        while True:
            try:
                unfinished = await self.run_pass(everything=everything, also=unfinished)
            except QuireError as e:  # e.g. metadata unreachable: the whole pass again
                log.warning("phase two: pass failed (%s); again in %d ms", e, pause_ms)
            else:
                everything = False
                if not unfinished:
                    self._idle.set()
                    return
            await asyncio.sleep(pause_ms / 1000.0)
            # a ledger nobody can help now (its only copies are bad) is not
            # worth a pass every few seconds forever
            pause_ms = min(pause_ms * 2, max(self._settings.retry_interval_ms, _MAX_PAUSE_MS))

    async def wait_idle(self) -> None:
        """Return once a pass left nothing in limbo or unfinished."""
        await self._idle.wait()

    async def run_pass(self, *, everything: bool, also: set[int] | None = None) -> set[int]:
        """One pass over the limbo ledgers and ``also`` (or, ``everything``,
        every ledger of this bookie); returns the ledgers it could not
        finish (still in limbo, or still lacking entries)."""
        started = time.monotonic()
        limbo = set(self._storage.limbo_ledgers())
        if everything:
            ledgers = await ledgers_of(self._store, self._bookie_id)
            todo = sorted(ledgers, key=lambda i: (i not in limbo, i))
        else:
            todo = sorted(limbo | (also or set()))
        unfinished: set[int] = set()
        metrics = self.metrics
        metrics.pending = len(todo)
        checked = 0
        copied_before = metrics.entries_copied
        queue: asyncio.Queue[int] = asyncio.Queue()
        for ledger_id in todo:
            queue.put_nowait(ledger_id)
        every = max(1, self._settings.progress_every_ledgers)

        async def worker() -> None:
            nonlocal checked
            while not queue.empty():
                ledger_id = queue.get_nowait()
                try:
                    await self.repair_ledger(ledger_id)
                except QuireError as e:
                    unfinished.add(ledger_id)
                    metrics.failures += 1
                    log.warning("phase two: ledger %d not repaired yet: %s", ledger_id, e)
                metrics.pending -= 1
                metrics.ledgers_checked += 1
                checked += 1
                if checked % every == 0:
                    log.info("phase two: %d/%d ledgers checked, %d entries copied",
                             checked, len(todo), metrics.entries_copied - copied_before)

        workers = max(1, min(self._settings.parallel_ledgers, len(todo)))
        await asyncio.gather(*(worker() for _ in range(workers)))
        unfinished.update(self._storage.limbo_ledgers())
        metrics.passes += 1
        log.info("phase two: pass done: %d ledgers checked, %d entries copied, %d unfinished "
                 "(%d in limbo), %.1f s", checked, metrics.entries_copied - copied_before,
                 len(unfinished), len(self._storage.limbo_ledgers()), time.monotonic() - started)
        return unfinished

    async def repair_ledger(self, ledger_id: int) -> None:
        """Recover (if in limbo), copy what is missing, end limbo; raises
        :class:`~quire.errors.QuireError` when that cannot be done now."""
        storage = self._storage
        in_limbo = storage.is_limbo(ledger_id)
        try:
            metadata = (await self._store.read_ledger(ledger_id)).value
        except MetadataNotFoundError:
            metadata = None
        if metadata is not None and holds(metadata, self._bookie_id):
            if in_limbo and metadata.state is not LedgerState.CLOSED:
                try:
                    metadata = await self._recoverer.recover(ledger_id)
                except MetadataNotFoundError:
                    metadata = None
            if metadata is not None and metadata.state is LedgerState.CLOSED:
                await self._copy_missing(ledger_id, metadata)
            elif metadata is not None:
                return  # open, not in limbo: its writer is at work
        if in_limbo:  # deleted, not ours any more, or repaired
            await self._wait_journal(storage.clear_limbo(ledger_id))
            log.info("phase two: ledger %d out of limbo", ledger_id)

    async def _copy_missing(self, ledger_id: int, metadata: LedgerMetadata) -> None:
        missing = self.missing_entries(ledger_id, metadata)
        if not missing:
            return
        metrics = self.metrics

        def stored(count: int) -> None:
            metrics.entries_copied += count

        report = await self._copier.copy(ledger_id, metadata, missing, self._sink,
                                         target=self._bookie_id, on_stored=stored)
        metrics.copies_refused += report.refused
        metrics.ledgers_repaired += not report.unavailable
        if report.unavailable:
            raise _NotYet(f"ledger {ledger_id}: {len(report.unavailable)} of {len(missing)} "
                          f"missing entries had no good copy now (first "
                          f"{report.unavailable[0]})")
        log.info("phase two: ledger %d: copied %d entries", ledger_id, report.copied)

    def missing_entries(self, ledger_id: int, metadata: LedgerMetadata) -> list[int]:
        """Entries of the closed ledger this bookie should hold and lacks."""
        last = metadata.last_entry_id
        if last < 0:
            return []
        me = self._bookie_id
        size, quorum = metadata.ensemble_size, metadata.write_quorum_size
        fragments = metadata.ensembles
        missing: list[int] = []
        for index, (first, bookies) in enumerate(fragments):
            end = fragments[index + 1][0] - 1 if index + 1 < len(fragments) else last
            end = min(end, last)
            if me not in bookies or end < first:
                continue
            position = bookies.index(me)
            mine = [e for e in range(first, end + 1)
                    if position in write_set(e, size, quorum)]
            if not mine:
                continue
            have = self._storage.stored_entry_ids(ledger_id, first, end)
            missing.extend(e for e in mine if e not in have)
        return missing
