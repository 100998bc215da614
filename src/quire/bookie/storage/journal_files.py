"""The journal's files: replay, start, new and reused files, the writes
and fsyncs of one file, and the removal of files wholly before a mark
(see "Files" and "Reused files" in :mod:`~quire.bookie.storage.journal`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from quire.bookie.storage.files import fsync_dir, pwrite_all, sync_file, write_synced
from quire.bookie.storage.journal_format import (
    FILE_HEADER_SIZE,
    FREE_SUFFIX,
    JOURNAL_SUFFIX,
    JournalMark,
    JournalRecord,
    decode_file_header,
    encode_file_header,
    file_salt,
    journal_file_name,
    scan_records,
)
from quire.bookie.storage.journal_state import JournalState
from quire.errors import StorageError

log = logging.getLogger("quire.bookie.storage.journal")  # the journal's, as before the split


class JournalFiles(JournalState):
    """The files part of :class:`~quire.bookie.storage.journal.Journal`."""

    def _fsync(self, fd: int, name: str, length: int) -> None:
        if not self._skip_fsync:
            sync_file(fd, self._tracker, name, length)

    def _fsync_dir(self) -> None:
        if not self._skip_fsync:
            fsync_dir(self.directory)

    # --- replay ------------------------------------------------------------

    def replay(self, from_mark: JournalMark | None) -> Iterator[JournalRecord]:
        """Yield every valid record at or after ``from_mark`` (None: from the
        first file), in order, following the chain of files.  Must be run to
        the end before :meth:`start` (which otherwise replays by itself)."""
        if self._started:
            raise StorageError("journal already started")
        files = [s for s in self._files if from_mark is None or s >= from_mark.file_seq]
        end: JournalMark | None = from_mark
        replayed: list[tuple[int, int]] = []
        for file_seq in files:
            path = self.directory / journal_file_name(file_seq)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    data: mmap.mmap | bytes = b""
                else:
                    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                header = decode_file_header(data)
                if end is not None and file_seq == end.file_seq:
                    # The mark's own file: start at the mark (header may be lost
                    # if the file was rewound, which is fine: nothing follows).
                    start = max(end.offset, FILE_HEADER_SIZE)
                    if header is None:
                        replayed.append((file_seq, end.offset))
                        continue
                else:
                    if header is None or header[0] != file_seq or (
                            end is not None and header[1] != end):
                        log.warning("journal %s does not continue %s: replay stops", path, end)
                        break
                    start = FILE_HEADER_SIZE
                    end = JournalMark(file_seq, start)
                file_end = start
                for rtype, body, rec_end in scan_records(data, start, header[2]):
                    end = JournalMark(file_seq, rec_end)
                    file_end = rec_end
                    yield JournalRecord(rtype, body, end)
                replayed.append((file_seq, file_end))
            finally:
                if isinstance(data, mmap.mmap):
                    data.close()
        self._replayed_files = replayed
        self._replay_end = end if end is not None else JournalMark(0, 0)

    @property
    def replay_end(self) -> JournalMark | None:
        """Where replay found the end of valid data (None before replay)."""
        return self._replay_end

    # --- start / roll ---------------------------------------------------------

    def start(self) -> None:
        """Fsync the replayed files, set aside files after a hole, then create
        a fresh file to append to.

        The fsync matters after a ``kill -9``: replayed records may still be
        only in the page cache, and the new file's header links to where they
        end, so they must be durable before anything in the new file is."""
        if self._started:
            return
        if self._replay_end is None:
            for _ in self.replay(None):
                pass
        assert self._replay_end is not None
        end = self._replay_end
        for file_seq, file_end in self._replayed_files:
            name = journal_file_name(file_seq)
            fd = os.open(self.directory / name, os.O_RDONLY)
            try:
                self._fsync(fd, name, file_end)
            finally:
                os.close(fd)
        last_kept = self._replayed_files[-1][0] if self._replayed_files else end.file_seq
        for file_seq in self._files:
            if file_seq > last_kept:
                path = self.directory / journal_file_name(file_seq)
                os.replace(path, path.with_name(path.name + ".discarded"))
                log.warning("journal file %s follows a hole: set aside as *.discarded", path)
        self._files = [s for s in self._files if s <= last_kept]
        new_seq = max([end.file_seq, *self._files]) + 1
        with self._write_lock:
            self._open_file(new_seq, end)
            fd = self._cur_fd
            self._dirty.pop(new_seq, None)
            self._dir_dirty = False
        self._fsync(fd, journal_file_name(new_seq), FILE_HEADER_SIZE)
        self._fsync_dir()
        self._tail_file = new_seq
        self._tail_off = FILE_HEADER_SIZE
        self._tail_salt = file_salt(new_seq)
        self._started = True

    def _open_file(self, file_seq: int, prev: JournalMark) -> None:
        """Start a new current file, a reused one or a new preallocated one,
        and write its header (write lock held)."""
        name = journal_file_name(file_seq)
        path = self.directory / name
        reused = self._free.pop(0) if self._free else None
        if reused is not None:
            os.replace(reused, path)
        fd = os.open(path, os.O_RDWR | (0 if reused else os.O_CREAT | os.O_EXCL), 0o644)
        try:
            if self._tracker is not None:
                self._tracker.created(name)
            if self._preallocate and (reused is None
                                      or os.fstat(fd).st_size < self._file_size):
                os.posix_fallocate(fd, 0, self._file_size)
            self._write_header(fd, name, encode_file_header(file_seq, prev))
        except BaseException:
            os.close(fd)
            raise
        self._open_fds[file_seq] = fd
        self._files.append(file_seq)
        self._cur_seq = file_seq
        self._cur_fd = fd
        self._cur_off = FILE_HEADER_SIZE
        self._dirty[file_seq] = FILE_HEADER_SIZE
        self._dir_dirty = True
        self._files_created += 1

    def _write_header(self, fd: int, name: str, header: bytes) -> None:
        """Write a new file's header; the first one also probes whether the
        kernel takes ``RWF_DSYNC`` (Linux 4.7 and later)."""
        probe = self._dsync_writes and not self._files_created
        try:
            self._write_at(fd, memoryview(header), 0, name if probe else "")
        except OSError as e:
            if not probe or e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            log.warning("journal %s: RWF_DSYNC refused (%s); fdatasync after each write",
                        self.directory, e)
            self._dsync_writes = False
            self._write_at(fd, memoryview(header), 0, "")

    def _write_at(self, fd: int, data: memoryview, offset: int, synced_as: str) -> int:
        """Write ``data`` at ``offset``, with :func:`write_synced` as file
        ``synced_as`` unless that is empty."""
        # Zeros to the page boundary, so the write never reads a page back
        # (see pwrite_all); only inside a preallocated file's size, where
        # they cannot grow the file.
        pad = self._preallocate and offset + len(data) + mmap.PAGESIZE <= self._file_size
        if synced_as:
            return write_synced(fd, data, offset, self._tracker, synced_as,
                                offset + len(data), pad_to_page=pad)
        return pwrite_all(fd, data, offset, pad_to_page=pad)

    # --- housekeeping -------------------------------------------------------

    def remove_files_before(self, mark: JournalMark) -> list[int]:
        """Delete files wholly before ``mark`` (never the current file or one
        with unsynced writes); return their seqs."""
        removed: list[int] = []
        with self._write_lock:
            limit = min([mark.file_seq, *self._dirty, *self._open_fds]
                        + ([self._cur_seq] if self._cur_seq else []))
            for file_seq in list(self._files):
                if file_seq >= limit:
                    continue
                name = journal_file_name(file_seq)
                self._remove_or_keep(self.directory / name)
                if self._tracker is not None:
                    self._tracker.removed(name)
                self._files.remove(file_seq)
                removed.append(file_seq)
            self._files_removed += len(removed)
        return removed

    def _remove_or_keep(self, path: Path) -> None:
        """Delete a journal file, or keep it for reuse while fewer than
        ``reuse_files_max`` are kept (write lock held).  Neither needs to be
        durable: a file that comes back after a crash is before the mark."""
        with contextlib.suppress(FileNotFoundError):
            if len(self._free) < self._reuse_max:
                free = path.with_name(path.name[:-len(JOURNAL_SUFFIX)] + FREE_SUFFIX)
                os.replace(path, free)
                self._free.append(free)
            else:
                os.unlink(path)

    def free_files(self) -> list[str]:
        """Names of the files kept for reuse, the next one to be reused first."""
        with self._write_lock:
            return [p.name for p in self._free]

    def file_seqs(self) -> list[int]:
        """Seqs of the journal files currently on disk."""
        with self._write_lock:
            return list(self._files)
