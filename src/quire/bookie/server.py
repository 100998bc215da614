"""The bookie server: one storage engine served on one event loop.

A library object built from an already-open storage engine and group
committer (``quire.node`` opens them, and assembles the process around the
server: cookie, listener, registration, signals).  It composes:

* :mod:`~quire.bookie.connection`: connections, framing, answers written
  once per loop iteration, back-pressure, connection limits (the listener,
  TLS and mutual TLS included, is :mod:`~quire.bookie.listener`'s);
* :mod:`~quire.bookie.adds`: the one add pipeline, every add a run of columns;
* :mod:`~quire.bookie.durability`: when an add is answered and when it
  counts as synced (PD, BP-14 VD, BP-46's journal bypass), chosen once per
  ledger;
* :mod:`~quire.bookie.handlers`: reads, fencing, LAC, batch reads, SYNC;
* :mod:`~quire.bookie.services`: checkpoints, GC, the disk watch.

Failure containment: a malformed frame closes that connection only; an
unexpected exception while handling a request answers IO_ERROR to that
request only; a failed fsync answers IO_ERROR to the adds it covered and
turns the bookie read-only (their durability is unknown, never "OK").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quire.bookie.adds import AddPipeline, run_of_one
from quire.bookie.config import BookieConfig, warn_if_unprotected
from quire.bookie.connection import BookieConnection, ConnectionHub
from quire.bookie.durability import (
    AfterFsync,
    CheckpointedDurability,
    DurabilityPolicy,
    PersistentDurability,
    SyncCursors,
    VolatileDurability,
)
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.handlers import RequestHandlers
from quire.bookie.metrics import BookieMetrics, RequestLatencies
from quire.bookie.services import BackgroundServices
from quire.bookie.status import BookieStatus, StatePublisher
from quire.bookie.storage import BookieStorage
from quire.bookie.sync_cursor import SyncCursor
from quire.metadata import MetadataStore
from quire.protocol import AddRequest, AddRequestRun, Request


class BookieServer:
    """Serves one open storage engine (see the module docstring); it is the
    :class:`~quire.bookie.connection.RequestHandler` of its connections.
    Build it with :meth:`open`."""

    def __init__(self, config: BookieConfig, storage: BookieStorage, committer: GroupCommitter,
                 store: MetadataStore, publisher: StatePublisher,
                 cursors: dict[int, SyncCursor], metrics: BookieMetrics | None = None) -> None:
        self.config = config
        self.storage = storage
        self.committer = committer
        self.metrics = metrics = metrics or BookieMetrics()
        self.hub = ConnectionHub(metrics, max_frame_bytes=config.max_frame_bytes,
                                 max_connection_pending_bytes=config.max_connection_pending_bytes,
                                 limits=config.limits)
        self.latencies = RequestLatencies(metrics, self.hub.before_answers)
        self.status = BookieStatus(metrics, publisher)
        self.cursors = SyncCursors(storage, committer, cursors,
                                   journal_write_data=config.storage.journal_write_data)
        self.services = BackgroundServices(config, storage, committer, self.hub, self.status,
                                           store, self._forget_ledger, self.cursors.on_checkpoint,
                                           metrics)
        after_fsync = AfterFsync(committer, self.cursors, self.latencies, self.status)
        bypass = None
        if not config.storage.journal_write_data:
            warn_if_unprotected(config)
            bypass = (CheckpointedDurability(storage, self.cursors, after_fsync, self.services,
                                             self.latencies, volatile=False),
                      CheckpointedDurability(storage, self.cursors, after_fsync, self.services,
                                             self.latencies, volatile=True))
        self.durability = DurabilityPolicy(
            storage, self.cursors, PersistentDurability(storage, committer, after_fsync),
            VolatileDurability(storage, committer, self.cursors, after_fsync, self.latencies,
                               self.status),
            bypass)
        self.adds = AddPipeline(storage, self.durability, self.cursors, self.status, metrics,
                                self.latencies, self.services.write_cache_full)
        self.handlers = RequestHandlers(config, storage, committer, self.durability,
                                        self.cursors, self.adds.lacs,
                                        self.status, metrics, self.latencies)
        self._by_type: dict[type, Callable[[BookieConnection, Request], None]] = {
            **self.handlers.by_type(), AddRequest: self._take_add}  # type: ignore[dict-item]
        committer.observe(on_sync=self._after_fsync, on_durable=self.cursors.on_durable)
        metrics.read_cache_hits.set_function(lambda: storage.stats.read_cache_hits)
        metrics.read_cache_misses.set_function(lambda: storage.stats.read_cache_misses)
        metrics.journal_loop_syncs.set_function(lambda: committer.loop_sync_count)
        metrics.journal_written_bytes.set_function(
            lambda: storage.journal.counters().written_bytes)

    @classmethod
    async def open(cls, config: BookieConfig, storage: BookieStorage, committer: GroupCommitter,
                   store: MetadataStore, publisher: StatePublisher,
                   metrics: BookieMetrics | None = None) -> BookieServer:
        """A server over ``storage`` (open) and ``committer`` (over its
        journal), its BP-14 sync cursors rebuilt from the storage first."""
        cursors = await asyncio.to_thread(SyncCursors.load, storage)
        return cls(config, storage, committer, store, publisher, cursors, metrics)

    @property
    def read_only(self) -> bool:
        return self.status.read_only

    def new_connection(self) -> BookieConnection:
        """The protocol of one accepted connection (the listener's factory)."""
        return BookieConnection(self.hub, self)

    # --- RequestHandler ------------------------------------------------------------

    def take_adds(self, conn: BookieConnection, run: AddRequestRun) -> None:
        self.adds.take(conn, run)

    def take_request(self, conn: BookieConnection, request: Request) -> None:
        handler = self._by_type.get(type(request), self.handlers.unsupported)
        try:
            handler(conn, request)
        except Exception as e:  # contain bugs to one request
            self.handlers.request_failed(conn, request, e)

    def release_volatile_acks(self, conn: BookieConnection) -> None:
        self.durability.journaled_volatile.release(conn)

    def _take_add(self, conn: BookieConnection, req: AddRequest) -> None:
        self.adds.take(conn, run_of_one(req))

    # --- hooks ---------------------------------------------------------------------

    def _after_fsync(self, seconds: float, released: int) -> None:
        """After each fsync's waiters were released: metrics, then their
        answers go out now rather than on the next loop iteration (which
        would first serve whatever I/O is ready, often a read of many adds
        that takes longer than the write of the answers)."""
        self.metrics.journal_fsync.observe(seconds * 1000.0)
        self.metrics.journal_group_size.observe(released)
        self.hub.flush_if_scheduled()

    def _forget_ledger(self, ledger_id: int) -> None:
        self.adds.lacs.pop(ledger_id, None)
        self.cursors.drop(ledger_id)
