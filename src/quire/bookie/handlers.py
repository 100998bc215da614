"""The bookie's answers to everything but adds: reads, fencing, LAC, bookie
info, BP-62 batch reads, BP-14 SYNC, unknown ops.

A limbo ledger (BP-46: this bookie may have lost some of its entries)
never answers a negative: :meth:`RequestHandlers.unless_limbo` turns its
NO_SUCH_ENTRY / NO_SUCH_LEDGER into UNKNOWN for single, last-entry and batch
reads, and its READ_LAC with no LAC known into UNKNOWN.  Only answers that
are negatives pay for the check.  (Adds to it are refused FENCED by the
storage: a limbo ledger is fenced.)

Each handler runs on the event loop's thread against the synchronous
storage engine and answers its request exactly once (a fence, and so a
fencing read, only once the fence is durable).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from quire.bookie.adds import status_of
from quire.bookie.config import BookieConfig
from quire.bookie.connection import BookieConnection
from quire.bookie.durability import LAC_FIELD, LAC_OFFSET, DurabilityPolicy, SyncCursors
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.metrics import BookieMetrics, RequestLatencies
from quire.bookie.status import BookieStatus
from quire.bookie.storage import BookieStorage
from quire.errors import NoSuchEntryError, NoSuchLedgerError, QuireError, StatusCode
from quire.protocol import (
    LAST_ENTRY_ID,
    BatchReadRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    OpCode,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    SyncRequest,
    SyncResponse,
    UnknownRequest,
    WriteLacRequest,
    WriteLacResponse,
    batch_read_room,
    encode_batch_read_records,
)
from quire.security.ledger_keys import same_key

log = logging.getLogger("quire.bookie")

_NO_COUNT_LIMIT = 1 << 62
_NEGATIVES = frozenset({StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER})


def _entry_lac(entry: bytes) -> int:
    return int(LAC_FIELD.unpack_from(entry, LAC_OFFSET)[0]) \
        if len(entry) >= LAC_OFFSET + LAC_FIELD.size else -1


class RequestHandlers:
    """One method per request type but ADD_ENTRY (see the module docstring).
    ``lacs`` is the add pipeline's record of the LAC piggy-backed on each
    ledger's adds, shared with it."""

    def __init__(self, config: BookieConfig, storage: BookieStorage, committer: GroupCommitter,
                 durability: DurabilityPolicy, cursors: SyncCursors, lacs: dict[int, int],
                 status: BookieStatus, metrics: BookieMetrics,
                 latencies: RequestLatencies) -> None:
        self.config = config
        self.storage = storage
        self._committer = committer
        self._durability = durability
        self._cursors = cursors
        self._lacs = lacs
        self._status = status
        self._metrics = metrics
        self._latencies = latencies
        self._tasks: set[asyncio.Task[None]] = set()

    def by_type(self) -> dict[type, Callable[[BookieConnection, Request], None]]:
        """The handler of each request type."""
        return {
            ReadRequest: self.read,  # type: ignore[dict-item]
            ReadLacRequest: self.read_lac,  # type: ignore[dict-item]
            WriteLacRequest: self.write_lac,  # type: ignore[dict-item]
            BookieInfoRequest: self.bookie_info,  # type: ignore[dict-item]
            BatchReadRequest: self.batch_read,  # type: ignore[dict-item]
            SyncRequest: self.sync,  # type: ignore[dict-item]
            UnknownRequest: self.unsupported,
        }

    def read(self, conn: BookieConnection, req: ReadRequest) -> None:
        started = time.perf_counter()

        def answer(status: StatusCode, entry: bytes | None = None) -> None:
            conn.send(ReadResponse(req.request_id, status, req.ledger_id, req.entry_id,
                                   entry).encode())
            self._latencies.observe(OpCode.READ_ENTRY, started, status)

        def read_now() -> None:
            try:
                entry = self.storage.read_entry(req.ledger_id, req.entry_id)
            except QuireError as e:
                answer(self.unless_limbo(req.ledger_id, status_of(e)))
                return
            answer(StatusCode.OK, entry)

        if req.is_fencing:
            self._fence_then(req.ledger_id, req.master_key, read_now, answer)
        else:
            read_now()

    def unless_limbo(self, ledger_id: int, status: StatusCode) -> StatusCode:
        """``status``, but UNKNOWN for a negative about a limbo ledger."""
        if status in _NEGATIVES and self.storage.is_limbo(ledger_id):
            return StatusCode.UNKNOWN
        return status

    def _fence_then(self, ledger_id: int, key: bytes | None, then: Callable[[], None],
                    fail: Callable[[StatusCode], None]) -> None:
        """Fence (creating the ledger if unknown), wait until the fence is
        durable, then continue.  A fencing read never answers NO_SUCH_LEDGER."""
        assert key is not None
        try:
            seq = self.storage.fence(ledger_id, key)
        except QuireError as e:
            fail(status_of(e))
            return

        def durable(error: BaseException | None) -> None:
            if error is not None:
                self._status.journal_failed(error)
                fail(StatusCode.IO_ERROR)
            else:
                then()

        self._committer.after_durable(seq, durable)

    def read_lac(self, conn: BookieConnection, req: ReadLacRequest) -> None:
        started = time.perf_counter()
        status, lac = StatusCode.OK, -1
        try:
            lac = max(self._known_lac(req.ledger_id),
                      self.storage.get_explicit_lac(req.ledger_id))
        except QuireError as e:
            status = self.unless_limbo(req.ledger_id, status_of(e))
        else:
            if lac < 0 and self.storage.is_limbo(req.ledger_id):
                status = StatusCode.UNKNOWN  # "no LAC" would be a negative
        conn.send(ReadLacResponse(req.request_id, status, req.ledger_id, lac).encode())
        self._latencies.observe(OpCode.READ_LAC, started, status)

    def _known_lac(self, ledger_id: int) -> int:
        """The highest LAC piggy-backed on this ledger's adds (rebuilt from the
        last stored entry after a restart)."""
        known = self._lacs.get(ledger_id)
        if known is None:
            try:
                known = _entry_lac(self.storage.read_entry(ledger_id, LAST_ENTRY_ID))
            except NoSuchEntryError:
                known = -1
            self._lacs[ledger_id] = known
        return known

    def write_lac(self, conn: BookieConnection, req: WriteLacRequest) -> None:
        started = time.perf_counter()
        status = StatusCode.OK
        try:
            stored_key = self.storage.get_master_key(req.ledger_id)
            if stored_key is None:
                raise NoSuchLedgerError(f"ledger {req.ledger_id}")
            if not same_key(stored_key, req.master_key):
                status = StatusCode.UNAUTHORIZED
            else:
                self.storage.set_explicit_lac(req.ledger_id, req.lac)
                self._cursors.confirmed(req.ledger_id, req.lac)
        except QuireError as e:
            status = status_of(e)
        conn.send(WriteLacResponse(req.request_id, status, req.ledger_id).encode())
        self._latencies.observe(OpCode.WRITE_LAC, started, status)

    def bookie_info(self, conn: BookieConnection, req: BookieInfoRequest) -> None:
        started = time.perf_counter()
        free, total = self.storage.disk_usage()
        conn.send(BookieInfoResponse(req.request_id, StatusCode.OK, free, total).encode())
        self._latencies.observe(OpCode.GET_BOOKIE_INFO, started, StatusCode.OK)

    def batch_read(self, conn: BookieConnection, req: BatchReadRequest) -> None:
        if not self.config.batch_read_enabled:
            self.unsupported(conn, req)
            return
        started = time.perf_counter()

        def answer(status: StatusCode, records: list[bytes] | None = None) -> None:
            frame = encode_batch_read_records(req.request_id, status, req.ledger_id,
                                              req.start_entry_id, records or [])
            conn.send(frame)
            self._latencies.observe(OpCode.BATCH_READ_ENTRY, started, status)
            self._metrics.batch_read_response_size.observe(len(frame))

        def read_now() -> None:
            status, records = self.read_batch(req.ledger_id, req.start_entry_id,
                                              req.max_count, req.max_size)
            answer(status, records)

        if req.start_entry_id < 0:
            answer(StatusCode.BAD_REQUEST)
        elif req.is_fencing:
            self._fence_then(req.ledger_id, req.master_key, read_now, answer)
        else:
            read_now()

    def read_batch(self, ledger_id: int, start: int, max_count: int,
                   max_size: int) -> tuple[StatusCode, list[bytes]]:
        """BP-62 loose limits: entries from ``start`` in order until max
        count, max size (clamped to the frame limit), a missing entry or an
        error.  The first entry is always returned, whatever its size; an
        error on the first entry is the answer's status.  The entries come
        as the answer's entry list, ``(u32 length | entry)*``, in pieces."""
        max_size = batch_read_room(self.config.max_frame_bytes,
                                   self.config.batch_read_max_size_bytes, max_size)
        try:
            _count, records = self.storage.read_records(
                ledger_id, start, max_count if max_count > 0 else _NO_COUNT_LIMIT, max_size)
        except QuireError as e:
            return self.unless_limbo(ledger_id, status_of(e)), []
        return StatusCode.OK, records

    def sync(self, conn: BookieConnection, req: SyncRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._sync(conn, req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync(self, conn: BookieConnection, req: SyncRequest) -> None:
        """BP-14 SYNC: wait until everything stored so far counts as synced
        (a journal fsync, or with the journal off a checkpoint), then answer
        the ledger's LastAddSynced once the cursor holding it is durable."""
        started = time.perf_counter()
        status, las = StatusCode.OK, -1
        try:
            if not self.storage.ledger_exists(req.ledger_id):
                raise NoSuchLedgerError(f"ledger {req.ledger_id}")
            las = await self._cursors.last_add_synced(
                req.ledger_id, self._durability.of_stored(req.ledger_id).settle)
        except QuireError as e:
            status = status_of(e)
        except OSError:
            status = StatusCode.IO_ERROR
        conn.send(SyncResponse(req.request_id, status, req.ledger_id, las).encode())
        self._latencies.observe(OpCode.SYNC, started, status)

    def unsupported(self, conn: BookieConnection, req: Request) -> None:
        request_id = getattr(req, "request_id", None)
        op = req.op_code if isinstance(req, UnknownRequest) else int(req.op)
        self._metrics.unsupported_requests.inc()
        if request_id is None:
            log.warning("closing connection from %s: unknown op %d without a request id",
                        conn.peer, op)
            if conn.transport is not None:
                conn.transport.abort()
            return
        conn.send(ErrorResponse(op, request_id, StatusCode.UNSUPPORTED).encode())

    def request_failed(self, conn: BookieConnection, request: Request, e: Exception) -> None:
        """A bug while handling ``request``: contained to it (IO_ERROR or the
        error's own status)."""
        log.error("error handling %s from %s", type(request).__name__, conn.peer, exc_info=e)
        rid = getattr(request, "request_id", None)
        op = request.op_code if isinstance(request, UnknownRequest) else int(request.op)
        if rid is not None:
            conn.send(ErrorResponse(op, rid, status_of(e)).encode())
