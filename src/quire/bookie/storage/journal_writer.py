"""The journal's writes and syncs: the buffer goes to the files with
:meth:`~JournalWriter.write_buffered` (the page cache: BP-14 volatile adds)
or :meth:`~JournalWriter.sync` (durable: group commit), and what is synced
leaves the page cache (see "Threading" in :mod:`~quire.bookie.storage.journal`).
"""

from __future__ import annotations

import os
import time

from quire.bookie.storage.files import drop_cached_pages, whole_pages
from quire.bookie.storage.journal_files import JournalFiles
from quire.bookie.storage.journal_format import journal_file_name
from quire.bookie.storage.journal_state import SyncStats
from quire.errors import StorageError

_DROP_MIN_BYTES = 1 << 20


class JournalWriter(JournalFiles):
    """Writes and syncs of :class:`~quire.bookie.storage.journal.Journal`
    (they open the next file when the buffer rolls over, hence the base)."""

    @property
    def written_seq(self) -> int:
        """Highest seq written to the file (page cache)."""
        return self._written_seq

    @property
    def synced_seq(self) -> int:
        """Highest seq made durable by :meth:`sync`."""
        return self._synced_seq

    # --- write / sync -----------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StorageError(f"journal failed earlier: {self._failure}") from self._failure
        if self._closed:
            raise StorageError("journal closed")
        if not self._started:
            raise StorageError("journal not started")

    def _write_locked(self, dsync: bool = False) -> bool:
        """Write the buffer to the file(s) (write lock held).  ``dsync``: if
        the buffer goes to the current file alone, write it with
        ``RWF_DSYNC`` (durable when the call returns); returns whether it
        did."""
        with self._lock:
            buf = self._buf
            if not buf:
                return False
            rolls = self._rolls
            seq = self._seq
            self._buf = bytearray()
            self._rolls = []
        try:
            view = memoryview(buf)
            pos = 0
            durable = dsync and not rolls
            for at, new_seq, prev in rolls:
                if at > pos:
                    self._write_current(view[pos:at])
                self._open_file(new_seq, prev)
                pos = at
            if pos < len(buf):
                self._write_current(view[pos:], durable)
        except OSError as e:
            self._failure = e
            raise StorageError(f"journal write failed: {e}") from e
        self._write_calls += 1
        self._written_seq = seq
        return durable

    def _write_current(self, data: memoryview, dsync: bool = False) -> None:
        self._cur_off = self._write_at(self._cur_fd, data, self._cur_off,
                                       journal_file_name(self._cur_seq) if dsync else "")
        self._dirty[self._cur_seq] = self._cur_off
        self._written_bytes += len(data)

    def write_buffered(self) -> int:
        """Write everything buffered into the journal file (no fsync); return
        the highest seq now in the file (BP-14 volatile adds wait for this)."""
        with self._write_lock:
            self._check_usable()
            self._write_locked()
            if self._drop_pages:
                self._recycle_written_pages()
            return self._written_seq

    def _recycle_written_pages(self) -> None:
        """Keep BP-14 volatile writes from piling up in the page cache (write
        lock held).  They are not fsynced, so :meth:`_drop_synced_pages` never
        sees them: their pages would stay dirty until the kernel's flusher
        wrote them (30 s by default), and the cache would grow by every byte
        written, each new page costing more to fill than a recycled one.
        Once ``_DROP_MIN_BYTES`` more of the current file are written, one
        ``POSIX_FADV_DONTNEED`` from the start of the previous stretch to
        here drops the previous stretch (written back since) and starts the
        writeback of this one.  Advisory only: it is not an fsync, so nothing
        counts as durable because of it."""
        seq, end = self._cur_seq, whole_pages(self._cur_off)
        if self._recycle_file != seq:
            self._recycle_file, self._recycle_from, self._recycle_kicked = seq, 0, 0
        if end - self._recycle_kicked < _DROP_MIN_BYTES:
            return
        drop_cached_pages(self._cur_fd, self._recycle_from, end - self._recycle_from)
        self._recycle_from, self._recycle_kicked = self._recycle_kicked, end

    def sync(self) -> int:
        """Write anything buffered, fdatasync every file written since the last
        sync (in file order, then the directory if files were created) and
        return the highest seq now durable.  When everything written before
        is synced and the buffer goes to the current file, the buffer is
        written with ``RWF_DSYNC`` instead, which makes it durable as
        ``fdatasync`` would (``SyncStats.latency_s`` covers the write too)."""
        with self._sync_lock:
            started = time.perf_counter()
            with self._write_lock:
                self._check_usable()
                # Nothing written and unsynced, no file to create: the
                # group's write can be its own fsync (one system call, so
                # one wait for the GIL afterwards instead of two).
                durable = self._write_locked(
                    dsync=self._dsync_writes and not self._dirty and not self._dir_dirty)
                dirty = self._dirty
                self._dirty = {}
                dir_dirty = self._dir_dirty
                self._dir_dirty = False
                seq = self._written_seq
                written_bytes = self._written_bytes
                fds = {s: self._open_fds[s] for s in dirty}
            if not dirty and not dir_dirty:
                return self._synced_seq
            try:
                if not durable:  # (else the write itself was the fsync)
                    for file_seq in sorted(dirty):
                        self._fsync(fds[file_seq], journal_file_name(file_seq),
                                    dirty[file_seq])
                if dir_dirty:
                    self._fsync_dir()
            except OSError as e:
                self._failure = e
                raise StorageError(f"journal fsync failed: {e}") from e
            latency = time.perf_counter() - started
            if self._drop_pages:
                self._drop_synced_pages(fds, dirty)
            with self._write_lock:
                for file_seq in [s for s in self._open_fds
                                 if s != self._cur_seq and s not in self._dirty]:
                    os.close(self._open_fds.pop(file_seq))
            self.last_sync_stats = SyncStats(
                records=seq - self._synced_seq, bytes=written_bytes - self._synced_bytes,
                files=len(dirty), latency_s=latency, durable_seq=seq)
            self._fsync_count += 1
            self._fsync_latency_total += latency
            self._synced_bytes = written_bytes
            self._synced_seq = seq
            return seq

    def _drop_synced_pages(self, fds: dict[int, int], synced: dict[int, int]) -> None:
        """Advise the kernel to drop the whole pages just made durable (sync
        lock held, after the fsync), once at least ``_DROP_MIN_BYTES`` of them
        gathered (one fadvise per MiB, not one per fsync: every system call in
        the fsync thread is another wait for the GIL).  Only pages entirely
        below each file's synced length go, so the partly written tail page stays cached; the
        file's fd is open (the write lock only closes fds after this).  Purely
        advisory: an error changes nothing but the page cache."""
        dropped = self._dropped
        for file_seq, length in synced.items():
            start = dropped.get(file_seq, 0)
            end = whole_pages(length)
            if end - start < _DROP_MIN_BYTES:
                continue
            drop_cached_pages(fds[file_seq], start, end - start)
            dropped[file_seq] = end
        if len(dropped) > len(synced) + 4:
            for file_seq in [s for s in dropped if s not in synced]:
                del dropped[file_seq]
