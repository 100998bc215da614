"""The add pipeline: every add enters as a run of columns.

:meth:`AddPipeline.take` gets consecutive ADD_ENTRY requests of one read as
columns (:meth:`~quire.protocol.Decoder.take_add_requests`; a single add is
a run of one), whatever their flags.  It stores them, notes the LAC each
piggy-backs, and hands the stored adds to their ledger's
:class:`~quire.bookie.durability.AddDurability`, which answers them.

The usual run, adds of one ledger under one master key with one flag value
(not RECOVERY_ADD), stays columns end to end: ``BookieStorage.add_run``
(rising entry ids of a known, unfenced ledger), ``Journal.append_add_run``
(skipped by BP-46's journal bypass) and ``encode_add_responses``, each a
C-level ``map``/``zip``, with no bytecode per add.  Each durability stores
its adds itself (``store_run``, ``store_adds``: journaled or not).  Any
other run, or one ``add_run`` declines (unknown or fenced ledger, wrong
key, a re-add, falling ids, a full write cache), is made requests and cut
into stretches of one durability (and recovery or not), each stored with
one ``BookieStorage.add_entries`` call that decides
each add in turn.  Stretches are stored in arrival order, and each
strategy answers its adds in that order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import repeat

from quire.bookie.connection import BookieConnection
from quire.bookie.durability import (
    LAC_FIELD,
    LAC_OFFSET,
    AddDurability,
    DurabilityPolicy,
    StoredAdd,
    SyncCursors,
)
from quire.bookie.metrics import BookieMetrics, RequestLatencies
from quire.bookie.status import BookieStatus
from quire.bookie.storage import BookieStorage
from quire.errors import BookieError, QuireError, StatusCode
from quire.protocol import FLAG_RECOVERY_ADD, AddRequest, AddRequestRun, ErrorResponse, OpCode
from quire.protocol.codec import encode_add_response

log = logging.getLogger("quire.bookie")

_perf_counter = time.perf_counter
_MIN_RUN_ENTRY_BYTES = LAC_OFFSET + LAC_FIELD.size
"""add_run's entries all carry a LAC."""


def status_of(error: BaseException) -> StatusCode:
    """The status answering a request that failed with ``error``."""
    if isinstance(error, BookieError) and error.status is not None:
        return error.status
    return StatusCode.IO_ERROR


def run_of_one(req: AddRequest) -> AddRequestRun:
    """A single add as the run of one it enters the pipeline as."""
    return AddRequestRun((req.request_id,), (req.master_key,), [req.flags], (req.ledger_id,),
                         (req.entry_id,), [req.entry])


class AddPipeline:
    """Stores adds and hands them to their ledger's durability (see the
    module docstring).  Every method runs on the event loop's thread."""

    def __init__(self, storage: BookieStorage, policy: DurabilityPolicy, cursors: SyncCursors,
                 status: BookieStatus, metrics: BookieMetrics, latencies: RequestLatencies,
                 on_write_cache_full: Callable[[], None]) -> None:
        self._storage = storage
        self._policy = policy
        self._cursors = cursors
        self._status = status
        self._metrics = metrics
        self._latencies = latencies
        self._on_write_cache_full = on_write_cache_full
        self.lacs: dict[int, int] = {}
        """The highest LAC piggy-backed on each ledger's adds."""

    def take(self, conn: BookieConnection, run: AddRequestRun) -> None:
        started = _perf_counter()
        flags, entries = run.flags, run.entries
        if len(set(flags)) == 1 and not flags[0] & FLAG_RECOVERY_ADD \
                and not self._status.read_only and len(set(run.ledger_ids)) == 1 \
                and len(set(run.master_keys)) == 1 \
                and min(map(len, entries)) >= _MIN_RUN_ENTRY_BYTES \
                and self._take_columns(conn, run, started):
            return
        self._take_each(conn, run.requests(), started)

    def _take_columns(self, conn: BookieConnection, run: AddRequestRun, started: float) -> bool:
        """The usual run, column-wise.  Returns False, having done nothing,
        if ``add_run`` declines it; True once it is taken, or answered with
        the engine's error."""
        ledger_id, entries, entry_ids = run.ledger_ids[0], run.entries, list(run.entry_ids)
        durability = self._policy.of_stored(ledger_id)  # add_run takes known ledgers only
        try:
            last = durability.store_run(ledger_id, run.master_keys[0], entry_ids, entries)
        except Exception as e:  # an engine bug: contained to these requests, as _store is
            log.error("error handling %d adds from %s", len(entries), conn.peer, exc_info=e)
            status = status_of(e)
            conn.send_many([ErrorResponse(OpCode.ADD_ENTRY, rid, status).encode()
                            for rid in run.request_ids])
            return True
        if last is None:
            return False
        held = sum(map(len, entries))
        lac = max(map(LAC_FIELD.unpack_from, entries, repeat(LAC_OFFSET)))[0]
        if lac > self.lacs.get(ledger_id, -1):
            self.lacs[ledger_id] = lac
        self._count_stored(len(entries), held)
        durability.answer_run(
            conn, run.request_ids, ledger_id, entry_ids, entries, last, run.flags[0], started,
            held)
        return True

    def _take_each(self, conn: BookieConnection, reqs: list[AddRequest], started: float) -> None:
        """Adds decided one by one, in stretches of one durability."""
        if self._status.read_only:  # only recovery adds are taken
            for req in reqs:
                if not req.flags & FLAG_RECOVERY_ADD:
                    self._answer_error(conn, req, started, StatusCode.READ_ONLY)
            reqs = [req for req in reqs if req.flags & FLAG_RECOVERY_ADD]
        of_add = self._policy.of_add
        chosen: dict[int, AddDurability] = {}
        """Each ledger's durability, chosen before any add of the run is stored."""
        stretches: list[tuple[AddDurability, bool, list[AddRequest]]] = []
        for req in reqs:
            ledger_id, recovery = req.ledger_id, bool(req.flags & FLAG_RECOVERY_ADD)
            durability = chosen.get(ledger_id)
            if durability is None:
                durability = chosen[ledger_id] = of_add(ledger_id, req.flags)
            if stretches and stretches[-1][0] is durability and stretches[-1][1] == recovery:
                stretches[-1][2].append(req)
            else:
                stretches.append((durability, recovery, [req]))
        for durability, recovery, stretch in stretches:
            stored, held = self._store(conn, durability, stretch, started, recovery)
            if stored:
                durability.answer_adds(conn, stored, started, held)

    def _store(self, conn: BookieConnection, durability: AddDurability, reqs: list[AddRequest],
               started: float, recovery: bool) -> tuple[list[StoredAdd], int]:
        """One storage call for a stretch; an error answer now for each add
        refused; the LAC of each stored add noted.  Returns the stored adds
        and their entry bytes."""
        try:
            results = durability.store_adds(
                [(req.ledger_id, req.entry_id, req.entry, req.master_key) for req in reqs],
                recovery)
        except Exception as e:  # an engine bug (items fail one by one): contain it
            for req in reqs:
                self._request_failed(conn, req, e)
            return [], 0
        stored: list[StoredAdd] = []
        held = 0
        lacs = self.lacs
        unpack_lac = LAC_FIELD.unpack_from
        for req, result in zip(reqs, results, strict=True):
            if type(result) is int:
                entry = req.entry
                size = len(entry)
                held += size
                lac = unpack_lac(entry, LAC_OFFSET)[0] if size >= _MIN_RUN_ENTRY_BYTES else -1
                ledger_id = req.ledger_id
                if lac > lacs.get(ledger_id, -1):
                    lacs[ledger_id] = lac
                stored.append((req, result, lac))
            elif isinstance(result, QuireError):
                self._answer_error(conn, req, started, status_of(result))
            else:  # a bug: contained to this request
                assert isinstance(result, Exception)
                self._request_failed(conn, req, result)
        if stored:
            self._count_stored(len(stored), held)
        return stored, held

    def _count_stored(self, count: int, held: int) -> None:
        """Metrics of adds the storage engine took; a checkpoint if their
        entries filled the write cache."""
        metrics = self._metrics
        metrics.entries_written += count
        metrics.bytes_written += held
        if self._storage.checkpoint_due:
            self._on_write_cache_full()

    def _answer_error(self, conn: BookieConnection, req: AddRequest, started: float,
                      status: StatusCode) -> None:
        conn.send(encode_add_response(req.request_id, status, req.ledger_id, req.entry_id,
                                      self._cursors.reported(req.ledger_id)))
        self._latencies.observe(OpCode.ADD_ENTRY, started, status)

    def _request_failed(self, conn: BookieConnection, req: AddRequest, e: Exception) -> None:
        log.error("error handling AddRequest from %s", conn.peer, exc_info=e)
        conn.send(ErrorResponse(OpCode.ADD_ENTRY, req.request_id, status_of(e)).encode())
