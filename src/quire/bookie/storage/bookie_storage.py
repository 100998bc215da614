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

Parts
-----
:class:`BookieStorage` holds the lifecycle (open, which replays the
journal, and close) and the statistics; the rest is parts that share its
state (:mod:`~quire.bookie.storage.engine_state`), each in a module of its
own: replay (:mod:`~quire.bookie.storage.engine_replay`), the add paths
(:mod:`~quire.bookie.storage.engine_adds`), fencing, ledger state and limbo
(:mod:`~quire.bookie.storage.engine_fencing`), reads
(:mod:`~quire.bookie.storage.engine_reads`), the checkpoint
(:mod:`~quire.bookie.storage.engine_checkpoints`), and deletion with
entry-log GC and compaction (:mod:`~quire.bookie.storage.engine_deletion`).

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

Deletion (:mod:`~quire.bookie.storage.engine_deletion`): a deleted ledger
is served no more at once, and its index rows and state go with the next
checkpoint; GC and compaction then reclaim its entry logs.

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

:meth:`BookieStorage.mark_limbo` fences ledgers and puts them in limbo, in
one durable index commit, and :meth:`BookieStorage.clear_limbo` ends it
(see :mod:`~quire.bookie.storage.engine_fencing`);
:meth:`BookieStorage.stored_entry_ids` tells repair what is there.

Ledger and entry ids must be in ``[0, 2**63)``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.engine_adds import EngineAdds
from quire.bookie.storage.engine_deletion import EngineDeletion
from quire.bookie.storage.engine_fencing import EngineFencing
from quire.bookie.storage.engine_reads import EngineReads
from quire.bookie.storage.engine_replay import EngineReplay
from quire.bookie.storage.files import lock_directory
from quire.bookie.storage.journal import Journal
from quire.bookie.storage.ledger_storage import LedgerStorage
from quire.bookie.storage.seams import EngineJournal, EngineLedgerStorage
from quire.bookie.storage.shutdown import LastShutdown
from quire.bookie.storage.sync_tracker import KIND_ENTRY_LOG, KIND_JOURNAL, SyncTracker

log = logging.getLogger(__name__)


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


class BookieStorage(EngineReplay, EngineAdds, EngineFencing, EngineReads, EngineDeletion):
    """See the module docstring.  Create with :meth:`open`.  Its public
    methods are its parts' (see "Parts"), and those below."""

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
