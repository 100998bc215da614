"""The bookie server: one process, one event loop, one storage engine.

I/O is an ``asyncio.Protocol`` per connection (no streams on this path)
over the sans-IO :class:`~quire.protocol.Decoder`.  Requests are handled on
the loop thread against the synchronous :class:`BookieStorage` (adds land in
its write cache and journal buffer); acknowledgements wait for
:class:`GroupCommitter` (PD adds, recovery adds, fences) or only for the
journal's page-cache write (BP-14 volatile adds).  Checkpoints, GC and the
journal fsync run on their own threads.

Failure containment: a malformed frame closes that connection only; an
unexpected exception while handling a request answers IO_ERROR to that
request only; a failed fsync answers IO_ERROR to the adds it covered and
turns the bookie read-only (their durability is unknown, never "OK").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import struct
import sys
import time
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import cast

from quire.bookie.config import BookieConfig
from quire.bookie.cookie import validate_or_create_cookie
from quire.bookie.group_commit import GroupCommitter
from quire.bookie.metrics import BookieMetrics, LatencyRecorder
from quire.bookie.storage import BookieStorage, StorageConfig
from quire.bookie.sync_cursor import SyncCursor, decode_cursor, encode_cursor
from quire.errors import (
    BookieError,
    MetadataError,
    MetadataNotFoundError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    QuireError,
    StatusCode,
)
from quire.metadata import BookieInfo, MetadataStore, open_store
from quire.protocol import (
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    LAST_ENTRY_ID,
    AddRequest,
    AddRequestRun,
    BatchReadRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    Decoder,
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
from quire.protocol.codec import encode_add_response, encode_add_responses
from quire.types import BookieState

log = logging.getLogger("quire.bookie")

_LAC_FIELD = struct.Struct(">q")
_LAC_OFFSET = 16  # stored entry: ledger_id, entry_id, lac, ...
_NO_COUNT_LIMIT = 1 << 62
_perf_counter = time.perf_counter
_RUN_PD, _RUN_VD, _RUN_ONE_BY_ONE = 1, 2, 3
"""add_batch's runs: PD adds batched, VD adds batched, adds taking _add."""
_StoredAdd = tuple[AddRequest, int, int]
"""An add the storage engine took: (request, journal seq, piggy-backed LAC)."""
_DurableRun = tuple["BookieConnection", tuple[int, ...], int, list[int], float, int]
"""A run waiting for its fsync: (connection, request ids, ledger, entry ids,
started, entry bytes held)."""
_OK = StatusCode.OK
_LEDGER_ID, _ENTRY_ID, _ENTRY, _MASTER_KEY, _FLAGS, _REQUEST_ID = (attrgetter(name) for name in (
    "ledger_id", "entry_id", "entry", "master_key", "flags", "request_id"))


def _status_of(error: BaseException) -> StatusCode:
    if isinstance(error, BookieError) and error.status is not None:
        return error.status
    return StatusCode.IO_ERROR


def _entry_lac(entry: bytes) -> int:
    return int(_LAC_FIELD.unpack_from(entry, _LAC_OFFSET)[0]) if len(entry) >= 24 else -1


def _dispatch_adds(conn: BookieConnection, reqs: list[AddRequest],
                   add_batch: Callable[[BookieConnection, list[AddRequest]], None],
                   handle: Callable[[BookieConnection, Request], None]) -> None:
    """Consecutive adds in arrival order: each stretch of plain and VD adds
    (no flag but VOLATILE_DURABILITY) to ``add_batch`` together, any other
    add (RECOVERY_ADD) to ``handle`` on its own."""
    batch: list[AddRequest] = []
    for req in reqs:
        if not req.flags & ~FLAG_VOLATILE_DURABILITY:
            batch.append(req)
            continue
        if batch:
            add_batch(conn, batch)
            batch = []
        handle(conn, req)
    if batch:
        add_batch(conn, batch)


class BookieConnection(asyncio.Protocol):
    """One client connection: decode, dispatch, write answers, back-pressure."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.decoder = Decoder("requests", server.config.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.pending_bytes = 0
        """Bytes of requests accepted but not yet answered."""
        self.volatile_acks: list[bytes] = []
        self._out: list[bytes] = []
        self._reading_paused = False
        self._writing_paused = False
        self.peer = "?"
        self._add_batch: Callable[[BookieConnection, list[AddRequest]], None] | None = getattr(
            server, "add_batch", None)
        """The server's batched path for plain adds (without one: handle() each)."""
        self._add_request_run: Callable[[BookieConnection, AddRequestRun], None] | None = \
            getattr(server, "add_request_run", None)
        """The server's path for a run of adds taken as columns (without one:
        the run's requests go to add_batch and handle as _dispatch_adds splits them)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.peer = str(transport.get_extra_info("peername"))
        self.server.connections.add(self)
        self.server.metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.metrics.connections.dec()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        # Runs of ADD_ENTRY frames are taken as columns and handed to the
        # server's add_request_run (or, without one, split as _dispatch_adds
        # does); anything else is handled one message at a time, so requests
        # are still handled in arrival order.
        server = self.server
        handle = server.handle
        add_batch = self._add_batch
        try:
            decoder = self.decoder
            decoder.feed(data)
            while True:
                if add_batch is not None:
                    run = decoder.take_add_requests()
                    if run is not None:
                        if self._add_request_run is not None:
                            self._add_request_run(self, run)
                        else:
                            _dispatch_adds(self, run.requests(), add_batch, handle)
                message = decoder.next_message()
                if message is None:
                    break
                handle(self, message)  # type: ignore[arg-type]
        except ProtocolError as e:
            log.warning("closing connection from %s: malformed frame: %s", self.peer, e)
            self.server.metrics.malformed_frames.inc()
            if self.transport is not None:
                self.transport.abort()
            return
        if self.volatile_acks:
            server.release_volatile_acks(self)
        self.update_flow()

    def send(self, frame: bytes, request_bytes: int = 0) -> None:
        """Queue an answer; all answers queued in one loop iteration go out
        in one write (one syscall instead of one per acknowledgement)."""
        self.pending_bytes -= request_bytes
        if not self._out:
            self.server.schedule_flush(self)
        self._out.append(frame)

    def send_many(self, frames: list[bytes], request_bytes: int = 0) -> None:
        """:meth:`send` for several answers at once."""
        self.pending_bytes -= request_bytes
        if not self._out:
            self.server.schedule_flush(self)
        self._out += frames

    def flush(self) -> None:
        out, self._out = self._out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        self.update_flow()

    def hold(self, request_bytes: int) -> None:
        self.pending_bytes += request_bytes

    def update_flow(self) -> None:
        """Pause or resume reading: paused while the peer does not read our
        answers, while too many request bytes wait for an answer, or while
        the server is throttled (write cache full)."""
        if self.transport is None:
            return
        limit = self.server.config.max_connection_pending_bytes
        should_pause = self._writing_paused or self.pending_bytes > limit or self.server.throttled
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused and self.pending_bytes <= limit // 2:
            self._reading_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.update_flow()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.update_flow()


class BookieServer:
    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.bookie_id = config.bookie_id or f"{config.host}:{config.port}"
        self.metrics = BookieMetrics()
        self.connections: set[BookieConnection] = set()
        self.read_only = False
        self.address = ""
        self.metrics_address: str | None = None
        self._lac: dict[int, int] = {}
        self._cursors: dict[int, SyncCursor] = {}
        """BP-14 sync cursors of the VD ledgers this bookie holds."""
        self._store: MetadataStore | None = None
        self._storage: BookieStorage | None = None
        self._committer: GroupCommitter | None = None
        self._listener: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._checkpointing: asyncio.Task[None] | None = None
        self.throttled = False
        """True while the write cache is full and the checkpoint that empties
        it still runs: every connection stops reading until it is done
        (BookKeeper blocks its add threads the same way).  Adds are refused
        with TOO_MANY_REQUESTS only beyond ``write_cache_reject_ratio``."""
        self._stopped = asyncio.Event()
        self._flush_queue: list[BookieConnection] = []
        self._flush_scheduled = False
        self._recorders: dict[tuple[OpCode, StatusCode], LatencyRecorder] = {}
        """Request latency histograms, batched per loop iteration (see _observe)."""
        self._dirty_recorders: list[LatencyRecorder] = []
        self._add_ok_recorder: LatencyRecorder | None = None
        self._add_durable_callback = self._add_durable
        self._adds_durable_callback = self._adds_durable
        self._run_durable_callback = self._run_durable
        self._handlers: dict[type, Callable[[BookieConnection, Request], None]] = {
            AddRequest: self._add,  # type: ignore[dict-item]
            ReadRequest: self._read,  # type: ignore[dict-item]
            ReadLacRequest: self._read_lac,  # type: ignore[dict-item]
            WriteLacRequest: self._write_lac,  # type: ignore[dict-item]
            BookieInfoRequest: self._bookie_info,  # type: ignore[dict-item]
            BatchReadRequest: self._batch_read,  # type: ignore[dict-item]
            SyncRequest: self._sync,  # type: ignore[dict-item]
            UnknownRequest: self._unsupported,
        }

    @property
    def storage(self) -> BookieStorage:
        assert self._storage is not None, "bookie not started"
        return self._storage

    @property
    def committer(self) -> GroupCommitter:
        assert self._committer is not None, "bookie not started"
        return self._committer

    # --- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        if not cfg.bookie_id and cfg.port == 0:
            raise QuireError("set bookie_id when port is 0 (the id must be stable)")
        for d in (*cfg.journal_dirs, *cfg.ledger_dirs):
            Path(d).mkdir(parents=True, exist_ok=True)
        self._store = await open_store(cfg.metadata_uri,
                                       lease_ms=cfg.registration_lease_ms)
        await validate_or_create_cookie(self._store, self.bookie_id, cfg.journal_dirs,
                                        cfg.ledger_dirs)
        storage_config = StorageConfig(
            journal_dirs=cfg.journal_dirs, ledger_dirs=cfg.ledger_dirs,
            journal_file_size_bytes=cfg.journal_file_size_bytes,
            journal_max_group_bytes=cfg.journal_max_group_bytes,
            journal_reuse_files_max=cfg.journal_reuse_files_max,
            write_cache_max_bytes=cfg.write_cache_max_bytes,
            read_cache_max_bytes=cfg.read_cache_max_bytes,
            read_ahead_bytes=cfg.read_ahead_bytes,
            entry_log_remove_pages_from_cache=cfg.entry_log_remove_pages_from_cache,
            entry_log_direct_io=cfg.entry_log_direct_io,
            power_loss_tracking=cfg.power_loss_tracking,
            test_skip_journal_fsync=cfg.test_skip_journal_fsync)
        self._storage = await asyncio.to_thread(BookieStorage.open, storage_config)
        storage = self._storage
        self.metrics.read_cache_hits.set_function(lambda: storage.stats.read_cache_hits)
        self.metrics.read_cache_misses.set_function(lambda: storage.stats.read_cache_misses)
        self._committer = GroupCommitter(self._storage.journal,
                                         max_group_wait_ms=cfg.journal_max_group_wait_ms,
                                         loop_sync_max_ms=cfg.journal_sync_on_loop_max_ms,
                                         on_sync=self._observe_fsync,
                                         on_durable=self._on_durable)
        committer = self._committer
        self.metrics.journal_loop_syncs.set_function(lambda: committer.loop_sync_count)
        self._cursors = await asyncio.to_thread(self._load_cursors)
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: BookieConnection(self), cfg.host, cfg.port, reuse_address=True)
        port = self._listener.sockets[0].getsockname()[1]
        self.address = f"{cfg.host}:{port}"
        if cfg.metrics_port >= 0:
            metrics_port = self.metrics.serve(cfg.host, cfg.metrics_port)
            self.metrics_address = f"{cfg.host}:{metrics_port}"
        self._update_disk_state()
        await self._register()
        self._tasks = [
            asyncio.create_task(self._every(cfg.flush_interval_ms, self.checkpoint)),
            asyncio.create_task(self._every(cfg.gc_interval_ms, self.collect_garbage)),
            asyncio.create_task(self._every(cfg.disk_check_interval_ms, self._check_disk)),
        ]
        log.info("bookie %s serving on %s", self.bookie_id, self.address)

    async def _register(self) -> None:
        assert self._store is not None
        state = BookieState.READ_ONLY if self.read_only else BookieState.WRITABLE
        await self._store.register_bookie(
            BookieInfo(self.bookie_id, self.address, state, self.metrics_address))

    async def stop(self) -> None:
        """Clean shutdown: stop accepting, flush, checkpoint, unregister."""
        if self._listener is None:
            return
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._listener.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        await self._listener.wait_closed()
        self._listener = None
        if self._storage is not None:
            await self.committer.wait_durable(self.storage.journal.append_seq)
            self.committer.close()
            await asyncio.to_thread(self._storage.close)
        if self._store is not None:
            with contextlib.suppress(MetadataError):
                await self._store.unregister_bookie(self.bookie_id)
            await self._store.close()
        self._stopped.set()
        log.info("bookie %s stopped cleanly", self.bookie_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _every(self, interval_ms: int, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            try:
                result = action()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic task %s failed", getattr(action, "__name__", action))

    async def checkpoint(self) -> None:
        """Write cache to entry logs, index commit, journal mark (one at a
        time: a call while one is under way waits for that one)."""
        await self._start_checkpoint()

    def _start_checkpoint(self) -> asyncio.Task[None]:
        if self._checkpointing is None:
            self._checkpointing = asyncio.get_running_loop().create_task(self._run_checkpoint())
        return self._checkpointing

    async def _run_checkpoint(self) -> None:
        # Every add journaled so far is in the write cache this checkpoint
        # writes to fsynced entry logs: once it succeeds they are durable, and
        # BP-14 sync cursors may move over them (this also bounds a cursor's
        # list of unsynced adds for a VD ledger that is never synced).
        covered = self.storage.journal.append_seq
        try:
            await asyncio.to_thread(self.storage.checkpoint)
        finally:
            self._checkpointing = None
            self._set_throttled(False)
        self.committer.mark_durable(covered)
        if self.storage.checkpoint_due:  # filled up again while this one ran
            self._write_cache_full()

    def _write_cache_full(self) -> None:
        """The write cache reached ``write_cache_max_bytes``: checkpoint now,
        or, while one is under way already, stop reading until it is done."""
        if self._checkpointing is None:
            self._start_checkpoint()
        else:
            self._set_throttled(True)

    def _set_throttled(self, throttled: bool) -> None:
        """Stop (or resume) reading on every connection (see ``throttled``)."""
        if throttled == self.throttled:
            return
        self.throttled = throttled
        if throttled:
            log.info("write cache full while a checkpoint runs: pausing reads")
        for conn in list(self.connections):
            conn.update_flow()

    async def collect_garbage(self) -> None:
        """Drop ledgers whose metadata is definitely gone; remove dead entry logs.

        A ledger is deleted only after a direct read of its metadata says it
        does not exist: a listing miss or any error keeps it.
        """
        assert self._store is not None
        listed = set(await self._store.list_ledgers())
        for ledger_id in self.storage.list_ledgers():
            if ledger_id in listed:
                continue
            try:
                await self._store.read_ledger(ledger_id)
            except MetadataNotFoundError:
                log.info("ledger %d deleted from metadata; dropping it", ledger_id)
                self.storage.delete_ledger(ledger_id)
                self._lac.pop(ledger_id, None)
                self._cursors.pop(ledger_id, None)
            except MetadataError as e:
                log.warning("gc: cannot tell whether ledger %d exists: %s", ledger_id, e)
        await asyncio.to_thread(self.storage.gc_entry_logs)

    def _update_disk_state(self) -> bool:
        free, total = self.storage.disk_usage()
        used = 1.0 - (free / total) if total else 0.0
        was = self.read_only
        if not self.read_only and used > self.config.disk_usage_threshold:
            log.warning("ledger disk %.1f%% used: turning read-only", used * 100)
            self.read_only = True
        elif self.read_only and used < self.config.disk_usage_lwm_threshold:
            log.info("ledger disk %.1f%% used: writable again", used * 100)
            self.read_only = False
        self.metrics.read_only.set(1 if self.read_only else 0)
        return was != self.read_only

    async def _check_disk(self) -> None:
        if self._update_disk_state():
            await self._register()
        if self.storage.checkpoint_due:
            await self.checkpoint()

    def _observe_fsync(self, seconds: float, released: int) -> None:
        """After each fsync's waiters were released: metrics, then their
        answers go out now rather than on the next loop iteration (which
        would first serve whatever I/O is ready, often a read of many adds
        that takes longer than the write of the answers)."""
        self.metrics.journal_fsync.observe(seconds * 1000.0)
        self.metrics.journal_group_size.observe(released)
        if self._flush_scheduled:
            self._flush_all()  # (the call_soon it scheduled finds nothing left)

    # --- request handling (loop thread) -------------------------------------

    def schedule_flush(self, conn: BookieConnection) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_all)
        self._flush_queue.append(conn)

    def _flush_all(self) -> None:
        """Once per loop iteration: apply the latency observations gathered,
        then write every connection's queued answers (the observations first,
        so a scrape that follows an answer sees it)."""
        self._flush_scheduled = False
        dirty = self._dirty_recorders
        if dirty:
            self._dirty_recorders = []
            for recorder in dirty:
                try:
                    recorder.flush()
                except Exception:  # pragma: no cover - metrics never cost an answer
                    log.exception("applying latency observations failed")
        queue, self._flush_queue = self._flush_queue, []
        for conn in queue:
            conn.flush()

    def handle(self, conn: BookieConnection, request: Request) -> None:
        handler = self._handlers.get(type(request))
        if handler is None:  # pragma: no cover - every decoded type is mapped
            handler = self._unsupported
        try:
            handler(conn, request)
        except Exception as e:  # contain bugs to one request
            self._request_failed(conn, request, e)

    def _request_failed(self, conn: BookieConnection, request: Request, e: Exception) -> None:
        log.error("error handling %s from %s", type(request).__name__, conn.peer, exc_info=e)
        rid = getattr(request, "request_id", None)
        op = request.op_code if isinstance(request, UnknownRequest) else int(request.op)
        if rid is not None:
            conn.send(ErrorResponse(op, rid, _status_of(e)).encode())

    def _recorder(self, op: OpCode, status: StatusCode) -> LatencyRecorder:
        key = (op, status)
        recorder = self._recorders.get(key)
        if recorder is None:
            recorder = self._recorders[key] = LatencyRecorder(
                self.metrics.requests[op].labels(status.name))
            if key == (OpCode.ADD_ENTRY, _OK):
                self._add_ok_recorder = recorder
        return recorder

    def _add_ok(self) -> LatencyRecorder:
        """The recorder of successful adds (looked up once, then kept)."""
        recorder = self._add_ok_recorder
        return recorder if recorder is not None else self._recorder(OpCode.ADD_ENTRY, _OK)

    def _observe(self, op: OpCode, started: float, status: StatusCode) -> None:
        self._record(self._recorder(op, status), started)

    def _record(self, recorder: LatencyRecorder, started: float, count: int = 1) -> None:
        """Observe the latency since ``started`` (ms), ``count`` times (a batch
        answered at once); applied to the histogram in _flush_all, which runs
        before any answer queued now is written."""
        if not recorder.pending:
            self._dirty_recorders.append(recorder)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush_all)
        elapsed_ms = (_perf_counter() - started) * 1000.0
        if count == 1:
            recorder.observe(elapsed_ms)
        else:
            recorder.observe_many(elapsed_ms, count)

    def _answer_add(self, conn: BookieConnection, req: AddRequest, started: float,
                    status: StatusCode, held: int = 0) -> None:
        cursor = self._cursors.get(req.ledger_id)
        las = cursor.reported if cursor is not None else -1
        conn.send(encode_add_response(req.request_id, status, req.ledger_id, req.entry_id, las),
                  held)
        self._observe(OpCode.ADD_ENTRY, started, status)

    def _add(self, conn: BookieConnection, req: AddRequest) -> None:
        # The hot path: one call per entry, no closure (the durable wait is a
        # tuple handed to the committer); see _add_durable for the answer.
        started = _perf_counter()
        flags = req.flags
        recovery = bool(flags & FLAG_RECOVERY_ADD)
        if self.read_only and not recovery:
            self._answer_add(conn, req, started, StatusCode.READ_ONLY)
            return
        storage = self._storage
        assert storage is not None, "bookie not started"
        ledger_id = req.ledger_id
        entry = req.entry
        try:
            seq = storage.add_entry(ledger_id, req.entry_id, entry, req.master_key,
                                    recovery=recovery)
        except QuireError as e:
            self._answer_add(conn, req, started, _status_of(e))
            return
        size = len(entry)
        metrics = self.metrics
        metrics.entries_written += 1
        metrics.bytes_written += size
        if storage.checkpoint_due:
            self._write_cache_full()
        lac = _entry_lac(entry)
        lacs = self._lac
        if lac > lacs.get(ledger_id, -1):
            lacs[ledger_id] = lac
        volatile = flags & FLAG_VOLATILE_DURABILITY
        cursors = self._cursors
        if volatile or ledger_id in cursors:  # a VD ledger (the first VD add makes its cursor)
            self._cursor_learn(ledger_id, [(seq, req.entry_id, lac)])
        if volatile and not recovery:
            # BP-14 VD: acknowledged once in the journal file (page cache);
            # released after this read's batch is written (release_volatile_acks).
            conn.volatile_acks.append(encode_add_response(
                req.request_id, StatusCode.OK, ledger_id, req.entry_id,
                cursors[ledger_id].reported))
            self._observe(OpCode.ADD_ENTRY, started, StatusCode.OK)
            return
        conn.pending_bytes += size  # conn.hold(size)
        committer = self._committer
        assert committer is not None, "bookie not started"
        committer.after_durable_with(seq, self._add_durable_callback, (conn, req, started, size))

    def _add_durable(self, waiter: tuple[BookieConnection, AddRequest, float, int],
                     error: BaseException | None) -> None:
        """Answer a PD (or recovery) add once its journal fsync returned."""
        conn, req, started, size = waiter
        if error is not None:
            self._on_journal_failure(error)
            self._answer_add(conn, req, started, StatusCode.IO_ERROR, size)
            return
        ledger_id = req.ledger_id
        cursors = self._cursors
        cursor = cursors.get(ledger_id) if cursors else None
        conn.send(encode_add_response(req.request_id, _OK, ledger_id, req.entry_id,
                                      cursor.reported if cursor is not None else -1), size)
        self._record(self._add_ok(), started)

    def add_request_run(self, conn: BookieConnection, run: AddRequestRun) -> None:
        """Consecutive adds decoded from one read, as columns.  PD adds (no
        flag) to a bookie without BP-14 cursors are _add_plain's, tried as a
        run on the columns themselves (_add_pd_columns: no object per add);
        any other run is split into requests as before (add_batch, handle)."""
        if self._cursors or any(run.flags):
            _dispatch_adds(conn, run.requests(), self.add_batch, self.handle)
            return
        started = _perf_counter()
        if not self._add_pd_columns(conn, run.request_ids, run.ledger_ids, run.master_keys,
                                    list(run.entry_ids), run.entries, started):
            self._add_each(conn, run.requests(), started)

    def add_batch(self, conn: BookieConnection, reqs: list[AddRequest]) -> None:
        """Adds with no flag but VOLATILE_DURABILITY, decoded from one read,
        in arrival order.  For each, what _add does (checks, journal, write
        cache, LAC, cursor, an answer); runs of PD adds to ledgers without a
        BP-14 cursor share one storage call, one durable wait and one batch
        of answers (_add_plain), runs of VD adds one storage call and one
        write of acks (_add_volatile); a PD add to a VD ledger goes through
        _add.  Order is kept across runs."""
        cursors = self._cursors
        if not cursors and not any(map(_FLAGS, reqs)):
            self._add_plain(conn, reqs)  # the common case: PD traffic only
            return
        run: list[AddRequest] = []
        run_kind = 0
        for req in reqs:
            kind = _RUN_VD if req.flags else (_RUN_ONE_BY_ONE if req.ledger_id in cursors
                                              else _RUN_PD)
            if kind != run_kind and run:
                self._add_run(conn, run_kind, run)
                run = []
            run_kind = kind
            run.append(req)
        if run:
            self._add_run(conn, run_kind, run)

    def _add_run(self, conn: BookieConnection, kind: int, run: list[AddRequest]) -> None:
        if kind == _RUN_PD:
            self._add_plain(conn, run)
        elif kind == _RUN_VD:
            self._add_volatile(conn, run)
        else:
            for req in run:
                self.handle(conn, req)

    def _store_adds(self, conn: BookieConnection, reqs: list[AddRequest], started: float
                    ) -> tuple[list[_StoredAdd], int]:
        """The shared first step of a batch of adds: one storage call; an
        error answer now for each add refused; the LAC of each stored add
        noted and counted in the metrics.  Returns the stored adds as
        ``(request, journal seq, piggy-backed LAC)`` and their entry bytes
        (none on a read-only bookie: _add answers each READ_ONLY)."""
        if self.read_only:
            for req in reqs:
                self.handle(conn, req)
            return [], 0
        storage = self._storage
        assert storage is not None, "bookie not started"
        try:
            results = storage.add_entries(
                [(req.ledger_id, req.entry_id, req.entry, req.master_key) for req in reqs])
        except Exception as e:  # an engine bug (items fail one by one): contain it
            for req in reqs:
                self._request_failed(conn, req, e)
            return [], 0
        stored: list[_StoredAdd] = []
        held = 0
        lacs = self._lac
        unpack_lac = _LAC_FIELD.unpack_from
        for req, result in zip(reqs, results, strict=True):
            if type(result) is int:
                entry = req.entry
                size = len(entry)
                held += size
                # _entry_lac(entry), inlined: this loop runs once per add
                lac = unpack_lac(entry, _LAC_OFFSET)[0] if size >= 24 else -1
                ledger_id = req.ledger_id
                if lac > lacs.get(ledger_id, -1):
                    lacs[ledger_id] = lac
                stored.append((req, result, lac))
            elif isinstance(result, QuireError):
                self._answer_add(conn, req, started, _status_of(result))
            else:  # a bug: contained to this request, as handle() does
                assert isinstance(result, Exception)
                self._request_failed(conn, req, result)
        if stored:
            self._count_stored(storage, len(stored), held)
        return stored, held

    def _count_stored(self, storage: BookieStorage, count: int, held: int) -> None:
        """Metrics of adds the storage engine took; a checkpoint if their
        entries filled the write cache."""
        metrics = self.metrics
        metrics.entries_written += count
        metrics.bytes_written += held
        if storage.checkpoint_due:
            self._write_cache_full()

    def _add_volatile(self, conn: BookieConnection, reqs: list[AddRequest]) -> None:
        """BP-14 VD adds: acknowledged once in the journal file (page cache),
        which release_volatile_acks does after this read's batch; the cursor
        of each ledger learns every add and the piggy-backed LAC, as in _add."""
        started = _perf_counter()
        stored, _held = self._store_adds(conn, reqs, started)
        if not stored:
            return
        run_ledger = stored[0][0].ledger_id
        run: list[tuple[int, int, int]] = []
        for req, seq, lac in stored:  # one cursor call per run of one ledger's adds
            if req.ledger_id != run_ledger:
                self._cursor_learn(run_ledger, run)
                run_ledger, run = req.ledger_id, []
            run.append((seq, req.entry_id, lac))
        self._cursor_learn(run_ledger, run)
        cursors = self._cursors  # learning moves no reported value: the acks can follow
        conn.volatile_acks += [encode_add_response(req.request_id, _OK, req.ledger_id,
                                                   req.entry_id, cursors[req.ledger_id].reported)
                               for req, _seq, _lac in stored]
        self._record(self._add_ok(), started, len(stored))

    def _cursor_learn(self, ledger_id: int, adds: list[tuple[int, int, int]]) -> None:
        cursor = self._cursors.get(ledger_id)
        if cursor is None:
            cursor = self._new_cursor(ledger_id)
        if cursor.learn(adds):
            self._persist_cursor(ledger_id, cursor)

    def _add_plain(self, conn: BookieConnection, reqs: list[AddRequest]) -> None:
        """PD adds to ledgers without a cursor: answered together once the
        journal fsync covering the last of them returned; taken as one run
        when they are one (_add_pd_columns), else add by add (_add_each)."""
        started = _perf_counter()
        if not self._add_pd_columns(conn, tuple(map(_REQUEST_ID, reqs)),
                                    tuple(map(_LEDGER_ID, reqs)), tuple(map(_MASTER_KEY, reqs)),
                                    list(map(_ENTRY_ID, reqs)), list(map(_ENTRY, reqs)),
                                    started):
            self._add_each(conn, reqs, started)

    def _add_each(self, conn: BookieConnection, reqs: list[AddRequest], started: float) -> None:
        """_add_plain's adds decided one by one by the storage engine."""
        stored, held = self._store_adds(conn, reqs, started)
        if not stored:
            return
        committer = self._committer
        assert committer is not None, "bookie not started"
        conn.pending_bytes += held  # conn.hold(size) for each
        committer.after_durable_with(stored[-1][1], self._adds_durable_callback,
                                     (conn, stored, started, held), len(stored))

    def _add_pd_columns(self, conn: BookieConnection, request_ids: tuple[int, ...],
                        ledger_ids: tuple[int, ...], master_keys: tuple[bytes, ...],
                        entry_ids: list[int], entries: list[bytes], started: float) -> bool:
        """_add_plain for the usual batch, column-wise: PD adds of one ledger
        under one master key, every entry long enough to carry a LAC, which
        ``BookieStorage.add_run`` takes whole.  Returns False, having done
        nothing, for any other batch (the caller then goes add by add); True
        once the batch is taken, or answered with the engine's error."""
        storage = self._storage
        if self.read_only or storage is None or len(set(ledger_ids)) != 1 \
                or len(set(master_keys)) != 1 \
                or min(map(len, entries)) < _LAC_OFFSET + _LAC_FIELD.size:
            return False
        ledger_id, master_key = ledger_ids[0], master_keys[0]
        try:
            last = storage.add_run(ledger_id, master_key, entry_ids, entries)
        except Exception as e:  # an engine bug: contained to these requests, as _store_adds does
            log.error("error handling %d adds from %s", len(entries), conn.peer, exc_info=e)
            status = _status_of(e)
            conn.send_many([ErrorResponse(OpCode.ADD_ENTRY, rid, status).encode()
                            for rid in request_ids])
            return True
        if last is None:
            return False
        held = sum(map(len, entries))
        lac = max(map(_LAC_FIELD.unpack_from, entries, repeat(_LAC_OFFSET)))[0]
        if lac > self._lac.get(ledger_id, -1):
            self._lac[ledger_id] = lac
        self._count_stored(storage, len(entries), held)
        committer = self._committer
        assert committer is not None, "bookie not started"
        conn.pending_bytes += held
        committer.after_durable_with(last, self._run_durable_callback,
                                     (conn, request_ids, ledger_id, entry_ids, started, held),
                                     len(entries))
        return True

    def _run_durable(self, waiter: _DurableRun, error: BaseException | None) -> None:
        """Answer a run taken by _add_pd_columns once the journal fsync
        covering it returned (IO_ERROR for each if it failed)."""
        conn, request_ids, ledger_id, entry_ids, started, held = waiter
        status = _OK if error is None else StatusCode.IO_ERROR
        if error is not None:
            self._on_journal_failure(error)
        conn.send_many(encode_add_responses(request_ids, status, ledger_id, entry_ids), held)
        self._record(self._recorder(OpCode.ADD_ENTRY, status), started, len(request_ids))

    def _adds_durable(self, waiter: tuple[BookieConnection, list[_StoredAdd], float, int],
                      error: BaseException | None) -> None:
        """Answer a batch of PD adds once the journal fsync covering them returned."""
        conn, stored, started, held = waiter
        if error is not None:
            self._on_journal_failure(error)
            for req, _seq, _lac in stored:
                self._answer_add(conn, req, started, StatusCode.IO_ERROR, len(req.entry))
            return
        cursors = self._cursors
        if cursors:
            frames = []
            for req, _seq, _lac in stored:
                cursor = cursors.get(req.ledger_id)
                frames.append(encode_add_response(
                    req.request_id, _OK, req.ledger_id, req.entry_id,
                    cursor.reported if cursor is not None else -1))
        else:
            frames = [encode_add_response(req.request_id, _OK, req.ledger_id, req.entry_id, -1)
                      for req, _seq, _lac in stored]
        conn.send_many(frames, held)
        self._record(self._add_ok(), started, len(stored))

    def release_volatile_acks(self, conn: BookieConnection) -> None:
        acks, conn.volatile_acks = conn.volatile_acks, []
        try:
            self.storage.journal.write_buffered()
        except OSError as e:
            self._on_journal_failure(e)
            return  # no ack: durability unknown; the client times out and retries
        conn.send_many(acks)

    def _on_journal_failure(self, error: BaseException) -> None:
        if not self.read_only:
            log.error("journal write failed (%s): turning read-only", error)
            self.read_only = True
            self.metrics.read_only.set(1)
            asyncio.get_running_loop().create_task(self._register())

    def _read(self, conn: BookieConnection, req: ReadRequest) -> None:
        started = time.perf_counter()

        def answer(status: StatusCode, entry: bytes | None = None) -> None:
            conn.send(ReadResponse(req.request_id, status, req.ledger_id, req.entry_id,
                                   entry).encode())
            self._observe(OpCode.READ_ENTRY, started, status)

        def read_now() -> None:
            try:
                entry = self.storage.read_entry(req.ledger_id, req.entry_id)
            except QuireError as e:
                answer(_status_of(e))
                return
            answer(StatusCode.OK, entry)

        if req.is_fencing:
            self._fence_then(req.ledger_id, req.master_key, read_now, answer)
        else:
            read_now()

    def _fence_then(self, ledger_id: int, key: bytes | None, then: Callable[[], None],
                    fail: Callable[[StatusCode], None]) -> None:
        """Fence (creating the ledger if unknown), wait until the fence is
        durable, then continue.  A fencing read never answers NO_SUCH_LEDGER."""
        assert key is not None
        try:
            seq = self.storage.fence(ledger_id, key)
        except QuireError as e:
            fail(_status_of(e))
            return

        def durable(error: BaseException | None) -> None:
            if error is not None:
                self._on_journal_failure(error)
                fail(StatusCode.IO_ERROR)
            else:
                then()

        self.committer.after_durable(seq, durable)

    def _read_lac(self, conn: BookieConnection, req: ReadLacRequest) -> None:
        started = time.perf_counter()
        status, lac = StatusCode.OK, -1
        try:
            lac = max(self._known_lac(req.ledger_id),
                      self.storage.get_explicit_lac(req.ledger_id))
        except QuireError as e:
            status = _status_of(e)
        conn.send(ReadLacResponse(req.request_id, status, req.ledger_id, lac).encode())
        self._observe(OpCode.READ_LAC, started, status)

    def _known_lac(self, ledger_id: int) -> int:
        """The highest LAC piggy-backed on this ledger's adds (rebuilt from the
        last stored entry after a restart)."""
        known = self._lac.get(ledger_id)
        if known is None:
            try:
                known = _entry_lac(self.storage.read_entry(ledger_id, LAST_ENTRY_ID))
            except NoSuchEntryError:
                known = -1
            self._lac[ledger_id] = known
        return known

    def _write_lac(self, conn: BookieConnection, req: WriteLacRequest) -> None:
        started = time.perf_counter()
        status = StatusCode.OK
        try:
            stored_key = self.storage.get_master_key(req.ledger_id)
            if stored_key is None:
                raise NoSuchLedgerError(f"ledger {req.ledger_id}")
            if stored_key != req.master_key:
                status = StatusCode.UNAUTHORIZED
            else:
                self.storage.set_explicit_lac(req.ledger_id, req.lac)
                cursor = self._cursors.get(req.ledger_id)
                if cursor is not None and cursor.confirmed(req.lac):
                    self._persist_cursor(req.ledger_id, cursor)
        except QuireError as e:
            status = _status_of(e)
        conn.send(WriteLacResponse(req.request_id, status, req.ledger_id).encode())
        self._observe(OpCode.WRITE_LAC, started, status)

    def _bookie_info(self, conn: BookieConnection, req: BookieInfoRequest) -> None:
        started = time.perf_counter()
        free, total = self.storage.disk_usage()
        conn.send(BookieInfoResponse(req.request_id, StatusCode.OK, free, total).encode())
        self._observe(OpCode.GET_BOOKIE_INFO, started, StatusCode.OK)

    def _batch_read(self, conn: BookieConnection, req: BatchReadRequest) -> None:
        if not self.config.batch_read_enabled:
            self._unsupported(conn, req)
            return
        started = time.perf_counter()

        def answer(status: StatusCode, records: list[bytes] | None = None) -> None:
            frame = encode_batch_read_records(req.request_id, status, req.ledger_id,
                                              req.start_entry_id, records or [])
            conn.send(frame)
            self._observe(OpCode.BATCH_READ_ENTRY, started, status)
            self.metrics.batch_read_response_size.observe(len(frame))

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
            return _status_of(e), []
        return StatusCode.OK, records

    # --- BP-14 sync cursors --------------------------------------------------

    def _load_cursors(self) -> dict[int, SyncCursor]:
        """Rebuild the cursors at start, before serving.  Every entry the
        storage holds now is durable (the engine fsyncs what it replayed), so
        a cursor also moves over the contiguous entries above its persisted
        value; it never starts below what it reported before."""
        cursors = {}
        for ledger_id in self.storage.list_ledgers():
            blob = self.storage.get_ledger_state(ledger_id).sync_cursor
            if not blob:
                continue
            las = decode_cursor(blob)
            last = self.storage.last_entry_id(ledger_id)
            while las < last:
                try:
                    self.storage.read_entry(ledger_id, las + 1)
                except (NoSuchEntryError, NoSuchLedgerError):
                    break
                las += 1
            cursors[ledger_id] = SyncCursor(las)
        return cursors

    def _new_cursor(self, ledger_id: int) -> SyncCursor:
        """First VD add of a ledger: journal an empty cursor before the entry,
        so that any entry surviving a crash finds its ledger marked VD."""
        cursor = SyncCursor()
        cursor.persist_seq = self.storage.update_ledger_state(
            ledger_id, sync_cursor=encode_cursor(-1))
        self._cursors[ledger_id] = cursor
        return cursor

    def _persist_cursor(self, ledger_id: int, cursor: SyncCursor) -> None:
        if not cursor.needs_persisting():
            return
        value = cursor.candidate
        seq = self.storage.update_ledger_state(ledger_id, sync_cursor=encode_cursor(value))
        cursor.persisted_request = value
        cursor.persist_seq = seq
        # Lazily: the record rides on the next fsync or checkpoint that happens
        # anyway.  Kicking an fsync here would cover newer VD entries, move the
        # cursor again, and so on: a loop of fsyncs on VD-only traffic.
        self.committer.when_durable(seq, lambda: cursor.persisted(value))

    def _on_durable(self, durable_seq: int) -> None:
        """After each journal fsync or checkpoint: the VD entries it covered
        are synced."""
        for ledger_id, cursor in self._cursors.items():
            if cursor.has_unsynced_through(durable_seq) and cursor.synced_through(durable_seq):
                self._persist_cursor(ledger_id, cursor)

    def _sync(self, conn: BookieConnection, req: SyncRequest) -> None:
        asyncio.get_running_loop().create_task(self._do_sync(conn, req))

    async def _do_sync(self, conn: BookieConnection, req: SyncRequest) -> None:
        """BP-14 SYNC: fsync everything journaled so far, then answer the
        ledger's LastAddSynced once the cursor holding it is durable."""
        started = time.perf_counter()
        status, las = StatusCode.OK, -1
        try:
            if not self.storage.ledger_exists(req.ledger_id):
                raise NoSuchLedgerError(f"ledger {req.ledger_id}")
            await self.committer.wait_durable(self.storage.journal.append_seq)
            cursor = self._cursors.get(req.ledger_id)
            if cursor is None:  # a PD ledger: whatever is stored is synced
                las = self.storage.last_entry_id(req.ledger_id)
            else:
                await self.committer.wait_durable(cursor.persist_seq)
                las = cursor.reported
        except QuireError as e:
            status = _status_of(e)
        except OSError:
            status = StatusCode.IO_ERROR
        conn.send(SyncResponse(req.request_id, status, req.ledger_id, las).encode())
        self._observe(OpCode.SYNC, started, status)

    def _unsupported(self, conn: BookieConnection, req: Request) -> None:
        request_id = getattr(req, "request_id", None)
        op = req.op_code if isinstance(req, UnknownRequest) else int(req.op)
        self.metrics.unsupported_requests.inc()
        if request_id is None:
            log.warning("closing connection from %s: unknown op %d without a request id",
                        conn.peer, op)
            if conn.transport is not None:
                conn.transport.abort()
            return
        conn.send(ErrorResponse(op, request_id, StatusCode.UNSUPPORTED).encode())



async def serve(config: BookieConfig) -> None:
    """Run one bookie until SIGTERM or SIGINT, then shut down cleanly.

    Prints one JSON line ``{"event": "ready", ...}`` on stdout once it serves.
    """
    server = BookieServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def request_stop() -> None:
        if not stopping:
            stopping.append(loop.create_task(server.stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, request_stop)
    print(json.dumps({"event": "ready", "bookie_id": server.bookie_id,
                      "address": server.address, "metrics": server.metrics_address,
                      "read_only": server.read_only}), flush=True)
    await server.wait_stopped()


def run(config: BookieConfig) -> None:
    """Blocking entry point used by ``quire bookie start``."""
    import uvloop

    sys.setswitchinterval(config.gil_switch_interval_us / 1e6)
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(config.gc_gen0_threshold_allocations, gen1, gen2)
    gc.freeze()

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvloop.run(serve(config))

