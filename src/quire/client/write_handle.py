"""The ledger's single writer: :class:`WriteHandle`.

Writer contract (terms in :mod:`quire.client.read_handle`):

* ``append`` assigns entry ids in call order and completes the futures
  strictly in that order; an entry completes when its write set has ``A``
  OK answers and every lower entry completed (its id becomes the LAC);
* at most ``max_pending_adds`` adds are on the wire; later appends queue
  inside the handle (``max_queued_bytes`` of payload at most, beyond it
  ``append`` raises :class:`~quire.errors.QueueFullError`);
* a bookie that fails an add (any error but FENCED / UNAUTHORIZED), times out
  or drops its connection is replaced by an ensemble change
  (:mod:`quire.client.ensemble_change`); no error reaches the caller.
  Completions wait while an ensemble change is in progress, so the LAC never
  passes the fragment boundary being written;
* FENCED, or metadata found no longer OPEN, fails every pending and later
  add with :class:`~quire.errors.LedgerFencedError`: after a recovery no
  add of this writer can become acknowledged;
* ``close`` waits for the pending adds, then records ``CLOSED`` with
  ``last_entry_id = LAC`` and its length.

BP-14 VD_JOURNAL ledgers: acknowledgement does not move the LAC; the
bookies' LastAddSynced values do, and ``sync()`` makes the acknowledged
entries persistent (:mod:`quire.client.writer_lac`).  ``close()`` syncs first
and refuses (LedgerNotSyncedError, ledger left OPEN) rather than record fewer
entries than were acknowledged.  Ensemble changes are refused (BP-14).

The add path (``append``, ``_send``, ``_on_add_answer``, ``_complete_adds``)
is the client's hot path: it keeps what it touches per entry on the handle
itself (the collaborators' LastAddSynced list and lengths queue included).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from quire.client.context import ClientContext
from quire.client.ensemble_change import EnsembleChange
from quire.client.ledger_metadata import closing_change, update_ledger_metadata
from quire.client.placement import write_set_table
from quire.client.read_handle import ReadHandle
from quire.client.writer_lac import WriterLac
from quire.errors import (
    ClientClosedError,
    ClientError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotSyncedError,
    QueueFullError,
    QuireError,
    UnauthorizedError,
)
from quire.metadata import LedgerMetadata, Versioned
from quire.peer import next_request_id
from quire.protocol import (
    ENTRY_HEADER_LEN,
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    MASTER_KEY_LEN,
    LedgerKeys,
    RawAddAnswer,
    encode_add_request,
)
from quire.protocol.entry import DIGEST_LEN
from quire.types import NO_ENTRY, LedgerState, LedgerType

log = logging.getLogger("quire.client")

_ADD_FRAME_OVERHEAD = 4 + 8 + MASTER_KEY_LEN + ENTRY_HEADER_LEN
"""Bytes of an ADD_ENTRY frame (as counted by ``frame_len``) besides digest and payload."""


class _PendingAdd:
    """One add from append to completion (BookKeeper's PendingAddOp)."""

    __slots__ = ("ack_count", "acked", "completed", "entry", "entry_id", "future", "length",
                 "payload", "size")

    def __init__(self, entry_id: int, payload: bytes | None, entry: bytes | None, length: int,
                 size: int, future: asyncio.Future[int]) -> None:
        self.entry_id = entry_id
        self.payload = payload
        self.entry = entry
        """The stored entry, built when first sent (recovery: given)."""
        self.length = length
        self.size = size
        self.future = future
        self.acked = 0
        """Bit i set: ensemble index i answered OK."""
        self.ack_count = 0
        self.completed = False


class WriteHandle(ReadHandle):
    """The ledger's single writer (BookKeeper's LedgerHandle); see the module
    docstring for its contract.  Recovery uses one with ``recovery=True``: it
    re-adds recovered entries as given, flagged RECOVERY_ADD."""

    def __init__(self, ctx: ClientContext, ledger_id: int,
                 versioned: Versioned[LedgerMetadata], keys: LedgerKeys, *,
                 recovery: bool = False, last_add_confirmed: int = NO_ENTRY,
                 length: int = 0,
                 on_closed: Callable[[WriteHandle], None] | None = None) -> None:
        super().__init__(ctx, ledger_id, versioned, keys, follow=False)
        md = versioned.value
        self._loop = asyncio.get_running_loop()
        self._recovery = recovery
        self._expected_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._on_closed = on_closed
        """Told once the handle is closed (the client's registry of open writers)."""
        self._lac = last_add_confirmed
        self._lac_length = length
        self._last_completed = last_add_confirmed
        self._next_entry_id = last_add_confirmed + 1
        self._length = length
        self._ack_quorum = md.ack_quorum_size
        self._write_sets = write_set_table(md.ensemble_size, md.write_quorum_size)
        self._flags = (FLAG_RECOVERY_ADD if recovery else FLAG_VOLATILE_DURABILITY
                       if md.ledger_type is LedgerType.VD_JOURNAL else 0)
        self._volatile = bool(self._flags & FLAG_VOLATILE_DURABILITY)
        self._max_payload = (ctx.config.max_frame_bytes - _ADD_FRAME_OVERHEAD
                             - DIGEST_LEN[md.digest_type])
        self._ensemble = md.last_ensemble
        self._clients = [ctx.pool.client(b) for b in self._ensemble]
        self._add_timeout_s = ctx.add_timeout_s
        self._on_add_answer_cb = self._on_add_answer
        """Bound once: a bound method made per add and bookie shows in profiles."""
        self._pending: deque[_PendingAdd] = deque()
        self._queued: deque[_PendingAdd] = deque()
        self._queued_bytes = 0
        self._ensemble_change = EnsembleChange(ctx, ledger_id, md.ledger_type,
                                               recovery=recovery)
        self._change_task: asyncio.Task[None] | None = None
        self._error: QuireError | None = None
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._drained.set()
        self._piggybacked_lac = NO_ENTRY
        lac = self._writer_lac = WriterLac(self, ctx, ledger_id, md, self._master_key)
        # the add path's handles on BP-14 state (the same objects, no extra hop)
        self._last_add_synced = lac.last_add_synced
        self._unconfirmed_lengths = lac.unconfirmed_lengths
        self._advance_volatile_lac = lac.advance
        if not recovery and ctx.config.explicit_lac_interval_ms > 0:
            lac.start()

    @property
    def last_add_completed(self) -> int:
        """The highest entry whose append completed, with all before it
        (equal to the LAC except for VD ledgers, whose LAC lags until synced)."""
        return self._last_completed

    @property
    def last_add_pushed(self) -> int:
        """The highest entry id handed out by ``append`` (-1: none)."""
        return self._next_entry_id - 1

    @property
    def is_closed(self) -> bool:
        return self._closed or super().is_closed

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The bookies new entries are written to."""
        return self._ensemble

    async def read_last_add_confirmed(self) -> int:
        """The writer knows its LAC: no request is sent."""
        return self._lac

    # --- appending ----------------------------------------------------------

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Add ``data`` as the next entry; the returned future gives its entry id
        once it is acknowledged (futures complete in append order).

        Not a coroutine: the entry id is assigned and the add sent (or queued)
        before it returns, so ``[h.append(x) for x in xs]`` pipelines.  Raises
        LedgerClosedError after ``close()``, the handle's error once it failed
        (LedgerFencedError, ...), QueueFullError beyond ``max_queued_bytes``,
        ValueError for an entry too large for a frame.
        """
        if self._closing:
            raise LedgerClosedError(f"ledger {self._ledger_id} is closed")
        if self._error is not None:
            raise self._raised_error()
        if not isinstance(data, bytes):
            data = bytes(data)
        size = len(data)
        if size > self._max_payload:
            raise ValueError(f"entry of {size} bytes exceeds the limit of {self._max_payload} "
                             f"(max_frame_bytes {self._ctx.config.max_frame_bytes})")
        add = _PendingAdd(self._next_entry_id, data, None, self._length + size, size,
                          self._loop.create_future())
        self._push(add)
        return add.future

    def _push_recovered(self, entry_id: int, stored: bytes, length: int) -> asyncio.Future[int]:
        """Recovery: re-add a stored entry as it was read (RECOVERY_ADD)."""
        assert self._recovery and entry_id == self._next_entry_id and self._error is None
        add = _PendingAdd(entry_id, None, stored, length, len(stored), self._loop.create_future())
        self._push(add)
        return add.future

    def _push(self, add: _PendingAdd) -> None:
        if (self._queued or self._change_task is not None
                or len(self._pending) >= self._ctx.config.max_pending_adds):
            if self._queued_bytes + add.size > self._ctx.config.max_queued_bytes:
                raise QueueFullError(
                    f"ledger {self._ledger_id}: {self._queued_bytes} bytes already queued "
                    f"(max_queued_bytes {self._ctx.config.max_queued_bytes})")
            self._queued.append(add)
            self._queued_bytes += add.size
        else:
            self._send(add)
        self._next_entry_id = add.entry_id + 1
        self._length = add.length
        self._drained.clear()

    def _send(self, add: _PendingAdd) -> None:
        if add.entry is None:
            assert add.payload is not None
            add.entry = self._digest.encode(add.entry_id, self._lac, add.length, add.payload)
            add.payload = None
            self._piggybacked_lac = self._lac
        self._pending.append(add)
        ensemble, clients = self._ensemble, self._clients
        request_id = next_request_id()
        frame = encode_add_request(request_id, self._master_key, add.entry, self._flags)
        deadline = self._loop.time() + self._add_timeout_s
        on_answer = self._on_add_answer_cb
        for index in self._write_sets[add.entry_id % len(ensemble)]:
            clients[index].add_frame(request_id, frame, deadline, on_answer,
                                     (add, index, ensemble[index]))

    def _send_queued(self) -> None:
        limit = self._ctx.config.max_pending_adds
        queued, pending = self._queued, self._pending
        while queued and len(pending) < limit and self._change_task is None:
            add = queued.popleft()
            self._queued_bytes -= add.size
            self._send(add)

    def _on_add_answer(self, token: tuple[_PendingAdd, int, str],
                       result: RawAddAnswer | QuireError) -> None:
        add, index, bookie = token
        if self._ensemble[index] != bookie or self._error is not None or self._closed:
            return  # from a bookie replaced since, or the handle failed or closed
        if type(result) is not tuple:  # the error in place of an OK answer
            self._add_refused(index, bookie, result)  # type: ignore[arg-type]
            return
        last_add_synced = result[4]
        if self._volatile and last_add_synced > self._last_add_synced[index]:
            self._last_add_synced[index] = last_add_synced
            self._advance_volatile_lac()
        if add.completed:
            return
        bit = 1 << index
        if not add.acked & bit:
            add.acked |= bit
            add.ack_count += 1
            if add.ack_count >= self._ack_quorum and self._pending and self._pending[0] is add:
                self._complete_adds()

    def _add_refused(self, index: int, bookie: str, error: QuireError) -> None:
        """An add's answer other than OK: a refusal, an error or no answer."""
        if isinstance(error, LedgerFencedError):
            self._fail(LedgerFencedError(
                f"ledger {self._ledger_id} was fenced by a recovery (bookie {bookie})"))
        elif isinstance(error, UnauthorizedError):
            self._fail(UnauthorizedError(
                f"bookie {bookie} refused the master key of ledger {self._ledger_id}"))
        elif isinstance(error, ClientClosedError):
            self._fail(error)
        else:
            self._bookie_failed(index, bookie, str(error))

    def _complete_adds(self) -> None:
        """Complete the acknowledged adds at the head, in order; refill the wire."""
        if self._change_task is not None:
            return  # the LAC stays put while a fragment boundary is being written
        pending, quorum = self._pending, self._ack_quorum
        volatile = self._volatile
        while pending and pending[0].ack_count >= quorum:
            add = pending.popleft()
            add.completed = True
            add.entry = None
            self._last_completed = add.entry_id
            if volatile:
                self._unconfirmed_lengths.append((add.entry_id, add.length))
            else:
                self._lac = add.entry_id
                self._lac_length = add.length
            if not add.future.done():
                add.future.set_result(add.entry_id)
        if volatile:
            self._advance_volatile_lac()
        if self._queued:
            self._send_queued()
        if not pending:
            self._drained.set()

    def _raised_error(self) -> QuireError:
        error = self._error
        assert error is not None
        return type(error)(str(error))

    def _fail(self, error: QuireError) -> None:
        """The handle cannot go on: fail every pending and queued add."""
        if self._error is not None:
            return
        level = logging.DEBUG if isinstance(error, ClientClosedError) else logging.WARNING
        log.log(level, "ledger %d: writer failed: %s", self._ledger_id, error)
        self._error = error
        adds = [*self._pending, *self._queued]
        self._pending.clear()
        self._queued.clear()
        self._queued_bytes = 0
        for add in adds:
            if not add.future.done():
                add.future.set_exception(error)
                # the caller may never look; it still sees the error on the
                # next append and on close
                add.future.exception()
        self._writer_lac.stop()
        if self._change_task is None:
            self._drained.set()

    # --- ensemble change (see quire.client.ensemble_change) -------------------

    def _bookie_failed(self, index: int, bookie: str, reason: str) -> None:
        if self._closed or self._error is not None or self._ensemble[index] != bookie:
            return
        if self._ensemble_change.note_failed(index, bookie, reason) \
                and self._change_task is None:
            self._change_task = self._loop.create_task(self._change_ensemble())
            self._drained.clear()

    async def _change_ensemble(self) -> None:
        change = self._ensemble_change
        try:
            while change.failed and self._error is None:
                first = self._lac + 1
                ensemble, replaced, versioned = await change.replace(
                    self._ensemble, first, self._update_metadata)
                if versioned is not None:
                    self._apply_metadata(versioned)
                self._move_to(ensemble, replaced, first)
        except QuireError as e:
            self._fail(e)
        except Exception as e:
            log.exception("ledger %d: ensemble change failed", self._ledger_id)
            self._fail(ClientError(f"ledger {self._ledger_id}: ensemble change failed: {e!r}"))
        finally:
            self._change_task = None
            if self._error is None:
                self._complete_adds()
            else:
                self._drained.set()

    def _move_to(self, ensemble: tuple[str, ...], replaced: dict[int, str], first: int) -> None:
        """Write entries from ``first`` on to ``ensemble``, whose bookies at the
        indexes of ``replaced`` are new: an OK from a replaced bookie no longer
        counts; each pending add of theirs goes to the replacement."""
        self._ensemble = ensemble
        self._clients = [self._ctx.pool.client(b) for b in ensemble]
        key, flags = self._master_key, self._flags
        deadline = self._loop.time() + self._ctx.add_timeout_s
        for add in self._pending:
            assert add.entry_id >= first and add.entry is not None
            write_set = self._write_sets[add.entry_id % len(ensemble)]
            for index in replaced:
                if index not in write_set:
                    continue
                bit = 1 << index
                if add.acked & bit:
                    add.acked &= ~bit
                    add.ack_count -= 1
                request_id = next_request_id()
                self._clients[index].add_frame(
                    request_id, encode_add_request(request_id, key, add.entry, flags), deadline,
                    self._on_add_answer, (add, index, ensemble[index]))

    async def _update_metadata(
            self, change: Callable[[LedgerMetadata], LedgerMetadata],
            adopt: Callable[[LedgerMetadata], bool] | None = None,
    ) -> Versioned[LedgerMetadata]:
        """Compare-and-set ``change(metadata)`` as this writer (see
        :func:`~quire.client.ledger_metadata.update_ledger_metadata`)."""
        return await update_ledger_metadata(self._ctx, self._ledger_id, self._versioned, change,
                                            expected_state=self._expected_state, adopt=adopt)

    # --- sync (BP-14; see quire.client.writer_lac) ----------------------------

    def sync(self) -> asyncio.Task[int]:
        """Make every entry acknowledged so far persistent; the task gives the
        last entry id that is replicated and persistent (the new LAC).  A plain
        method, like :meth:`append`: the entries it covers are fixed when it is
        called.  What it does: see :mod:`quire.client.writer_lac`."""
        return self._loop.create_task(self._sync(self.last_add_pushed))

    async def _sync(self, target: int) -> int:
        await self._wait_completed(target)
        if self._closed or not self._volatile:
            return min(self._lac, target)
        # a failed writer stops short
        return await self._writer_lac.sync(min(target, self._last_completed))

    async def _wait_completed(self, entry_id: int) -> None:
        """Wait until the append of ``entry_id`` (and all before it) completed
        or failed; its failure is not raised here."""
        if entry_id <= self._last_completed:
            return
        for add in (*self._pending, *self._queued):
            if add.entry_id == entry_id:
                await asyncio.wait([add.future])
                return

    # --- closing ------------------------------------------------------------

    async def _drain(self) -> None:
        """Wait until no add is pending or queued and no ensemble change runs."""
        await self._drained.wait()

    async def close(self) -> None:
        """Wait for the pending adds, then record the ledger CLOSED at the LAC.

        Idempotent.  Raises LedgerFencedError (UnauthorizedError) if the
        writer was fenced (refused) — the ledger's end is then the
        recoverer's — or if another client closed it at a different entry.
        """
        if self._closed:
            return
        if self._close_task is None:
            self._close_task = self._loop.create_task(self._close())
        task = self._close_task
        try:
            await asyncio.shield(task)
        finally:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._close_task = None  # a later close() tries again

    async def _close(self) -> None:
        self._closing = True
        await self._drain()
        self._writer_lac.stop()
        error = self._error
        if isinstance(error, LedgerFencedError | UnauthorizedError | ClientClosedError):
            self._closed = True
            self._forget()
            raise self._raised_error()
        if self._volatile:
            # Never record fewer entries than were acknowledged: sync first.
            await self.sync()
            if self._lac < self._last_completed:
                raise LedgerNotSyncedError(
                    f"ledger {self._ledger_id}: entries up to {self._last_completed} were "
                    f"acknowledged but only {self._lac} are persistent; the ledger stays OPEN "
                    "(open it with recovery=True to close it with every entry)")
        lac, length = self._lac, self._lac_length
        versioned = await self._update_metadata(
            self._closing_change(lac, length),
            adopt=lambda md: (md.state is LedgerState.CLOSED and md.last_entry_id == lac
                              and md.length == length))
        self._closed = True
        self._apply_metadata(versioned)
        self._forget()

    def _closing_change(self, last: int, length: int
                        ) -> Callable[[LedgerMetadata], LedgerMetadata]:
        """The metadata change that closes the ledger at ``last`` (with a
        recovery's ensemble changes, recorded only now)."""
        return closing_change(last, length, self._ensemble_change.recovery_fragments(last))

    def _forget(self) -> None:
        if self._on_closed is not None:
            self._on_closed(self)

    def _shutdown(self, error: QuireError | None = None) -> None:
        """Stop everything and fail what is pending (the client is closing,
        or a recovery gave up on this writer)."""
        self._fail(error or ClientClosedError(
            f"client closed with ledger {self._ledger_id} open"))
        self._closing = True
        if self._change_task is not None:
            self._change_task.cancel()
        self._writer_lac.stop()

    async def __aenter__(self) -> WriteHandle:
        return self
