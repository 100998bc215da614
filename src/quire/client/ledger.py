"""Ledger handles: :class:`ReadHandle` and the single writer, :class:`WriteHandle`.

Terms as in BookKeeper.  A ledger's metadata lists its *fragments*: from
entry ``first`` on, entries are stored on one *ensemble* of ``E`` bookies;
entry ``e`` goes to its *write set*, ``W`` of them (see
:mod:`quire.client.placement`), and is *acknowledged* once ``A`` (the ack
quorum) of those answered OK.  The *LAC* (LastAddConfirmed) is the highest
entry such that it and every entry before it are acknowledged; it travels
piggy-backed in every stored entry's header and, for an idle writer, in
explicit WRITE_LAC requests.

Writer contract (:class:`WriteHandle`):

* ``append`` assigns entry ids in call order and completes the futures
  strictly in that order; an entry completes when its write set has ``A``
  OK answers and every lower entry completed (its id becomes the LAC);
* at most ``max_pending_adds`` adds are on the wire; later appends queue
  inside the handle (``max_queued_bytes`` of payload at most, beyond it
  ``append`` raises :class:`~quire.errors.QueueFullError`);
* a bookie that fails an add (any error but FENCED / UNAUTHORIZED), times out
  or drops its connection is replaced (*ensemble change*): a new fragment from
  LAC+1 (or the last fragment rewritten in place if it starts there) is
  written by compare-and-set, then every pending add whose write set holds a
  replaced bookie is sent to its replacement (an OK from the replaced bookie
  no longer counts); no error reaches the caller.  Completions wait while an
  ensemble change is in progress, so the LAC never passes the fragment
  boundary being written;
* FENCED, or metadata found no longer OPEN, fails every pending and later
  add with :class:`~quire.errors.LedgerFencedError`: after a recovery no
  add of this writer can become acknowledged;
* ``close`` waits for the pending adds, then records ``CLOSED`` with
  ``last_entry_id = LAC`` and its length.

BP-14 VD_JOURNAL ledgers: an acknowledged add is only in the bookies' page
cache, so acknowledgement does not move the LAC.  Every add answer carries the
bookie's LastAddSynced; with the values of the ensemble sorted ascending
(a bookie that has not reported counts as -1) the LAC is the largest of the
first ``W - A + 1`` of them, capped at the last completed append and never
moving back.  ``sync()`` makes the acknowledged entries persistent (SYNC to
the ensemble) and returns the new LAC; ``close()`` syncs first and refuses
(LedgerNotSyncedError, ledger left OPEN) rather than record fewer entries
than were acknowledged.  Ensemble changes are refused (BP-14).
"""

from __future__ import annotations

import asyncio
import bisect
import hmac
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from quire.client.batch_reads import batch_read
from quire.client.context import ClientContext
from quire.client.placement import write_set_bookies, write_set_table
from quire.client.reads import LedgerEntry, read_range
from quire.errors import (
    EXPLICIT_NEGATIVES,
    BookieUnavailableError,
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    EnsembleChangeRefusedError,
    EntryNotAvailableError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotSyncedError,
    MetadataError,
    MetadataNotFoundError,
    MetadataVersionError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    QueueFullError,
    QuireError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quire.metadata import LedgerMetadata, Versioned, Watch
from quire.metadata.model import Ensembles
from quire.peer import next_request_id
from quire.protocol import (
    ENTRY_HEADER_LEN,
    FLAG_RECOVERY_ADD,
    FLAG_VOLATILE_DURABILITY,
    MASTER_KEY_LEN,
    DigestManager,
    RawAddAnswer,
    encode_add_request,
    master_key,
)
from quire.protocol.entry import DIGEST_LEN
from quire.types import NO_ENTRY, LedgerState, LedgerType

log = logging.getLogger("quire.client")

_ADD_FRAME_OVERHEAD = 4 + 8 + MASTER_KEY_LEN + ENTRY_HEADER_LEN
"""Bytes of an ADD_ENTRY frame (as counted by ``frame_len``) besides digest and payload."""


def check_password(ledger_id: int, metadata: LedgerMetadata, password: bytes) -> None:
    """Raise UnauthorizedError unless ``password`` is the ledger's (compared as
    master keys, in constant time)."""
    if not hmac.compare_digest(master_key(password), master_key(metadata.password)):
        raise UnauthorizedError(f"wrong password for ledger {ledger_id}")


def _with_fragment(ensembles: Ensembles, first: int, bookies: tuple[str, ...]) -> Ensembles:
    """``ensembles`` with a fragment ``bookies`` from ``first`` on (replacing the
    last fragment when it starts at ``first``: it holds no entry yet)."""
    last_first = ensembles[-1][0]
    if first == last_first:
        return (*ensembles[:-1], (first, bookies))
    if first < last_first:
        raise AssertionError(f"new fragment at {first} before the last one at {last_first}")
    return (*ensembles, (first, bookies))


class ReadHandle:
    """Reads of one ledger (BookKeeper's read-only LedgerHandle).

    For a ledger that is not closed the handle follows its metadata (a
    watch), so reads find the fragments of later ensemble changes; its LAC is
    what :meth:`read_last_add_confirmed` last learnt (-1 until then).  For a
    closed ledger the LAC is its last entry id.
    """

    def __init__(self, ctx: ClientContext, ledger_id: int,
                 versioned: Versioned[LedgerMetadata], password: bytes, *,
                 follow: bool = True) -> None:
        md = versioned.value
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._digest = DigestManager(ledger_id, md.digest_type, password)
        self._master_key = master_key(password)
        self._versioned = versioned
        self._firsts: list[int] = []
        self._lac = NO_ENTRY
        self._watch: Watch | None = None
        self._follows_metadata = follow
        self._apply_metadata(versioned)
        if follow and md.state is not LedgerState.CLOSED:
            self._watch = ctx.store.watch_ledger(ledger_id, self._on_metadata_change)

    # --- properties ---------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this handle last saw it."""
        return self._versioned.value

    @property
    def last_add_confirmed(self) -> int:
        """The highest entry known to be acknowledged, with all before it (-1: none)."""
        return self._lac

    @property
    def is_closed(self) -> bool:
        """True once the ledger's metadata says CLOSED."""
        return self._versioned.value.state is LedgerState.CLOSED

    # --- metadata -----------------------------------------------------------

    def _apply_metadata(self, versioned: Versioned[LedgerMetadata]) -> None:
        self._versioned = versioned
        md = versioned.value
        self._firsts = [first for first, _ in md.ensembles]
        if md.state is LedgerState.CLOSED:
            self._lac = md.last_entry_id
            self._stop_watch()

    def _on_metadata_change(self, versioned: Versioned[LedgerMetadata] | None) -> None:
        if versioned is not None and versioned.version > self._versioned.version:
            self._apply_metadata(versioned)

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def _refresh_metadata(self) -> bool:
        """Re-read the metadata; True if it changed."""
        before = self._versioned.version
        self._on_metadata_change(await self._ctx.store.read_ledger(self._ledger_id))
        return self._versioned.version != before

    # --- reads --------------------------------------------------------------

    def _replicas(self, entry_id: int) -> tuple[str, ...]:
        """Entry ``entry_id``'s write set, healthy bookies first."""
        index = bisect.bisect_right(self._firsts, entry_id) - 1
        if index < 0:
            raise ValueError(f"ledger {self._ledger_id} has no fragment for entry {entry_id}")
        md = self._versioned.value
        return self._ctx.pool.order_for_reads(
            write_set_bookies(md.ensembles[index][1], entry_id, md.write_quorum_size))

    def _read_limit(self) -> int:
        return self._lac

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries ``first_entry_id..last_entry_id`` inclusive, in order.

        Refuses (ReadBeyondLastAddConfirmedError) past the LAC, the last entry
        of a closed ledger.  Each entry comes from the first replica of its
        write set that returns a copy whose digest verifies; failing that,
        the error says why: EntryNotAvailableError if any replica's answer was
        unknown, DigestMismatchError if every existing copy is corrupt,
        NoSuchEntryError only if every replica said it has no such entry.
        """
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        limit = self._read_limit()
        if last_entry_id > limit:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self._ledger_id}: entry {last_entry_id} is beyond the "
                + ("last entry" if self.is_closed else "LastAddConfirmed") + f" ({limit})")
        version = self._versioned.version
        try:
            return await self._read_range(first_entry_id, last_entry_id)
        except (NoSuchEntryError, EntryNotAvailableError):
            # a reader of an open ledger may hold metadata older than the
            # fragment it reads: look again before giving up
            if (not self._follows_metadata or self.is_closed
                    or (self._versioned.version == version and not await self._refresh_metadata())):
                raise
        return await self._read_range(first_entry_id, last_entry_id)

    async def read_unconfirmed(self, first_entry_id: int,
                               last_entry_id: int) -> list[LedgerEntry]:
        """BP-14 readUnconfirmed: like :meth:`read` without the LAC check.

        Entries between the LAC and the last pushed entry are not guaranteed
        to exist (BP-14): one may be missing (NoSuchEntryError only when every
        replica said so) or unknown (EntryNotAvailableError)."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"bad entry range {first_entry_id}..{last_entry_id}")
        return await self._read_range(first_entry_id, last_entry_id)

    async def batch_read(self, start_entry_id: int, max_count: int,
                         max_size: int) -> list[LedgerEntry]:
        """BP-62: 1 to ``max_count`` entries in order from ``start_entry_id``
        in one request where possible (loose limits: see
        :mod:`quire.client.batch_reads`).  ``max_count <= 0`` means no count
        limit; ``max_size <= 0`` or a huge one is clamped to the frame limit;
        the size is exceeded only by a large first entry.  Every entry is at
        or below the LAC (a closed ledger's last entry); a start beyond it
        raises ReadBeyondLastAddConfirmedError."""
        if start_entry_id < 0:
            raise ValueError(f"bad start entry {start_entry_id}")
        limit = self._read_limit()
        if start_entry_id > limit:
            raise ReadBeyondLastAddConfirmedError(
                f"ledger {self._ledger_id}: entry {start_entry_id} is beyond the "
                + ("last entry" if self.is_closed else "LastAddConfirmed") + f" ({limit})")
        return await self._batch(start_entry_id, max_count, max_size, limit)

    async def _batch(self, start: int, max_count: int, max_size: int,
                     last_allowed: int) -> list[LedgerEntry]:
        index = bisect.bisect_right(self._firsts, start) - 1
        md = self._versioned.value
        fragment_end = (self._firsts[index + 1] - 1 if index + 1 < len(self._firsts)
                        else last_allowed)
        striped = len(md.ensembles[index][1]) > md.write_quorum_size
        return await batch_read(self._ctx, self._digest, self._replicas, start, max_count,
                                max_size, last_allowed, batchable=not striped,
                                fragment_end=fragment_end)

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        """``read()``'s work: runs of entries by batch reads where possible
        (several batches on the wire), else entry by entry."""
        config = self._ctx.config
        if last == first or not config.batch_read_enabled:
            return await read_range(self._ctx, self._digest, self._replicas, first, last)
        step = config.read_batch_entries
        slots = asyncio.Semaphore(config.max_outstanding_batch_reads)

        async def chunk(low: int, high: int) -> list[LedgerEntry]:
            out: list[LedgerEntry] = []
            async with slots:
                while low <= high:
                    got = await self._batch(low, high - low + 1, 0, high)
                    out.extend(got)
                    low = got[-1].entry_id + 1
            return out

        chunks = await asyncio.gather(*(chunk(low, min(low + step - 1, last))
                                        for low in range(first, last + 1, step)))
        return [entry for part in chunks for entry in part]

    async def read_last_add_confirmed(self) -> int:
        """Ask the current ensemble for the LAC (READ_LAC) and return the
        highest answer (never lower than what the handle knew); a closed
        ledger's is its last entry.  ClientTimeoutError if no bookie answered
        in time, BookieUnavailableError if none could answer."""
        md = self._versioned.value
        if md.state is LedgerState.CLOSED:
            return self._lac
        answers = await asyncio.gather(*(self._read_lac_from(b) for b in md.last_ensemble))
        known = [lac for lac in answers if isinstance(lac, int)]
        if not known:
            failures = [a for a in answers if isinstance(a, QuireError)]
            kind = ClientTimeoutError if failures and all(
                isinstance(f, ClientTimeoutError) for f in failures) else BookieUnavailableError
            raise kind(f"ledger {self._ledger_id}: no bookie of {', '.join(md.last_ensemble)} "
                       f"answered READ_LAC ({'; '.join(str(f) for f in failures)})")
        if not self.is_closed:
            # a fragment starts at LAC+1 of the writer that made it
            self._lac = max(self._lac, *known, md.ensembles[-1][0] - 1)
        return self._lac

    async def sync_replicas(self) -> dict[str, int | QuireError]:
        """BP-14 SYNC to the last fragment's ensemble: each bookie fsyncs what
        it holds of the ledger and answers its LastAddSynced (an admin view;
        the writer's own :meth:`WriteHandle.sync` is what moves the LAC)."""
        bookies = self._versioned.value.last_ensemble

        async def one(bookie: str) -> int | QuireError:
            try:
                return await self._ctx.pool.client(bookie).sync(self._ledger_id,
                                                                self._ctx.add_timeout_s)
            except QuireError as e:
                return e

        return dict(zip(bookies, await asyncio.gather(*(one(b) for b in bookies)), strict=True))

    async def _read_lac_from(self, bookie: str) -> int | QuireError:
        """The bookie's LAC, or why it gave none."""
        try:
            return await self._ctx.pool.client(bookie).read_lac(self._ledger_id,
                                                                self._ctx.read_timeout_s)
        except EXPLICIT_NEGATIVES:
            return NO_ENTRY  # the bookie holds nothing of it yet
        except QuireError as e:
            return e

    async def close(self) -> None:
        """Release the handle (stops following the metadata)."""
        self._stop_watch()

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


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
                 versioned: Versioned[LedgerMetadata], password: bytes, *,
                 recovery: bool = False, last_add_confirmed: int = NO_ENTRY,
                 length: int = 0) -> None:
        super().__init__(ctx, ledger_id, versioned, password, follow=False)
        md = versioned.value
        self._loop = asyncio.get_running_loop()
        self._recovery = recovery
        self._expected_state = LedgerState.IN_RECOVERY if recovery else LedgerState.OPEN
        self._lac = last_add_confirmed
        self._lac_length = length
        self._last_completed = last_add_confirmed
        self._next_entry_id = last_add_confirmed + 1
        self._length = length
        self._ack_quorum = md.ack_quorum_size
        self._write_sets = write_set_table(md.ensemble_size, md.write_quorum_size)
        if recovery:
            self._flags = FLAG_RECOVERY_ADD
        elif md.ledger_type is LedgerType.VD_JOURNAL:
            self._flags = FLAG_VOLATILE_DURABILITY
        else:
            self._flags = 0
        self._volatile = bool(self._flags & FLAG_VOLATILE_DURABILITY)
        self._last_add_synced = [NO_ENTRY] * md.ensemble_size
        """BP-14: each ensemble bookie's latest LastAddSynced."""
        self._unconfirmed_lengths: deque[tuple[int, int]] = deque()
        """VD: (entry id, length) of completed entries above the LAC."""
        self._lac_rank = md.write_quorum_size - md.ack_quorum_size
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
        self._failed: dict[int, str] = {}
        self._ever_failed: set[str] = set()
        self._recovery_fragments: list[tuple[int, tuple[str, ...]]] = []
        """Recovery: ensemble changes made while writing back, recorded only
        with the close (see :meth:`_replace_failed_bookies`)."""
        self._change_task: asyncio.Task[None] | None = None
        self._error: QuireError | None = None
        self._closing = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._drained = asyncio.Event()
        self._drained.set()
        self._piggybacked_lac = NO_ENTRY
        self._explicit_lac = NO_ENTRY
        self._lac_task: asyncio.Task[None] | None = None
        if not recovery and ctx.config.explicit_lac_interval_ms > 0:
            self._lac_task = self._loop.create_task(self._send_explicit_lac())

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
        if self._lac_task is not None:
            self._lac_task.cancel()
            self._lac_task = None
        if self._change_task is None:
            self._drained.set()

    # --- ensemble change ----------------------------------------------------

    def _bookie_failed(self, index: int, bookie: str, reason: str) -> None:
        if self._closed or self._error is not None or self._ensemble[index] != bookie \
                or index in self._failed:
            return
        log.info("ledger %d: bookie %s failed (%s); replacing it", self._ledger_id, bookie,
                 reason)
        self._failed[index] = bookie
        if self._change_task is None:
            self._change_task = self._loop.create_task(self._change_ensemble())
            self._drained.clear()

    async def _change_ensemble(self) -> None:
        try:
            while self._failed and self._error is None:
                await self._replace_failed_bookies()
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

    async def _replace_failed_bookies(self) -> None:
        failed = dict(self._failed)
        md = self._versioned.value
        if md.ledger_type is not LedgerType.PD_JOURNAL and not self._recovery:
            raise EnsembleChangeRefusedError(
                f"ledger {self._ledger_id} ({md.ledger_type.value}) cannot replace failed "
                f"bookie(s) {', '.join(failed.values())}: ensemble changes are disabled for "
                "ledgers that are not PD_JOURNAL")
        first = self._lac + 1
        exclude = self._ever_failed | set(failed.values())
        try:
            ensemble = self._choose_replacements(failed, exclude)
        except NotEnoughBookiesError:
            await self._ctx.pool.refresh()
            ensemble = self._choose_replacements(failed, exclude)
        if self._recovery:
            # Kept local until the close records it with the ledger's end, as
            # BookKeeper's recovery does.  Written now, it would say that
            # entries from ``first`` on live on bookies that do not hold
            # them yet; if this recovery then failed, the next one would read
            # there, be told "no such entry" and close the ledger short of
            # entries that were acknowledged (found by the simulator, seed 5702).
            self._recovery_fragments.append((first, ensemble))
            log.info("ledger %d: recovery writes entries from %d to %s (recorded with the "
                     "close)", self._ledger_id, first, ", ".join(ensemble))
        else:
            versioned = await self._update_metadata(
                lambda md: md.with_(ensembles=_with_fragment(md.ensembles, first, ensemble)))
            log.info("ledger %d: ensemble from entry %d is now %s", self._ledger_id, first,
                     ", ".join(ensemble))
            self._apply_metadata(versioned)
        self._ensemble = ensemble
        self._clients = [self._ctx.pool.client(b) for b in ensemble]
        for index, bookie in failed.items():
            if self._failed.get(index) == bookie:
                del self._failed[index]
            self._ever_failed.add(bookie)
        # Entries >= first now live on the new ensemble: an OK from a replaced
        # bookie no longer counts; send each such add to the replacement.
        key, flags = self._master_key, self._flags
        deadline = self._loop.time() + self._ctx.add_timeout_s
        for add in self._pending:
            assert add.entry_id >= first and add.entry is not None
            write_set = self._write_sets[add.entry_id % len(ensemble)]
            for index in failed:
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

    def _choose_replacements(self, failed: dict[int, str], exclude: set[str]
                             ) -> tuple[str, ...]:
        writable = self._ctx.pool.writable_bookies()
        ensemble = list(self._ensemble)
        for index in sorted(failed):
            ensemble[index] = self._ctx.placement.replace_bookie(ensemble, writable, exclude)
        return tuple(ensemble)

    async def _update_metadata(
            self, change: Callable[[LedgerMetadata], LedgerMetadata],
            adopt: Callable[[LedgerMetadata], bool] = lambda md: False,
    ) -> Versioned[LedgerMetadata]:
        """Compare-and-set ``change(metadata)``.  On a version conflict, re-read:
        metadata that ``adopt`` accepts is returned as is; metadata that is no
        longer this writer's (state or fragments changed by someone else)
        raises LedgerFencedError; otherwise retry on the new version.  A store
        error leaves the outcome unknown: re-read and compare before retrying."""
        store, ledger_id = self._ctx.store, self._ledger_id
        current = self._versioned
        attempts = 0
        while True:
            candidate = change(current.value)
            try:
                return await store.write_ledger(ledger_id, candidate, current.version)
            except MetadataVersionError:
                fresh = await store.read_ledger(ledger_id)
            except MetadataNotFoundError:
                raise
            except MetadataError:
                attempts += 1
                if attempts >= self._ctx.config.metadata_max_attempts:
                    raise
                await asyncio.sleep(0.05 * attempts)
                try:
                    fresh = await store.read_ledger(ledger_id)
                except MetadataNotFoundError:
                    raise
                except MetadataError:
                    continue
                if fresh.value == candidate:
                    return fresh  # the write landed before the error
            if adopt(fresh.value):
                return fresh
            self._check_still_ours(fresh.value, current.value)
            current = fresh

    def _check_still_ours(self, fresh: LedgerMetadata, ours: LedgerMetadata) -> None:
        if fresh.state is not self._expected_state:
            raise LedgerFencedError(
                f"ledger {self._ledger_id} is {fresh.state.value}: another client is "
                "recovering or has closed it")
        if fresh.ensembles != ours.ensembles:
            raise LedgerFencedError(
                f"ledger {self._ledger_id}: another client changed its fragments")

    # --- explicit LAC -------------------------------------------------------

    async def _send_explicit_lac(self) -> None:
        """While the LAC is ahead of what the last add piggy-backed, tell the
        ensemble (WRITE_LAC) so readers of an idle ledger learn it."""
        interval = self._ctx.config.explicit_lac_interval_ms / 1000.0
        timeout = self._ctx.add_timeout_s
        while True:
            await asyncio.sleep(interval)
            lac = self._lac
            if (lac <= self._piggybacked_lac or lac <= self._explicit_lac
                    or self._change_task is not None or self._error is not None):
                continue
            self._explicit_lac = lac
            for client in self._clients:
                client.write_lac(self._ledger_id, lac, self._master_key, timeout, _ignore_answer,
                                 None)

    # --- BP-14: LAC from LastAddSynced, sync() ------------------------------

    def _advance_volatile_lac(self) -> None:
        """LAC = max of the lowest ``W - A + 1`` LastAddSynced values, capped at
        the last completed append; it never moves back."""
        candidate = min(sorted(self._last_add_synced)[self._lac_rank], self._last_completed)
        if candidate <= self._lac:
            return
        self._lac = candidate
        lengths = self._unconfirmed_lengths
        while lengths and lengths[0][0] <= candidate:
            self._lac_length = lengths.popleft()[1]

    def sync(self) -> asyncio.Task[int]:
        """Make every entry acknowledged so far persistent; the task gives the
        last entry id that is replicated and persistent (the new LAC).

        A plain method, like :meth:`append`: the entries it covers are fixed
        when it is called, so the result never names an entry appended after
        the call.  PD ledgers are persistent on acknowledgement: this waits
        for those appends and gives the LAC.  For VD ledgers it waits for
        them, sends SYNC to the ensemble and completes once an ack quorum
        answered; their LastAddSynced values move the LAC, which is then sent
        with WRITE_LAC.  LedgerNotSyncedError if fewer than an ack quorum of
        bookies could sync.
        """
        return self._loop.create_task(self._sync(self.last_add_pushed))

    async def _sync(self, target: int) -> int:
        await self._wait_completed(target)
        if self._closed or not self._volatile:
            return min(self._lac, target)
        target = min(target, self._last_completed)  # a failed writer stops short
        ok, problems = await self._sync_round()
        if ok < self._ack_quorum:
            raise LedgerNotSyncedError(
                f"ledger {self._ledger_id}: only {ok} of the ack quorum of {self._ack_quorum} "
                f"bookies synced ({'; '.join(problems) or 'no answer'})")
        lac = self._lac
        if lac > self._explicit_lac:
            self._explicit_lac = lac
            for client in self._clients:
                client.write_lac(self._ledger_id, lac, self._master_key, self._ctx.add_timeout_s,
                                 _ignore_answer, None)
        return min(lac, target)

    async def _wait_completed(self, entry_id: int) -> None:
        """Wait until the append of ``entry_id`` (and all before it) completed
        or failed; its failure is not raised here."""
        if entry_id <= self._last_completed:
            return
        for add in (*self._pending, *self._queued):
            if add.entry_id == entry_id:
                await asyncio.wait([add.future])
                return

    async def _sync_round(self) -> tuple[int, list[str]]:
        """SYNC to every ensemble bookie until an ack quorum answered OK (or all
        answered); returns the OK count and what the others said."""
        timeout = self._ctx.add_timeout_s
        calls = {self._loop.create_task(client.sync(self._ledger_id, timeout)): i
                 for i, client in enumerate(self._clients)}
        ok, problems = 0, []
        waiting = set(calls)
        try:
            while waiting and ok < self._ack_quorum:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=calls.__getitem__):  # (a set: ensemble order)
                    index = calls[task]
                    error = task.exception()
                    if error is None:
                        ok += 1
                        last_add_synced = task.result()
                        if last_add_synced > self._last_add_synced[index]:
                            self._last_add_synced[index] = last_add_synced
                    else:
                        problems.append(str(error))
        finally:
            for task in waiting:
                task.cancel()
        self._advance_volatile_lac()
        return ok, problems

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
        if self._lac_task is not None:
            self._lac_task.cancel()
            self._lac_task = None
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
        """The metadata change that closes the ledger at ``last``: with a
        recovery's ensemble changes, recorded only now (the ones before
        ``last``; see :meth:`_replace_failed_bookies`)."""
        fragments = [(first, bookies) for first, bookies in self._recovery_fragments
                     if first <= last]

        def closed(md: LedgerMetadata) -> LedgerMetadata:
            ensembles = md.ensembles
            for first, bookies in fragments:
                ensembles = _with_fragment(ensembles, first, bookies)
            return md.with_(ensembles=ensembles, state=LedgerState.CLOSED, last_entry_id=last,
                            length=length)
        return closed

    def _forget(self) -> None:
        self._ctx.writers.discard(self)

    def _shutdown(self, error: QuireError | None = None) -> None:
        """Stop everything and fail what is pending (the client is closing,
        or a recovery gave up on this writer)."""
        self._fail(error or ClientClosedError(
            f"client closed with ledger {self._ledger_id} open"))
        self._closing = True
        for task in (self._change_task, self._lac_task):
            if task is not None:
                task.cancel()
        self._lac_task = None

    async def __aenter__(self) -> WriteHandle:
        return self


def _ignore_answer(_token: Any, _result: object) -> None:
    """WRITE_LAC is best effort: its answers change nothing."""

