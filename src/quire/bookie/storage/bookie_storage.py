"""The bookie storage engine facade (BookKeeper's journal + ledger storage).

Write path: :meth:`BookieStorage.add_entry` checks the ledger's master key
and fence, puts the entry in the in-memory **write cache** and appends an
ADD_ENTRY record to the **journal** buffer; it returns the record's journal
seq and does no syscall.  The server acknowledges once
``journal.sync()`` (PD) or ``journal.write_buffered()`` (BP-14 VD) has
returned a seq at least that high.  State changes (master key, fence,
explicit LAC, generic state, deletion) are journaled the same way, so they
are durable once a sync covers their seq.

:meth:`BookieStorage.checkpoint` swaps the write cache for a fresh one,
writes the old one sorted by ``(ledger, entry)`` to the current entry log,
fsyncs it, commits index + ledger states + journal replay mark in one LMDB
transaction, then removes the journal files wholly before the mark.  At
:meth:`BookieStorage.open` the journal is replayed from the mark, rebuilding
the write cache and the ledger states.

Read path: write cache, then the cache being checkpointed, then the read
cache, then index + entry log (``pread``).

Threading contract
------------------
Built for one event-loop thread plus two background threads:

* the **loop thread** calls ``add_entry``, ``read_entry``, ``fence``, the
  state getters/setters, ``delete_ledger``, ``list_ledgers``,
  ``checkpoint_due``, ``disk_usage`` and ``journal.append*`` /
  ``journal.write_buffered``; none of them fsyncs or waits for one (the
  only blocking I/O is the ``pread`` of a read that misses every cache, and
  an LMDB read transaction);
* one thread runs ``checkpoint()`` (also ``gc_entry_logs()`` and
  ``close()``; these three are serialised by a checkpoint lock);
  ``compact_entry_logs()`` runs on a thread of its own and takes the
  checkpoint lock only for each piece it writes and for its index commit;
  it and ``gc_entry_logs()`` are serialised by a compaction lock (taken
  before the checkpoint lock);
* one thread runs ``journal.sync()``.

Every public method is nevertheless thread-safe.  One engine lock guards the
in-memory maps (write caches, ledger states) and is held only for
dictionary work: the checkpoint holds it to swap the cache and capture the
journal mark (so the mark covers exactly the swapped entries and states),
never during its I/O.  Lock order: checkpoint lock -> engine lock ->
journal locks.  ``abandon()`` (test seam) must not race with anything.

One benign race is left for reads issued from threads other than the loop:
a read that misses the caches, then loses the race against a re-add of the
*same* entry id and the checkpoint of that re-add, may leave the older
version in the read cache.  Entries are immutable in BookKeeper (recovery
re-adds identical bytes), and the loop-thread-only reader cannot hit it.

Deletion
--------
``delete_ledger`` stops serving the ledger at once and journals a
DELETE_LEDGER record (durable once synced, like any state change); the next
checkpoint removes its index rows and state in its transaction.
``gc_entry_logs`` (which first checkpoints pending deletions) then removes
the entry logs all of whose ledgers are gone, and ``compact_entry_logs``
copies the live entries out of logs below a live fraction and removes them
(see :mod:`~quire.bookie.storage.compaction`).  Ledger ids are assumed not
to be reused: re-creating a deleted id before the deletion is checkpointed
may expose old entries.

Unclean shutdown and limbo (BP-46)
----------------------------------
:meth:`BookieStorage.open` reads the index's running mark (see
:mod:`~quire.bookie.storage.shutdown`) into :attr:`BookieStorage.last_shutdown`,
then, once the journal is replayed, commits its own; :meth:`close` deletes it
after the final checkpoint and the journal's last sync, as its last write.
The mark records this run's ``journal_write_data``; after an unclean run
without the journal it keeps saying "off" until
:meth:`BookieStorage.unclean_shutdown_handled` (the boot sequence, once its
limbo marks are durable), so that a crash in between still protects.

:meth:`BookieStorage.mark_limbo` fences ledgers and puts them in limbo (the
bookie may have lost some of their entries) in one durable index commit
(:meth:`BookieStorage.mark_fenced` only fences, for closed ledgers);
:meth:`BookieStorage.clear_limbo` journals the end of it.
:meth:`BookieStorage.stored_entry_ids` tells repair what is there.  A ledger this
bookie never stored is created by ``mark_limbo`` with an empty master key,
meaning "not known": the first fence adopts the key it brings.  The storage
answers reads of limbo ledgers as of any other; turning negatives into
UNKNOWN is the request handlers' job.

Ledger and entry ids must be in ``[0, 2**63)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_, lt
from typing import Any

from quire.bookie.storage.compaction import CompactionStats
from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.entry_log import RECORD_PREFIX, RECORD_PREFIX_SIZE
from quire.bookie.storage.files import lock_directory
from quire.bookie.storage.journal import Journal
from quire.bookie.storage.journal_format import (
    REC_ADD_ENTRY,
    REC_DELETE_LEDGER,
    REC_EXPLICIT_LAC,
    REC_FENCE,
    REC_LEDGER_STATE,
    REC_SET_MASTER_KEY,
    JournalMark,
    JournalRecord,
    decode_add_entry,
    decode_explicit_lac,
    decode_ledger_id,
    encode_delete_ledger,
    encode_explicit_lac,
    encode_fence,
    encode_ledger_state,
    encode_set_master_key,
)
from quire.bookie.storage.ledger_storage import EntryKey, LedgerStorage
from quire.bookie.storage.seams import EngineJournal, EngineLedgerStorage
from quire.bookie.storage.shutdown import LastShutdown
from quire.bookie.storage.state import LedgerState
from quire.bookie.storage.sync_tracker import KIND_ENTRY_LOG, KIND_JOURNAL, SyncTracker
from quire.errors import (
    BadRequestError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    QuireError,
    StorageError,
    TooManyRequestsError,
    UnauthorizedError,
)

log = logging.getLogger(__name__)

LAST_ENTRY = -1
"""``read_entry`` entry id meaning "the last entry stored"."""
MAX_ID = (1 << 63) - 1
_UPDATABLE_FIELDS = frozenset({"fenced", "explicit_lac", "limbo", "sync_cursor"})


class _Ledger:
    """In-memory bookkeeping for one known ledger (engine lock held)."""

    __slots__ = ("cache_epoch", "index_max", "max_added", "state")

    def __init__(self, state: LedgerState) -> None:
        self.state = state
        self.max_added = -1
        """Highest entry id added (or replayed) since open."""
        self.index_max: int | None = None
        """Highest indexed entry id at first need (lazy)."""
        self.cache_epoch = -1
        """Write-cache epoch of the latest add (to skip scans on delete)."""


@dataclass(frozen=True)
class CheckpointStats:
    entries: int
    bytes: int
    ledger_states: int
    deleted_ledgers: int
    journal_files_removed: int
    duration_s: float
    mark: JournalMark


@dataclass(frozen=True)
class StorageStats:
    ledgers: int
    write_cache_entries: int
    write_cache_bytes: int
    read_cache_entries: int
    read_cache_bytes: int
    read_cache_hits: int
    read_cache_misses: int
    checkpoints: int
    checkpointed_entries: int
    replayed_records: int
    entry_logs: int


class BookieStorage:
    """See the module docstring.  Create with :meth:`open`."""

    def __init__(self, config: StorageConfig, journal: EngineJournal,
                 store: EngineLedgerStorage,
                 lock_fds: list[int], states: dict[int, LedgerState],
                 mark: JournalMark | None, last_shutdown: LastShutdown) -> None:
        self.config = config
        self.last_shutdown = last_shutdown
        """How the previous run ended, as found at open (BP-46)."""
        self.journal: EngineJournal = journal
        self._store: EngineLedgerStorage = store
        self._lock_fds = lock_fds
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._compaction_lock = threading.Lock()
        self._ledgers: dict[int, _Ledger] = {lid: _Ledger(st) for lid, st in states.items()}
        self._cache: dict[EntryKey, bytes] = {}
        self._cache_bytes = 0
        self._flushing: dict[EntryKey, bytes] = {}
        self._epoch = 0
        self.checkpointed_epoch = -1
        """Every entry cached in a write-cache epoch up to this one is in
        fsynced entry logs and the index (see :attr:`write_epoch`)."""
        self._dirty: set[int] = set()
        self._pending_deletes: set[int] = set()
        self._committed_mark = mark
        self._checkpoint_max_bytes = config.write_cache_max_bytes
        ratio = config.write_cache_reject_ratio
        self._reject_bytes = int(ratio * config.write_cache_max_bytes) if ratio else 0
        self._closed = False
        self._checkpoints = 0
        self._checkpointed_entries = 0
        self._replayed = 0
        self._replay_skipped = 0
        self.last_checkpoint: CheckpointStats | None = None

    # --- lifecycle ----------------------------------------------------------

    @classmethod
    def open(cls, config: StorageConfig) -> BookieStorage:
        """Create directories, open the index, replay the journal from the
        checkpoint mark and start a new journal file."""
        journal_dir = config.journal_dir
        entry_log_dir = config.entry_log_dir
        for d in (journal_dir, config.ledgers_dir, entry_log_dir, config.index_dir):
            d.mkdir(parents=True, exist_ok=True)
        lock_fds: list[int] = []
        trackers: list[SyncTracker] = []
        store: LedgerStorage | None = None
        journal: Journal | None = None
        try:
            lock_fds.append(lock_directory(journal_dir))
            lock_fds.append(lock_directory(config.ledgers_dir))
            journal_tracker = entry_tracker = None
            if config.power_loss_tracking:
                journal_tracker = SyncTracker(journal_dir, KIND_JOURNAL)
                trackers.append(journal_tracker)
                entry_tracker = SyncTracker(entry_log_dir, KIND_ENTRY_LOG)
                trackers.append(entry_tracker)
            store = LedgerStorage(config, entry_tracker)
            journal = Journal.open(journal_dir, file_size_bytes=config.journal_file_size_bytes,
                                   max_group_bytes=config.journal_max_group_bytes,
                                   preallocate=config.journal_preallocate,
                                   reuse_files_max=config.journal_reuse_files_max,
                                   dsync_writes=True,
                                   remove_pages_from_cache=(
                                       config.journal_remove_pages_from_cache),
                                   tracker=journal_tracker,
                                   skip_fsync_for_testing=config.test_skip_journal_fsync)
            if config.test_skip_journal_fsync:
                log.warning("test_skip_journal_fsync is set: the journal never fsyncs")
            return cls.open_over(config, journal, store, lock_fds)
        except BaseException:
            if journal is not None:
                journal.abandon()
            if store is not None:
                store.close()
            for tracker in trackers:
                tracker.close()
            for fd in lock_fds:
                os.close(fd)
            raise

    @classmethod
    def open_over(cls, config: StorageConfig, journal: EngineJournal,
                  store: EngineLedgerStorage, lock_fds: list[int]) -> BookieStorage:
        """The engine over an opened (not started) journal and ledger
        storage (the seams of :mod:`~quire.bookie.storage.seams`): read the
        states, replay mark and running mark from the index, replay the
        journal from the mark, start it, drop the files before the mark and
        commit this run's running mark.  :meth:`open`
        passes the files it opened; the simulation (``quire.simulation``)
        passes its in-memory twins.  ``lock_fds`` are closed with the engine."""
        states = store.index.load_ledger_states()
        mark = store.index.journal_mark()
        last_shutdown = LastShutdown.from_mark(store.index.running_mark(),
                                               index_created=store.index.created)
        self = cls(config, journal, store, lock_fds, states, mark, last_shutdown)
        started = time.perf_counter()
        for record in journal.replay(mark):
            self._apply(record)
        journal.start()
        if mark is not None:
            journal.remove_files_before(mark)
        # Sticky "off" after an unclean journal-less run: see the module docstring.
        journal_on = self.config.journal_write_data
        store.index.set_running_mark(
            journal_on and not last_shutdown.may_have_lost_acknowledged_entries)
        if last_shutdown.unclean:
            log.warning("storage open: the last shutdown was %s", last_shutdown.describe())
        log.info("storage open: %d ledgers, replayed %d journal records (%d skipped) "
                 "from %s in %.3fs", len(self._ledgers), self._replayed,
                 self._replay_skipped, mark, time.perf_counter() - started)
        return self

    def unclean_shutdown_handled(self) -> None:
        """The boot sequence's word that the previous unclean run is taken
        care of (its limbo marks are durable): the running mark now records
        this run's own journal mode."""
        with self._checkpoint_lock:
            self._check_open()
            self._store.index.set_running_mark(self.config.journal_write_data)

    def close(self) -> None:
        """Clean shutdown: checkpoint everything, sync and close the journal,
        then, only if all of that succeeded, clear the running mark."""
        with self._checkpoint_lock:
            if self._closed:
                return
            checkpointed = False
            try:
                self._checkpoint_locked()
                checkpointed = True
            finally:
                # Even if the checkpoint failed, sync the journal: it then
                # still holds everything, for the next open to replay.
                try:
                    self.journal.close()
                    if checkpointed:
                        self._store.index.clear_running_mark()  # the very last write
                finally:
                    with self._lock:
                        self._closed = True
                    self._release()

    def abandon(self) -> None:
        """Test seam: stop as ``kill -9`` would.  Nothing buffered in memory
        (journal buffer, write cache) is written; files are closed, locks
        released.  Must not race with any other call."""
        with self._lock:
            self._closed = True
        self.journal.abandon()
        self._release()

    def _release(self) -> None:
        try:
            self._store.close()
        finally:
            for fd in self._lock_fds:
                os.close(fd)
            self._lock_fds = []

    @property
    def closed(self) -> bool:
        return self._closed

    # --- replay -------------------------------------------------------------

    def _apply(self, record: JournalRecord) -> None:
        """Apply one replayed journal record (open, single-threaded)."""
        rtype, body = record.rtype, record.body
        self._replayed += 1
        if rtype == REC_ADD_ENTRY:
            ledger_id, entry_id, entry = decode_add_entry(body)
            info = self._ledgers.get(ledger_id)
            if info is None:
                self._replay_skipped += 1  # its SET_MASTER_KEY predates a deletion
                return
            old = self._cache.get((ledger_id, entry_id))
            self._cache[(ledger_id, entry_id)] = entry
            self._cache_bytes += len(entry) - (0 if old is None else len(old))
            info.cache_epoch = self._epoch
            if entry_id > info.max_added:
                info.max_added = entry_id
            return
        ledger_id = decode_ledger_id(body)
        info = self._ledgers.get(ledger_id)
        if rtype == REC_SET_MASTER_KEY:
            if info is None:
                self._ledgers[ledger_id] = _Ledger(LedgerState(bytes(body[8:])))
        elif rtype == REC_LEDGER_STATE:
            state = LedgerState.decode(body[8:])
            if info is None:
                self._ledgers[ledger_id] = _Ledger(state)
            else:
                info.state = state
        elif rtype == REC_DELETE_LEDGER:
            if info is not None:
                self._delete_locked({ledger_id: info})
            return
        elif info is None:
            self._replay_skipped += 1
            return
        elif rtype == REC_FENCE:
            info.state = dataclasses.replace(info.state, fenced=True)
        elif rtype == REC_EXPLICIT_LAC:
            _lid, lac = decode_explicit_lac(body)
            if lac > info.state.explicit_lac:
                info.state = dataclasses.replace(info.state, explicit_lac=lac)
        else:
            raise StorageError(f"journal record type {rtype} at {record.end} is unknown "
                               "(written by a newer version?)")
        self._dirty.add(ledger_id)

    # --- writes (loop thread) ---------------------------------------------------

    def _create_locked(self, ledger_id: int, master_key: bytes) -> _Ledger:
        key = bytes(master_key)
        if len(key) > 255:
            raise BadRequestError("master key longer than 255 bytes")
        if ledger_id < 0:  # (a fencing read of one: found by benchmarks/fuzz_bookie.py)
            raise BadRequestError(f"bad ledger id {ledger_id}")
        info = _Ledger(LedgerState(key))
        self.journal.append(encode_set_master_key(ledger_id, key))
        self._ledgers[ledger_id] = info
        self._dirty.add(ledger_id)
        return info

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("storage engine closed")

    def add_entry(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                  master_key: bytes, *, recovery: bool = False) -> int:
        """Store an entry; return its journal seq (ack once that is durable).

        ``entry`` is kept verbatim.  Like every stored entry of the protocol
        it must begin with its ledger id and entry id (u64 each): reads from
        an entry log check those against the index (StorageError if not).

        The first add (or fence) of an unknown ledger sets its master key; a
        different key raises :class:`UnauthorizedError`.  A fenced ledger
        refuses adds (:class:`LedgerFencedError`) unless ``recovery``.
        """
        with self._lock:
            return self._add_locked(ledger_id, entry_id, entry, master_key, recovery)

    def add_entries(self, adds: Sequence[tuple[int, int, bytes, bytes]], *,
                    recovery: bool = False, journal: bool = True) -> list[int | Exception]:
        """:meth:`add_entry` (with ``recovery``) for each ``(ledger_id,
        entry_id, entry, master_key)`` in order, under one lock acquisition.
        Each result is the entry's journal seq, or the exception
        ``add_entry`` would have raised for it (later items are still added).
        The server's add path for adds not taken as a run (:meth:`add_run`).

        ``journal=False`` is BP-46's journal bypass: the entries go to the
        write cache only (a ledger's creation is still journaled), and each
        result is the :attr:`write_epoch` holding the entry instead of a
        journal seq; the entry is durable once :attr:`checkpointed_epoch`
        reaches that epoch, and lost with the write cache before that."""
        # The checks of each add, then one journal call for a run of accepted
        # adds (a ledger's creation, journaled between two runs, keeps the
        # journal order of add_entry one by one), then the write cache.
        results: list[int | Exception] = []
        append_result = results.append
        accepted: list[tuple[int, int, bytes]] = []
        infos: list[_Ledger] = []
        seqs: list[int] = []
        def journal_run() -> None:  # the accepted adds not journaled yet, in one call
            run = accepted[len(seqs):]
            if not run:
                return
            if not journal:
                seqs.extend(repeat(self._epoch, len(run)))
                return
            last = self.journal.append_add_entries(run)
            seqs.extend(range(last - len(run) + 1, last + 1))

        with self._lock:
            check = self._check_add_locked
            cache_bytes = self._cache_bytes
            for ledger_id, entry_id, entry, master_key in adds:
                try:
                    info, entry = check(ledger_id, entry_id, entry, master_key, recovery,
                                        cache_bytes)
                    if info is None:
                        journal_run()  # before the creation record
                        info = self._create_locked(ledger_id, master_key)
                except Exception as e:  # returned: the caller answers it, as for add_entry
                    append_result(e)
                    continue
                cache_bytes += len(entry)
                append_result(len(accepted))  # replaced by its seq below
                accepted.append((ledger_id, entry_id, entry))
                infos.append(info)
            if not accepted:
                return results
            journal_run()
            cache = self._cache_locked
            for (ledger_id, entry_id, entry), info in zip(accepted, infos, strict=True):
                cache(info, ledger_id, entry_id, entry)
        if len(accepted) == len(results):
            return seqs  # type: ignore[return-value]  # (list is invariant)
        return [r if type(r) is not int else seqs[r] for r in results]

    def add_run(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                entries: list[bytes], *, journal: bool = True) -> int | None:
        """:meth:`add_entries` for the usual batch, taken column-wise: adds
        of one known ledger, unfenced, under its master key, with entry ids
        strictly increasing and none in the write cache yet, ``bytes``
        entries, and room in the write cache for all.  Returns the last
        add's journal seq (the others precede it one by one); None, with
        nothing changed, for any batch that is not such a run, which the
        caller hands to :meth:`add_entries` (every refusal is decided there,
        one add at a time).  No bytecode runs per add: each step is a
        C-level ``map``, ``zip`` or dict update.  ``journal=False``: the
        journal bypass of :meth:`add_entries`; returns the write epoch
        holding the run instead of a journal seq."""
        if not entry_ids or not 0 <= ledger_id <= MAX_ID or entry_ids[0] < 0 \
                or entry_ids[-1] > MAX_ID or not all(map(lt, entry_ids, entry_ids[1:])) \
                or not all(map(is_, map(type, entries), repeat(bytes))):
            return None
        keys = list(zip(repeat(ledger_id), entry_ids))
        size = sum(map(len, entries))
        with self._lock:
            info = self._ledgers.get(ledger_id)
            if self._closed or info is None or info.state.master_key != master_key \
                    or info.state.fenced or not self._cache.keys().isdisjoint(keys) \
                    or (self._reject_bytes and self._cache_bytes + size > self._reject_bytes):
                return None
            last = self.journal.append_add_run(ledger_id, entry_ids, entries) if journal \
                else self._epoch
            self._cache.update(zip(keys, entries, strict=True))
            self._cache_bytes += size
            info.cache_epoch = self._epoch
            if entry_ids[-1] > info.max_added:
                info.max_added = entry_ids[-1]
            return last

    def _add_locked(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                    master_key: bytes, recovery: bool) -> int:
        """The checks, journal record and cache update of one add (lock held)."""
        info, data = self._check_add_locked(ledger_id, entry_id, entry, master_key, recovery,
                                            self._cache_bytes)
        if info is None:
            info = self._create_locked(ledger_id, master_key)
        seq = self.journal.append_add_entry(ledger_id, entry_id, data)
        self._cache_locked(info, ledger_id, entry_id, data)
        return seq

    def _check_add_locked(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                          master_key: bytes, recovery: bool, cache_bytes: int
                          ) -> tuple[_Ledger | None, bytes]:
        """The checks of one add (lock held), with ``cache_bytes`` in the
        write cache before it: raises what :meth:`add_entry` raises, else
        returns the ledger (None: unknown, to be created with this key) and
        the entry as ``bytes``."""
        if not 0 <= ledger_id <= MAX_ID or not 0 <= entry_id <= MAX_ID:
            raise BadRequestError(f"bad ledger/entry id ({ledger_id}, {entry_id})")
        if type(entry) is not bytes:
            entry = bytes(entry)
        if self._closed:
            raise StorageError("storage engine closed")
        if self._reject_bytes and cache_bytes + len(entry) > self._reject_bytes:
            raise TooManyRequestsError("write cache full: checkpoint behind")
        info = self._ledgers.get(ledger_id)
        if info is not None:
            state = info.state
            if state.master_key != master_key and (state.master_key or recovery):
                # (a key-less limbo ledger refuses plain adds as fenced, below)
                raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
            if state.fenced and not recovery:
                raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        return info, entry

    def _cache_locked(self, info: _Ledger, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """Put a journaled add in the write cache (lock held)."""
        cache = self._cache
        key = (ledger_id, entry_id)
        old = cache.get(key)
        cache[key] = entry
        self._cache_bytes += len(entry) if old is None else len(entry) - len(old)
        info.cache_epoch = self._epoch
        if entry_id > info.max_added:
            info.max_added = entry_id

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger (creating it with this key if unknown); return the
        journal seq to wait for before answering."""
        with self._lock:
            self._check_open()
            info = self._ledgers.get(ledger_id)
            if info is None:
                info = self._create_locked(ledger_id, master_key)
            elif info.state.master_key != master_key:
                if info.state.master_key:
                    raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
                # created by mark_limbo without a key: adopt this one
                info.state = dataclasses.replace(info.state, master_key=bytes(master_key),
                                                 fenced=True)
                self._dirty.add(ledger_id)
                return self.journal.append(encode_ledger_state(ledger_id, info.state.encode()))
            if info.state.fenced:
                return self.journal.append_seq
            info.state = dataclasses.replace(info.state, fenced=True)
            self._dirty.add(ledger_id)
            return self.journal.append(encode_fence(ledger_id))

    def set_explicit_lac(self, ledger_id: int, lac: int) -> int:
        """Record an explicit LAC (kept only if higher); return a journal seq."""
        with self._lock:
            self._check_open()
            info = self._known(ledger_id)
            if lac <= info.state.explicit_lac:
                return self.journal.append_seq
            info.state = dataclasses.replace(info.state, explicit_lac=lac)
            self._dirty.add(ledger_id)
            return self.journal.append(encode_explicit_lac(ledger_id, lac))

    def update_ledger_state(self, ledger_id: int, **fields: Any) -> int:
        """Change any of ``fenced``, ``explicit_lac``, ``limbo``,
        ``sync_cursor`` (journaled as one LEDGER_STATE record); return its seq."""
        unknown = set(fields) - _UPDATABLE_FIELDS
        if unknown:
            raise ValueError(f"cannot update ledger state fields {sorted(unknown)}")
        with self._lock:
            self._check_open()
            info = self._known(ledger_id)
            state = dataclasses.replace(info.state, **fields)
            if state == info.state:
                return self.journal.append_seq
            encoded = state.encode()
            seq = self.journal.append(encode_ledger_state(ledger_id, encoded))
            info.state = state
            self._dirty.add(ledger_id)
            return seq

    def mark_limbo(self, ledger_ids: Iterable[int]) -> None:
        """BP-46 phase one: fence each ledger and put it in limbo, creating
        (without a master key) those this bookie never stored; durable, in
        one index commit (a checkpoint), when this returns."""
        self._protect(ledger_ids, limbo=True)

    def mark_fenced(self, ledger_ids: Iterable[int]) -> None:
        """BP-46 phase one for ledgers whose end is decided (CLOSED): fence
        each, creating (without a master key) those this bookie never
        stored, so that a writer that missed the close is refused here too;
        durable, in one index commit, when this returns."""
        self._protect(ledger_ids, limbo=False)

    def _protect(self, ledger_ids: Iterable[int], *, limbo: bool) -> None:
        with self._checkpoint_lock:
            self._check_open()
            with self._lock:
                for ledger_id in ledger_ids:
                    if not 0 <= ledger_id <= MAX_ID:
                        raise BadRequestError(f"bad ledger id {ledger_id}")
                    info = self._ledgers.get(ledger_id)
                    if info is None:
                        self._ledgers[ledger_id] = _Ledger(
                            LedgerState(b"", fenced=True, limbo=limbo))
                    elif not info.state.fenced or (limbo and not info.state.limbo):
                        info.state = dataclasses.replace(info.state, fenced=True,
                                                         limbo=info.state.limbo or limbo)
                    else:
                        continue
                    self._dirty.add(ledger_id)
            self._checkpoint_locked()

    def clear_limbo(self, ledger_id: int) -> int:
        """The ledger is repaired: end its limbo (it stays fenced).  Returns
        the journal seq that makes this durable once synced."""
        return self.update_ledger_state(ledger_id, limbo=False)

    def is_limbo(self, ledger_id: int) -> bool:
        """True if the ledger is in limbo (False if unknown)."""
        info = self._ledgers.get(ledger_id)
        return info is not None and info.state.limbo

    def limbo_ledgers(self) -> list[int]:
        with self._lock:
            return sorted(lid for lid, info in self._ledgers.items() if info.state.limbo)

    def delete_ledger(self, ledger_id: int) -> int:
        """Stop serving the ledger now; journal its deletion (return the seq);
        the next checkpoint removes its index rows and state."""
        return self.delete_ledgers([ledger_id])

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> int:
        """:meth:`delete_ledger` for many at once: one pass over the write
        cache for all of them (GC may drop thousands of ledgers in one run,
        and a pass per ledger held the lock, and the loop, for as long)."""
        deleted: list[int] = []
        with self._lock:
            self._check_open()
            seq = self.journal.append_seq
            doomed: dict[int, _Ledger] = {}
            for ledger_id in ledger_ids:
                info = self._ledgers.get(ledger_id)
                if info is not None and ledger_id not in doomed:
                    seq = self.journal.append(encode_delete_ledger(ledger_id))
                    doomed[ledger_id] = info
            self._delete_locked(doomed)
            deleted = list(doomed)
        for ledger_id in deleted:
            self._store.read_cache.discard_ledger(ledger_id)
        return seq

    def _delete_locked(self, doomed: dict[int, _Ledger]) -> None:
        """Forget ``doomed`` ledgers (id -> info): one pass over each cache
        that holds any of them."""
        in_cache: set[int] = set()
        in_flush: set[int] = set()
        for ledger_id, info in doomed.items():
            del self._ledgers[ledger_id]
            self._dirty.discard(ledger_id)
            self._pending_deletes.add(ledger_id)
            if info.cache_epoch == self._epoch:
                in_cache.add(ledger_id)
            elif info.cache_epoch == self._epoch - 1 and self._flushing:
                in_flush.add(ledger_id)
        if in_cache:
            for key in [k for k in self._cache if k[0] in in_cache]:
                self._cache_bytes -= len(self._cache.pop(key))
        if in_flush:
            # Never mutate the dict the checkpoint thread is writing out.
            self._flushing = {k: v for k, v in self._flushing.items() if k[0] not in in_flush}

    # --- reads ----------------------------------------------------------------

    def _known(self, ledger_id: int) -> _Ledger:
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(f"ledger {ledger_id}")
        return info

    def _last_entry_locked(self, ledger_id: int, info: _Ledger) -> int:
        if info.index_max is None:
            info.index_max = self._store.index.last_entry_id(ledger_id)
        return max(info.max_added, info.index_max)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry; ``entry_id == -1`` means the last one stored.

        Raises :class:`NoSuchLedgerError` if the ledger is unknown (or
        deleted), :class:`NoSuchEntryError` if the entry is not stored."""
        with self._lock:
            self._check_open()
            info = self._ledgers.get(ledger_id)
            if info is None:
                raise NoSuchLedgerError(f"ledger {ledger_id}")
            if entry_id < 0:
                if entry_id != LAST_ENTRY:
                    raise BadRequestError(f"bad entry id {entry_id}")
                entry_id = self._last_entry_locked(ledger_id, info)
                if entry_id < 0:
                    raise NoSuchEntryError(f"ledger {ledger_id} has no entries")
            key = (ledger_id, entry_id)
            data = self._cache.get(key)
            if data is None:
                data = self._flushing.get(key)
            if data is not None:
                return data
        data = self._store.read(ledger_id, entry_id)
        if data is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}")
        return data

    def read_records(self, ledger_id: int, start: int, max_count: int, max_bytes: int
                     ) -> tuple[int, list[bytes]]:
        """Stored entries ``start, start + 1, ...`` in order (BP-62's batch)
        as records, ``(u32 length | entry)*``, the layout of a batch
        response's entry list and of an entry log: how many entries, and the
        byte strings that joined make the records.  At most ``max_count``
        entries, stopping at the first missing one or error, or before the
        records would pass ``max_bytes``; the first entry is always
        returned.  Raises what :meth:`read_entry` raises when the first entry
        cannot be read.  One lock per run of cached entries, and one
        ``pread``, passed on as read, per run of checkpointed ones: no
        per-entry lock, lookup or copy."""
        chunks: list[bytes] = []
        count = size = 0
        entry_id = start
        pack = RECORD_PREFIX.pack
        while count < max_count:
            with self._lock:
                self._check_open()
                if ledger_id not in self._ledgers:
                    if count:
                        return count, chunks
                    raise NoSuchLedgerError(f"ledger {ledger_id}")
                cache, flushing = self._cache, self._flushing
                while count < max_count:
                    key = (ledger_id, entry_id)
                    data = cache.get(key)
                    if data is None:
                        data = flushing.get(key)
                        if data is None:
                            break
                    size += RECORD_PREFIX_SIZE + len(data)
                    if count and size > max_bytes:
                        return count, chunks
                    chunks.append(pack(len(data)))
                    chunks.append(data)
                    count += 1
                    entry_id += 1
            if count >= max_count:
                break
            try:
                got, records = self._store.read_records(ledger_id, entry_id, max_count - count,
                                                        max_bytes - size)
            except QuireError:
                if count:
                    return count, chunks
                raise
            if not got:
                if count:
                    return count, chunks
                raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}")
            run_bytes = sum(map(len, records))
            if count and size + run_bytes > max_bytes:
                # a run goes past the room only by its first entry
                return count, chunks
            chunks += records
            size += run_bytes
            count += got
            entry_id += got
        return count, chunks

    def stored_entry_ids(self, ledger_id: int, first: int, last: int) -> set[int]:
        """The ids from ``first`` to ``last`` (inclusive) of the entries
        stored for the ledger, in the write cache or the index (BP-46
        repair: what this bookie lacks is what it should hold minus these)."""
        with self._lock:
            self._check_open()
            if ledger_id not in self._ledgers:
                return set()
            caches = (self._cache, self._flushing)
            if last - first < sum(map(len, caches)):  # look each id up
                pending = {entry_id for entry_id in range(first, last + 1)
                           if (ledger_id, entry_id) in self._cache
                           or (ledger_id, entry_id) in self._flushing}
            else:  # walk the (smaller) caches
                pending = {entry_id for cached in caches for (lid, entry_id) in cached
                           if lid == ledger_id and first <= entry_id <= last}
        return pending.union(self._store.index.entry_ids(ledger_id, first, last))

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored for the ledger (-1 if none)."""
        with self._lock:
            return self._last_entry_locked(ledger_id, self._known(ledger_id))

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def is_fenced(self, ledger_id: int) -> bool:
        with self._lock:
            return self._known(ledger_id).state.fenced

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The ledger's master key, or None if the ledger is unknown."""
        info = self._ledgers.get(ledger_id)
        return None if info is None else info.state.master_key

    def get_explicit_lac(self, ledger_id: int) -> int:
        with self._lock:
            return self._known(ledger_id).state.explicit_lac

    def get_ledger_state(self, ledger_id: int) -> LedgerState:
        with self._lock:
            return self._known(ledger_id).state

    def list_ledgers(self) -> list[int]:
        with self._lock:
            return sorted(self._ledgers)

    # --- checkpoint / gc (background thread) ------------------------------------

    @property
    def checkpoint_due(self) -> bool:
        """True once the write cache holds ``write_cache_max_bytes`` or more."""
        return self._cache_bytes >= self._checkpoint_max_bytes

    @property
    def write_cache_bytes(self) -> int:
        return self._cache_bytes

    @property
    def write_epoch(self) -> int:
        """The write-cache epoch adds go to now: each checkpoint writes out
        the cache of one epoch and starts the next (the journal bypass's
        clock: see :attr:`checkpointed_epoch`)."""
        return self._epoch

    def checkpoint(self) -> CheckpointStats:
        """Flush the write cache to an entry log, commit index + states +
        replay mark durably, then drop journal files before the mark."""
        with self._checkpoint_lock:
            self._check_open()
            return self._checkpoint_locked()

    def _checkpoint_locked(self) -> CheckpointStats:
        started = time.perf_counter()
        with self._lock:
            mark = self.journal.mark()
            snapshot = self._cache
            epoch = self._epoch
            self._flushing = snapshot
            self._cache = {}
            self._cache_bytes = 0
            self._epoch += 1
            states = {lid: self._ledgers[lid].state for lid in self._dirty}
            self._dirty = set()
            deletions = self._pending_deletes
            self._pending_deletes = set()
        if not snapshot and not states and not deletions and mark == self._committed_mark:
            with self._lock:
                self._flushing = {}
            self.checkpointed_epoch = epoch
            return CheckpointStats(0, 0, 0, 0, 0, time.perf_counter() - started, mark)
        try:
            nbytes = self._store.flush(snapshot, states, deletions, mark)
        except BaseException as e:
            self._restore_after_failed_checkpoint(snapshot, states, deletions)
            if isinstance(e, OSError):
                raise StorageError(f"checkpoint failed: {e}") from e
            raise
        with self._lock:
            self._flushing = {}
        # A failed checkpoint put its entries back in a later epoch's cache,
        # so every epoch up to this one is now out.
        self.checkpointed_epoch = epoch
        self._committed_mark = mark
        removed = self.journal.remove_files_before(mark)
        self._checkpoints += 1
        self._checkpointed_entries += len(snapshot)
        stats = CheckpointStats(
            entries=len(snapshot), bytes=nbytes, ledger_states=len(states),
            deleted_ledgers=len(deletions), journal_files_removed=len(removed),
            duration_s=time.perf_counter() - started, mark=mark)
        self.last_checkpoint = stats
        return stats

    def _restore_after_failed_checkpoint(self, snapshot: dict[EntryKey, bytes],
                                         states: dict[int, LedgerState],
                                         deletions: set[int]) -> None:
        """Put a failed checkpoint's work back so that it is retried (the
        journal still holds all of it: its files are not removed)."""
        with self._lock:
            for key, value in snapshot.items():
                info = self._ledgers.get(key[0])
                if info is None or key in self._cache:
                    continue
                self._cache[key] = value
                self._cache_bytes += len(value)
                info.cache_epoch = self._epoch
            self._dirty |= states.keys() & self._ledgers.keys()
            self._pending_deletes |= deletions
            self._flushing = {}

    def gc_entry_logs(self) -> list[int]:
        """Checkpoint pending deletions, then remove every entry log none of
        whose ledgers exists any more; return the removed log ids."""
        with self._compaction_lock, self._checkpoint_lock:
            self._check_open()
            if self._pending_deletes:
                self._checkpoint_locked()
            return self._store.gc_entry_logs(self._is_live)

    def _is_live(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers or self._store.index.has_ledger_state(ledger_id)

    def compact_entry_logs(self, threshold: float) -> CompactionStats:
        """Checkpoint pending deletions, then compact every entry log whose
        live fraction is below ``threshold`` (see
        :mod:`~quire.bookie.storage.compaction`)."""
        with self._compaction_lock:
            with self._checkpoint_lock:
                self._check_open()
                if self._pending_deletes:
                    self._checkpoint_locked()
            return self._store.compactor.compact(threshold, self._is_live, self._exclusive)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._checkpoint_lock:
            self._check_open()
            yield

    # --- misc -----------------------------------------------------------------

    def disk_usage(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of the ledger directory's file system."""
        st = os.statvfs(self.config.ledgers_dir)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    @property
    def stats(self) -> StorageStats:
        rc = self._store.read_cache
        return StorageStats(
            ledgers=len(self._ledgers), write_cache_entries=len(self._cache) + len(self._flushing),
            write_cache_bytes=self._cache_bytes, read_cache_entries=len(rc),
            read_cache_bytes=rc.size_bytes, read_cache_hits=rc.hits,
            read_cache_misses=rc.misses, checkpoints=self._checkpoints,
            checkpointed_entries=self._checkpointed_entries, replayed_records=self._replayed,
            entry_logs=len(self._store.entry_logger.log_ids()))

    @property
    def ledger_storage(self) -> EngineLedgerStorage:
        """The checkpointed layer (entry logs, index, read cache)."""
        return self._store
