"""Autorecovery in one process: an auditor candidate and a replication
worker, with their metrics (in a bookie process when
``autorecovery_enabled``, or alone with ``quire autorecovery start``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from quire.metadata import MetadataStore
from quire.node.autorecovery.auditor import Auditor
from quire.node.autorecovery.worker import ReplicationWorker
from quire.node.entry_copier import EntryCopier
from quire.node.repair import LedgerRecoverer
from quire.peer import BookiePool

log = logging.getLogger("quire.node.autorecovery")


@dataclass(frozen=True)
class AutorecoverySettings:
    lost_bookie_delay_s: float = 30.0
    """How long a bookie must be missing from the registry to count as lost."""
    open_ledger_grace_ms: int = 30_000
    """How long an open ledger's writer gets to replace a lost bookie itself
    before a worker recovers (closes) the ledger and re-replicates it."""
    check_interval_ms: int = 1000
    """The auditor's look at the registry, and an idle worker's pause."""
    read_timeout_ms: int = 10_000
    add_timeout_ms: int = 30_000
    chunk_max_bytes: int = 4 << 20
    batch_max_bytes: int = 4 << 20


class Autorecovery:
    """Runs the auditor candidate and one worker as tasks until stopped."""

    def __init__(self, store: MetadataStore, pool: BookiePool, recoverer: LedgerRecoverer,
                 worker_id: str, settings: AutorecoverySettings) -> None:
        copier = EntryCopier(pool, timeout_ms=settings.read_timeout_ms,
                             chunk_max_bytes=settings.chunk_max_bytes,
                             batch_max_bytes=settings.batch_max_bytes)
        self.auditor = Auditor(store, worker_id, lost_bookie_delay_s=settings.lost_bookie_delay_s,
                               check_interval_ms=settings.check_interval_ms)
        self.worker = ReplicationWorker(store, pool, recoverer, copier, worker_id,
                                        open_ledger_grace_ms=settings.open_ledger_grace_ms,
                                        idle_interval_ms=settings.check_interval_ms,
                                        add_timeout_ms=settings.add_timeout_ms)
        self._tasks: list[asyncio.Task[None]] = []

    def register_metrics(self, registry: CollectorRegistry) -> None:
        counts = self.worker.counts

        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(f"quire_autorecovery_{name}", doc, registry=registry).set_function(value)

        gauge("ledgers_replicated_total", "Marked ledgers this worker finished (counter)",
              lambda: counts.ledgers)
        gauge("fragments_replicated_total", "Fragments re-replicated (counter)",
              lambda: counts.fragments)
        gauge("entries_copied_total", "Entries copied to replacement bookies (counter)",
              lambda: counts.entries)
        gauge("failures_total", "Ledgers left marked after a try (counter)",
              lambda: counts.failures)
        gauge("ledgers_marked_total", "Ledgers this process marked as auditor (counter)",
              lambda: self.auditor.ledgers_marked)
        gauge("underreplicated_ledgers", "Ledgers marked under-replicated now (reported "
              "by the auditor; 0 elsewhere)", lambda: self.auditor.under_replicated)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self.auditor.run()), loop.create_task(self.worker.run())]
        for task in self._tasks:
            task.add_done_callback(_log_failure)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("autorecovery task stopped: %r", task.exception(), exc_info=task.exception())
