"""The bookie journal: an append-only, preallocated, checksummed redo log.

Every add and every ledger state change is appended here first; group
commit (in the server) decides when to :meth:`Journal.sync`, so that many
appends share one ``fdatasync``.  The journal is replayed at start-up from
the checkpoint's *replay mark*; files wholly before the mark are removed
(or kept to be reused, see "Reused files").

Files
-----
``journal/<file seq:016x>.jnl``, each preallocated and starting with a
header that links it to the end of the file it continues; records follow
back to back, never split across files (the byte layout of files and
records: :mod:`~quire.bookie.storage.journal_format`).  A new file is started at
every start (an old file is never appended to again) and whenever the next
record does not fit in the current one.  The link lets replay tell a clean
roll from a hole: after a power loss the tail of file N may be gone while a
later file survived; records after such a hole were never acknowledged as
durable (``sync`` fsyncs files in order), so replay stops at the hole and
:meth:`Journal.start` sets the later files aside (renamed ``*.discarded``).

Reused files.  A file wholly before the replay mark is not deleted but kept
(renamed ``<seq>.jnl.free``, at most ``reuse_files_max`` of them) and renamed
again to become a later file, as BookKeeper's ``journalReuseFiles`` does.
Its blocks are then already written: a ``posix_fallocate``d file's blocks
are *unwritten extents*, and the first write to each makes the next
``fdatasync`` commit a metadata change as well, which doubled the time of a
journal fsync here.  A reused file still holds its old records after the
new end of data, so from format version 2 every record's crc is XORed with
a *salt* of the file seq it is written in: an old record, written under
another seq, fails the check and ends replay like a torn tail.

Each write of a preallocated file is padded with zeros to the next page
boundary (:func:`~quire.bookie.storage.files.pwrite_all`), so the kernel
never reads a partly covered page of a reused file back first; the next
write overwrites the padding, and zeros read as the end of data.

Positions
---------
A :class:`~quire.bookie.storage.journal_format.JournalMark` ``(file_seq,
offset)`` is a position in that file.  Positions are assigned when a record
is *appended* (the decision to roll is taken at append time too), so
:meth:`Journal.mark` is exact even for records still in the in-memory
buffer.  Sequence numbers returned by :meth:`Journal.append` count records
appended by this process (1, 2, ...); they are not persisted and restart at
1 after every open.

Parts
-----
:class:`Journal` is its lifecycle (open, close) and counters over parts
that share its state (:mod:`~quire.bookie.storage.journal_state`), each in
a module of its own: the files (:mod:`~quire.bookie.storage.journal_files`:
replay, start, new and reused files, removal), the append paths into the
buffer (:mod:`~quire.bookie.storage.journal_appends`), and the write and
sync (:mod:`~quire.bookie.storage.journal_writer`).

Threading
---------
* :meth:`append` / :meth:`append_add_entry` / :meth:`mark`: any thread; they
  hold the buffer lock only for a few bytecodes (no syscalls).
* :meth:`write_buffered`: any thread (the event loop): one ``pwrite`` per
  file touched, under the write lock.
* :meth:`sync`: any thread (the dedicated fsync thread); the write lock is
  held only to write the buffer and collect the files to sync, the
  ``fdatasync`` runs with no lock held, so appends and volatile writes go on.
* After each fsync, the synced whole pages of each file are dropped from the
  page cache (``posix_fadvise(DONTNEED)``, advisory; see
  ``remove_pages_from_cache``): the journal is only read back at replay.
  The page holding a file's tail is never dropped, as the next write
  continues it.
* After any write or fsync error the journal is *failed*: every later
  ``write_buffered``/``sync`` raises :class:`~quire.errors.StorageError`
  (an fsync is never retried: its failure leaves durability unknown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from quire.bookie.storage.journal_appends import JournalAppends
from quire.bookie.storage.journal_writer import JournalWriter
from quire.bookie.storage.sync_tracker import SyncTracker


@dataclass(frozen=True)
class JournalCounters:
    """Cumulative counters since open (for metrics)."""

    appended_records: int
    appended_bytes: int
    written_bytes: int
    write_calls: int
    fsync_count: int
    fsync_latency_total_s: float
    synced_records: int
    files_created: int
    files_removed: int


class Journal(JournalAppends, JournalWriter):
    """See the module docstring.  Use :meth:`open`, then :meth:`replay`
    (optional), then :meth:`start` before appending."""

    @classmethod
    def open(cls, directory: Path, *, file_size_bytes: int, max_group_bytes: int,
             preallocate: bool = True, tracker: SyncTracker | None = None,
             skip_fsync_for_testing: bool = False,
             remove_pages_from_cache: bool = False, reuse_files_max: int = 0,
             dsync_writes: bool = False) -> Journal:
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(directory, file_size_bytes=file_size_bytes,
                   max_group_bytes=max_group_bytes, preallocate=preallocate, tracker=tracker,
                   skip_fsync_for_testing=skip_fsync_for_testing,
                   remove_pages_from_cache=remove_pages_from_cache,
                   reuse_files_max=reuse_files_max, dsync_writes=dsync_writes)

    def counters(self) -> JournalCounters:
        return JournalCounters(
            appended_records=self._seq, appended_bytes=self._appended_bytes,
            written_bytes=self._written_bytes, write_calls=self._write_calls,
            fsync_count=self._fsync_count, fsync_latency_total_s=self._fsync_latency_total,
            synced_records=self._synced_seq, files_created=self._files_created,
            files_removed=self._files_removed)

    def close(self) -> None:
        """Write, sync and close (a failed journal is only closed)."""
        if self._closed:
            return
        try:
            if self._started and self._failure is None:
                self.sync()
        finally:
            self._close_fds()

    def abandon(self) -> None:
        """Test seam: close without writing the buffer, as a killed process
        would (whatever was already written stays in the page cache)."""
        with self._lock:
            self._buf = bytearray()
            self._rolls = []
        self._close_fds()

    def _close_fds(self) -> None:
        with self._sync_lock, self._write_lock:
            self._closed = True
            for fd in self._open_fds.values():
                os.close(fd)
            self._open_fds.clear()
            self._cur_fd = -1
            if self._tracker is not None:
                self._tracker.close()
