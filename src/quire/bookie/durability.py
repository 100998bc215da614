"""When an add is acknowledged, and when it counts as synced.

Each ledger's adds are answered by one :class:`AddDurability`, chosen once
per ledger by :class:`DurabilityPolicy`:

* :class:`PersistentDurability` (PD_JOURNAL, the default): an add is
  answered once the journal fsync covering it returned; everything
  answered is synced.
* :class:`VolatileDurability` (BP-14's VD_JOURNAL): an add is answered once
  the journal buffer holding it is written to the file (the page cache), at
  the end of the read that brought it; it counts as synced once the
  ledger's :class:`~quire.bookie.sync_cursor.SyncCursor` moves over it (a
  journal fsync or a checkpoint covered it, or the writer's LAC did), and
  the LastAddSynced the bookie reports only moves once the cursor's own
  journal record is durable (:class:`SyncCursors`).  Adds that do not ask
  for VD (recovery adds, which never carry the flag) are still answered
  after their fsync, and their ledger's cursor learns them.
* :class:`CheckpointedDurability` (BP-46's journal bypass,
  ``journal_write_data = false``), chosen for every ledger by the policy
  when the journal is off: an add is stored in the write cache only (no
  journal record) and answered at once; it counts as synced only once a
  checkpoint (entry-log fsync and index commit) covers its write-cache
  epoch (:attr:`BookieStorage.checkpointed_epoch`).  A VD ledger's cursor
  then runs on write epochs instead of journal seqs, and a piggy-backed or
  explicit LAC does not move it (with the journal off, "acknowledged by an
  ack quorum" means "in their write caches", not persisted).  Recovery adds
  still go through the journal and are answered after its fsync, as with
  the journal on: a recovery must not close a ledger over entries that a
  power loss of the recovering bookies would take back.

*Why per ledger and not per add:* a ledger's type is fixed when it is
created (BP-14), so the bookie fixes its durability at the ledger's first
add instead of reading it off every add's flags: VD when that add asks for
VD, PD otherwise.  A VD ledger's choice is durable (its cursor is journaled
with its first adds), so it survives restarts; a PD ledger is a ledger
without a cursor.  A VD add to a ledger already stored as PD is answered
as PD (later, never weaker than asked).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Protocol

from quire.bookie.group_commit import GroupCommitter
from quire.bookie.metrics import RequestLatencies
from quire.bookie.status import BookieStatus
from quire.bookie.storage import BookieStorage
from quire.bookie.sync_cursor import SyncCursor, decode_cursor, encode_cursor
from quire.errors import NoSuchEntryError, NoSuchLedgerError, StatusCode
from quire.protocol import FLAG_RECOVERY_ADD, FLAG_VOLATILE_DURABILITY, AddRequest, OpCode
from quire.protocol.codec import encode_add_response, encode_add_responses

if TYPE_CHECKING:
    from quire.bookie.connection import BookieConnection

LAC_FIELD = struct.Struct(">q")
LAC_OFFSET = 16  # stored entry: ledger_id, entry_id, lac, ...
ADD_ENTRY = OpCode.ADD_ENTRY
_OK = StatusCode.OK
_IO_ERROR = StatusCode.IO_ERROR

StoredAdd = tuple[AddRequest, int, int]
"""An add the storage engine took: (request, journal seq, piggy-backed LAC)."""
_RunWaiter = tuple["BookieConnection", tuple[int, ...], int, list[int], float, int]
"""A run waiting for its fsync: (connection, request ids, ledger, entry ids,
started, entry bytes held)."""
_AddsWaiter = tuple["BookieConnection", list[StoredAdd], float, int]
"""Adds waiting for their fsync: (connection, stored adds, started, entry bytes held)."""


class SyncCursors:
    """The BP-14 sync cursors of this bookie's VD ledgers: which of their
    entries are synced, persisted through the storage engine's ledger state
    (see :mod:`quire.bookie.sync_cursor`).

    With ``journal_write_data`` (the default) a cursor's adds are noted with
    their journal seqs and synced by journal fsyncs and checkpoints
    (:meth:`on_durable`), and a writer's LAC confirms entries.  Without it
    (BP-46's bypass) they are noted with their write-cache epochs and synced
    only by checkpoints (:meth:`on_checkpoint`); LACs confirm nothing."""

    def __init__(self, storage: BookieStorage, committer: GroupCommitter,
                 cursors: dict[int, SyncCursor], *, journal_write_data: bool = True) -> None:
        self._storage = storage
        self._committer = committer
        self.by_ledger = cursors
        self.journal_write_data = journal_write_data

    @staticmethod
    def load(storage: BookieStorage) -> dict[int, SyncCursor]:
        """Rebuild the cursors at start, before serving (blocking: run it on a
        thread).  Every entry the storage holds now is durable (the engine
        fsyncs what it replayed), so a cursor also moves over the contiguous
        entries above its persisted value; it never starts below what it
        reported before."""
        cursors = {}
        for ledger_id in storage.list_ledgers():
            blob = storage.get_ledger_state(ledger_id).sync_cursor
            if not blob:
                continue
            las = decode_cursor(blob)
            last = storage.last_entry_id(ledger_id)
            while las < last:
                try:
                    storage.read_entry(ledger_id, las + 1)
                except (NoSuchEntryError, NoSuchLedgerError):
                    break
                las += 1
            cursors[ledger_id] = SyncCursor(las)
        return cursors

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self.by_ledger

    def reported(self, ledger_id: int) -> int:
        """The LastAddSynced to piggy-back on an answer (-1: no cursor)."""
        cursor = self.by_ledger.get(ledger_id)
        return cursor.reported if cursor is not None else -1

    def learn(self, ledger_id: int, adds: list[tuple[int, int, int]]) -> SyncCursor:
        """Note a run of one ledger's stored adds as ``(journal seq, entry
        id, piggy-backed LAC)``; the ledger's first makes its cursor."""
        cursor = self.by_ledger.get(ledger_id)
        if cursor is None:
            cursor = self._new(ledger_id)
        if cursor.learn(adds):
            self._persist(ledger_id, cursor)
        return cursor

    def confirmed(self, ledger_id: int, lac: int) -> None:
        """The writer says entries up to ``lac`` are persisted on an ack
        quorum (ignored with the journal off: they may be in write caches
        only)."""
        if not self.journal_write_data:
            return
        cursor = self.by_ledger.get(ledger_id)
        if cursor is not None and cursor.confirmed(lac):
            self._persist(ledger_id, cursor)

    def on_durable(self, durable_seq: int) -> None:
        """After each journal fsync or checkpoint: the VD entries it covered
        are synced (journal on; with it off, cursors run on write epochs)."""
        if self.journal_write_data:
            self._synced_through(durable_seq)

    def on_checkpoint(self, epoch: int) -> None:
        """After each checkpoint, with the journal off: the VD entries cached
        in write epochs up to ``epoch`` are synced."""
        if not self.journal_write_data:
            self._synced_through(epoch)

    def _synced_through(self, point: int) -> None:
        for ledger_id, cursor in self.by_ledger.items():
            if cursor.has_unsynced_through(point) and cursor.synced_through(point):
                self._persist(ledger_id, cursor)

    async def last_add_synced(self, ledger_id: int,
                              settle: Callable[[], Awaitable[None]]) -> int:
        """BP-14 SYNC: once ``settle()`` returned (every add stored so far
        counts as synced, see :meth:`AddDurability.settle`), the ledger's
        LastAddSynced, after the cursor record holding it is durable.  A PD
        ledger (no cursor): its last entry stored when SYNC arrived."""
        cursor = self.by_ledger.get(ledger_id)
        if cursor is None:
            last = self._storage.last_entry_id(ledger_id)
            await settle()
            return last
        await settle()
        await self._committer.wait_durable(cursor.persist_seq)
        return cursor.reported

    def drop(self, ledger_id: int) -> None:
        self.by_ledger.pop(ledger_id, None)

    def _new(self, ledger_id: int) -> SyncCursor:
        """A VD ledger's first adds: journal an empty cursor, so that the
        ledger is marked VD across restarts."""
        cursor = SyncCursor()
        cursor.persist_seq = self._storage.update_ledger_state(
            ledger_id, sync_cursor=encode_cursor(-1))
        self.by_ledger[ledger_id] = cursor
        return cursor

    def _persist(self, ledger_id: int, cursor: SyncCursor) -> None:
        if not cursor.needs_persisting():
            return
        value = cursor.candidate
        seq = self._storage.update_ledger_state(ledger_id, sync_cursor=encode_cursor(value))
        cursor.persisted_request = value
        cursor.persist_seq = seq
        # Lazily: the record rides on the next fsync or checkpoint that happens
        # anyway.  Kicking an fsync here would cover newer VD entries, move the
        # cursor again, and so on: a loop of fsyncs on VD-only traffic.
        self._committer.when_durable(seq, lambda: cursor.persisted(value))


class Checkpoints(Protocol):
    """The bookie's checkpoints, as the journal bypass waits for them
    (:class:`~quire.bookie.services.BackgroundServices`)."""

    async def covering(self, epoch: int) -> None:
        """Return once a checkpoint that wrote out write-cache ``epoch``
        (and every earlier one) succeeded, starting one if none is under
        way; raise the checkpoint's error (StorageError) if it failed."""
        ...


class AddDurability(Protocol):
    """How one kind of ledger's adds are stored, when they are answered,
    and when they count as synced (see the module docstring).

    ``store_run`` and ``store_adds`` are ``BookieStorage.add_run`` and
    ``BookieStorage.add_entries`` with this durability's journal choice;
    their results are what the answer methods get as seqs.  ``settle``
    returns once every add stored before it was called counts as synced
    (BP-14 SYNC waits for it); it raises StorageError or OSError if the
    journal fsync or checkpoint it waits for failed.

    The answer methods run on the event loop's thread right after the storage
    engine took the adds (entries in its write cache, records in the
    journal's in-memory buffer).  They answer each add exactly once, OK, or
    IO_ERROR if the journal failed (and then turn the bookie read-only),
    through ``conn``; the adds of one call in the order given.  They never
    block.  ``held`` is the adds' entry bytes, which the connection holds
    until they are answered (back-pressure) if the answer waits."""

    def answer_run(self, conn: BookieConnection, request_ids: tuple[int, ...], ledger_id: int,
                   entry_ids: list[int], entries: list[bytes], last_seq: int, flags: int,
                   started: float, held: int) -> None:
        """A run of one ledger's adds, all with ``flags`` (never
        RECOVERY_ADD), that ``store_run`` took whole; their journal seqs
        run up to ``last_seq`` (the journal bypass: their write epoch)."""
        ...

    def answer_adds(self, conn: BookieConnection, stored: list[StoredAdd], started: float,
                    held: int) -> None:
        """Adds the engine took one by one, in arrival order, of any ledgers
        that have this durability."""
        ...

    def store_run(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                  entries: list[bytes]) -> int | None:
        ...

    def store_adds(self, adds: Sequence[tuple[int, int, bytes, bytes]],
                   recovery: bool) -> list[int | Exception]:
        ...

    async def settle(self) -> None:
        ...


class AfterFsync:
    """Answers adds once the journal fsync covering them returned (IO_ERROR
    for each if it failed, which turns the bookie read-only), each with its
    ledger's LastAddSynced: PD's answers, and those of adds to a VD ledger
    that do not ask for VD.  The waiters are tuples, no closure per wait."""

    def __init__(self, committer: GroupCommitter, cursors: SyncCursors,
                 latencies: RequestLatencies, status: BookieStatus) -> None:
        self._committer = committer
        self._cursors = cursors
        self._latencies = latencies
        self._status = status

    def run(self, conn: BookieConnection, request_ids: tuple[int, ...], ledger_id: int,
            entry_ids: list[int], last_seq: int, started: float, held: int) -> None:
        """A run of one ledger's adds, journaled up to ``last_seq``."""
        conn.pending_bytes += held  # conn.hold(held)
        self._committer.after_durable_with(
            last_seq, self.run_durable, (conn, request_ids, ledger_id, entry_ids, started, held),
            len(entry_ids))

    def run_durable(self, waiter: _RunWaiter, error: BaseException | None) -> None:
        conn, request_ids, ledger_id, entry_ids, started, held = waiter
        status = _OK if error is None else _IO_ERROR
        if error is not None:
            self._status.journal_failed(error)
        conn.send_many(encode_add_responses(request_ids, status, ledger_id, entry_ids,
                                            self._cursors.reported(ledger_id)), held)
        self._record(error, started, len(request_ids))

    def adds(self, conn: BookieConnection, stored: list[StoredAdd], started: float,
             held: int) -> None:
        """Adds of any ledgers, in arrival order."""
        conn.pending_bytes += held  # conn.hold(size) for each
        self._committer.after_durable_with(stored[-1][1], self.adds_durable,
                                           (conn, stored, started, held), len(stored))

    def adds_durable(self, waiter: _AddsWaiter, error: BaseException | None) -> None:
        conn, stored, started, held = waiter
        status = _OK if error is None else _IO_ERROR
        if error is not None:
            self._status.journal_failed(error)
        if self._cursors.by_ledger:
            reported = self._cursors.reported
            frames = [encode_add_response(req.request_id, status, req.ledger_id, req.entry_id,
                                          reported(req.ledger_id)) for req, _seq, _lac in stored]
        else:  # no VD ledger on this bookie: no lookup per add
            frames = [encode_add_response(req.request_id, status, req.ledger_id, req.entry_id)
                      for req, _seq, _lac in stored]
        conn.send_many(frames, held)
        self._record(error, started, len(stored))

    def _record(self, error: BaseException | None, started: float, count: int) -> None:
        latencies = self._latencies
        latencies.record(latencies.add_ok() if error is None
                         else latencies.recorder(ADD_ENTRY, _IO_ERROR), started, count)


class JournaledStore:
    """Stores adds with their journal records, and settles by a journal
    fsync: the storing half of PD and VD."""

    def __init__(self, storage: BookieStorage, committer: GroupCommitter) -> None:
        self._storage = storage
        self._committer = committer

    def store_run(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                  entries: list[bytes]) -> int | None:
        return self._storage.add_run(ledger_id, master_key, entry_ids, entries)

    def store_adds(self, adds: Sequence[tuple[int, int, bytes, bytes]],
                   recovery: bool) -> list[int | Exception]:
        return self._storage.add_entries(adds, recovery=recovery)

    async def settle(self) -> None:
        await self._committer.wait_durable(self._storage.journal.append_seq)


class PersistentDurability(JournaledStore):
    """PD: answered once the journal fsync covering the add returned."""

    def __init__(self, storage: BookieStorage, committer: GroupCommitter,
                 after_fsync: AfterFsync) -> None:
        super().__init__(storage, committer)
        self.after_fsync = after_fsync

    def answer_run(self, conn: BookieConnection, request_ids: tuple[int, ...], ledger_id: int,
                   entry_ids: list[int], entries: list[bytes], last_seq: int, flags: int,
                   started: float, held: int) -> None:
        self.after_fsync.run(conn, request_ids, ledger_id, entry_ids, last_seq, started, held)

    def answer_adds(self, conn: BookieConnection, stored: list[StoredAdd], started: float,
                    held: int) -> None:
        self.after_fsync.adds(conn, stored, started, held)


class VolatileDurability(JournaledStore):
    """BP-14 VD: answered once written to the journal file (the page cache),
    at the end of the read; the ledger's sync cursor learns every add.  An
    add that does not ask for VD (a recovery add) waits for its fsync."""

    def __init__(self, storage: BookieStorage, committer: GroupCommitter, cursors: SyncCursors,
                 after_fsync: AfterFsync, latencies: RequestLatencies,
                 status: BookieStatus) -> None:
        super().__init__(storage, committer)
        self._cursors = cursors
        self._after_fsync = after_fsync
        self._latencies = latencies
        self._status = status

    def answer_run(self, conn: BookieConnection, request_ids: tuple[int, ...], ledger_id: int,
                   entry_ids: list[int], entries: list[bytes], last_seq: int, flags: int,
                   started: float, held: int) -> None:
        lacs = map(itemgetter(0), map(LAC_FIELD.unpack_from, entries, repeat(LAC_OFFSET)))
        seqs = range(last_seq - len(entry_ids) + 1, last_seq + 1)
        cursor = self._cursors.learn(ledger_id, list(zip(seqs, entry_ids, lacs, strict=True)))
        if flags & FLAG_VOLATILE_DURABILITY:  # learning moves no reported value: ack now
            conn.volatile_acks += encode_add_responses(request_ids, _OK, ledger_id, entry_ids,
                                                       cursor.reported)
            self._latencies.record(self._latencies.add_ok(), started, len(entry_ids))
            return
        self._after_fsync.run(conn, request_ids, ledger_id, entry_ids, last_seq, started, held)

    def answer_adds(self, conn: BookieConnection, stored: list[StoredAdd], started: float,
                    held: int) -> None:
        run_ledger = stored[0][0].ledger_id
        run: list[tuple[int, int, int]] = []
        learn = self._cursors.learn
        for req, seq, lac in stored:  # one cursor call per run of one ledger's adds
            if req.ledger_id != run_ledger:
                learn(run_ledger, run)
                run_ledger, run = req.ledger_id, []
            run.append((seq, req.entry_id, lac))
        learn(run_ledger, run)
        reported = self._cursors.reported
        acks: list[bytes] = []
        durable: list[StoredAdd] = []
        for add in stored:
            req = add[0]
            if req.flags & FLAG_VOLATILE_DURABILITY and not req.flags & FLAG_RECOVERY_ADD:
                acks.append(encode_add_response(req.request_id, _OK, req.ledger_id,
                                                req.entry_id, reported(req.ledger_id)))
            else:
                durable.append(add)
        if acks:
            conn.volatile_acks += acks
            self._latencies.record(self._latencies.add_ok(), started, len(acks))
        if durable:
            self._after_fsync.adds(conn, durable, started,
                                   sum(len(req.entry) for req, _seq, _lac in durable))

    def release(self, conn: BookieConnection) -> None:
        """End of a read that left VD answers: write the journal buffer to the
        file (no fsync), then send them; none if the write failed
        (durability unknown: the client times out and retries)."""
        acks, conn.volatile_acks = conn.volatile_acks, []
        try:
            self._storage.journal.write_buffered()
        except OSError as e:
            self._status.journal_failed(e)
            return
        conn.send_many(acks)


class CheckpointedDurability:
    """BP-46's journal bypass: adds are stored in the write cache only and
    answered at once; they count as synced once a checkpoint covers their
    write epoch.  ``volatile``: the instance for VD ledgers, whose cursors
    learn every add by its write epoch (a PD ledger has no cursor: its
    answers carry no LastAddSynced, and SYNC reports its last entry once a
    checkpoint covers it).  Recovery adds are journaled and answered after
    their fsync (see the module docstring)."""

    def __init__(self, storage: BookieStorage, cursors: SyncCursors, after_fsync: AfterFsync,
                 checkpoints: Checkpoints, latencies: RequestLatencies, *,
                 volatile: bool) -> None:
        self._storage = storage
        self._cursors = cursors
        self._after_fsync = after_fsync
        self._checkpoints = checkpoints
        self._latencies = latencies
        self.volatile = volatile

    def store_run(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                  entries: list[bytes]) -> int | None:
        return self._storage.add_run(ledger_id, master_key, entry_ids, entries, journal=False)

    def store_adds(self, adds: Sequence[tuple[int, int, bytes, bytes]],
                   recovery: bool) -> list[int | Exception]:
        return self._storage.add_entries(adds, recovery=recovery, journal=recovery)

    async def settle(self) -> None:
        await self._checkpoints.covering(self._storage.write_epoch)

    def answer_run(self, conn: BookieConnection, request_ids: tuple[int, ...], ledger_id: int,
                   entry_ids: list[int], entries: list[bytes], last_seq: int, flags: int,
                   started: float, held: int) -> None:
        if self.volatile:  # last_seq is the run's write epoch
            reported = self._cursors.learn(
                ledger_id, list(zip(repeat(last_seq), entry_ids, repeat(-1)))).reported
        else:
            reported = self._cursors.reported(ledger_id)
        conn.send_many(encode_add_responses(request_ids, _OK, ledger_id, entry_ids, reported))
        self._latencies.record(self._latencies.add_ok(), started, len(entry_ids))

    def answer_adds(self, conn: BookieConnection, stored: list[StoredAdd], started: float,
                    held: int) -> None:
        if self.volatile:
            # The epoch now is at or after the one each add was cached in:
            # learning it with this one can only make it synced later.
            epoch = self._storage.write_epoch
            by_ledger: dict[int, list[tuple[int, int, int]]] = {}
            for req, _seq, _lac in stored:
                by_ledger.setdefault(req.ledger_id, []).append((epoch, req.entry_id, -1))
            for ledger_id, adds in by_ledger.items():
                self._cursors.learn(ledger_id, adds)
        reported = self._cursors.reported
        acks: list[bytes] = []
        journaled: list[StoredAdd] = []
        for add in stored:
            req = add[0]
            if req.flags & FLAG_RECOVERY_ADD:
                journaled.append(add)
            else:
                acks.append(encode_add_response(req.request_id, _OK, req.ledger_id,
                                                req.entry_id, reported(req.ledger_id)))
        if acks:
            conn.send_many(acks)
            self._latencies.record(self._latencies.add_ok(), started, len(acks))
        if journaled:
            self._after_fsync.adds(conn, journaled, started,
                                   sum(len(req.entry) for req, _seq, _lac in journaled))


class DurabilityPolicy:
    """Chooses each ledger's :class:`AddDurability`, once (see the module
    docstring); the one place the bookie reads the VD flag to decide.  With
    ``bypass`` (the journal off: the PD and the VD instance of
    :class:`CheckpointedDurability`) it chooses among those instead."""

    def __init__(self, storage: BookieStorage, cursors: SyncCursors,
                 persistent: PersistentDurability, volatile: VolatileDurability,
                 bypass: tuple[CheckpointedDurability, CheckpointedDurability] | None = None
                 ) -> None:
        self._storage = storage
        self._vd_ledgers = cursors.by_ledger
        self.persistent: AddDurability = persistent
        self.volatile: AddDurability = volatile
        self.journaled_volatile = volatile
        """VD's instance, whose answers wait for the end of the read."""
        if bypass is not None:
            self.persistent, self.volatile = bypass

    def of_stored(self, ledger_id: int) -> AddDurability:
        """The durability of a ledger the storage engine holds."""
        return self.volatile if ledger_id in self._vd_ledgers else self.persistent

    def of_add(self, ledger_id: int, flags: int) -> AddDurability:
        """The durability of the ledger an add (not yet stored) goes to: its
        ledger's, or for the first add of a ledger, VD if that add asks for
        it (a recovery add never chooses)."""
        if ledger_id in self._vd_ledgers:
            return self.volatile
        if (flags & FLAG_VOLATILE_DURABILITY and not flags & FLAG_RECOVERY_ADD
                and not self._storage.ledger_exists(ledger_id)):
            return self.volatile
        return self.persistent
