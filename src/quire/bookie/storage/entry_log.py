"""Entry logs: where checkpointed entries live (many ledgers per file).

Files are ``ledgers/entrylog/<log id:08x>.log``; ids start at 1 and only
grow.  A log is only ever appended to by the checkpoint thread, and a new one
is started at every open and whenever the next entry would take the log past
``entry_log_max_bytes``.  Everything a checkpoint wrote is fsynced before the
checkpoint commits the index that points into it, so the index never refers
to bytes that a power loss could take away; unreferenced bytes (a checkpoint
that crashed before its commit) are garbage that GC removes with the log.

Layout, all integers big-endian::

    file header (32 bytes)
    offset  size  field
    0       4     magic b"QELG"
    4       2     format version = 2
    6       2     reserved (0)
    8       8     log id (uint64)
    16      16    reserved (0)

    entry record (BookKeeper's entry log record), back to back
    offset  size  field
    0       4     entry length N (uint32)
    4       N     entry bytes, as stored by the client (already digested);
                  a stored entry begins with its ledger id (uint64) and
                  entry id (uint64), so bytes 4..20 of a record name it

The index stores ``(log id, offset of the record, N)``.  A read fetches the
record in one ``pread`` and checks that it names the expected ledger, entry
and length (:class:`~quire.errors.StorageError` otherwise).  A run of records
is, byte for byte, BP-62's entry list (``(u32 length | entry)*``): a batch
read sends what it ``pread`` s without taking it apart.  There is no
per-record checksum: entries carry the client's digest and are verified by
the reader.

Format version 1 repeated ledger and entry id in a 20-byte record header; a
bookie refuses to read such a log (:class:`~quire.errors.StorageError`).

Logs are written with ``O_DIRECT`` where the file system allows it
(``entry_log_direct_io``; see "direct I/O" below), so a log's last page may
hold zeros past its last record: nothing reads a log but by the index.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import struct
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from functools import partial
from itertools import accumulate, chain, repeat
from operator import add, itemgetter, sub
from pathlib import Path
from typing import NamedTuple

from quire.bookie.storage.files import (
    CAN_DROP_PAGES,
    drop_cached_pages,
    fsync_dir,
    pread_exact,
    pwrite_all,
    sync_file,
    whole_pages,
)
from quire.bookie.storage.sync_tracker import SyncTracker
from quire.errors import StorageError

LOG_MAGIC = b"QELG"
LOG_VERSION = 2
LOG_HEADER_SIZE = 32
_LOG_HEADER = struct.Struct(">4sHHQ16x")
RECORD_PREFIX = struct.Struct(">I")
RECORD_PREFIX_SIZE = RECORD_PREFIX.size
"""Bytes before a record's entry: its length."""
RECORD_HEAD = struct.Struct(">IQQ")
"""A record's length and the ledger and entry id its entry begins with."""
MIN_ENTRY_BYTES = RECORD_HEAD.size - RECORD_PREFIX_SIZE
_KEY, _ENTRY = itemgetter(0), itemgetter(1)
CHUNK_ENTRIES = 4096
"""A checkpoint works through its entries this many at a time.  Each
C-level step (a ``map``, a sort, an LMDB ``putmulti``) holds the GIL until
it returns; over a whole checkpoint of 70,000 entries such steps held it
for up to 12 ms at a time, stalling the event loop and the journal's fsync
thread.  A chunk's steps take well under a millisecond."""
_PLUS_PREFIX = partial(add, RECORD_PREFIX_SIZE)
_SUFFIX = ".log"
_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
log = logging.getLogger(__name__)
_PAGE = mmap.PAGESIZE

class IndexRows(NamedTuple):
    """Where a batch's entries were written: one column per field, one
    position per entry, in write order.  Columns, because the index packs
    them with ``map`` (no Python bytecode per entry, so the checkpoint thread
    holds the GIL that the event loop needs for as short as possible)."""

    ledger_ids: list[int]
    entry_ids: list[int]
    log_ids: list[int]
    offsets: list[int]
    """Of each entry's record (its length prefix) in its log."""
    lengths: list[int]
    """Of each entry."""


def entry_log_name(log_id: int) -> str:
    return f"{log_id:08x}{_SUFFIX}"


def list_entry_logs(directory: Path) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        if name.endswith(_SUFFIX) and len(name) == 8 + len(_SUFFIX):
            try:
                ids.append(int(name[:8], 16))
            except ValueError:
                continue
    return sorted(ids)


def _check_log_header(log_id: int, header: bytes) -> None:
    if len(header) != LOG_HEADER_SIZE:
        raise StorageError(f"entry log {log_id}: {len(header)}-byte file header")
    magic, version, _reserved, stored_id = _LOG_HEADER.unpack(header)
    if magic != LOG_MAGIC or stored_id != log_id:
        raise StorageError(f"entry log {log_id}: not an entry log of this bookie "
                           f"(magic {magic!r}, log id {stored_id})")
    if version != LOG_VERSION:
        raise StorageError(f"entry log {log_id} has format version {version}; this bookie "
                           f"reads version {LOG_VERSION} only (start it on empty directories)")


def _bad_record(log_id: int, offset: int, head: tuple[int, int, int], ledger_id: int,
                entry_id: int, length: int) -> StorageError:
    n, lid, eid = head
    return StorageError(f"entry log {log_id} offset {offset} holds ({lid}, {eid}, {n} bytes), "
                        f"index expected ({ledger_id}, {entry_id}, {length} bytes)")


BEHIND_FRACTION = 0.8
"""A batch that took more than this fraction of the time since the one
before started shows the checkpoints falling behind (see
:meth:`EntryLogger.write_batch`)."""


class EntryLogger:
    """Appends batches of entries (checkpoint thread) and serves ``pread``
    lookups (any thread)."""

    def __init__(self, directory: Path, *, max_bytes: int, write_buffer_bytes: int,
                 bulk_write_buffer_bytes: int = 0,
                 tracker: SyncTracker | None = None,
                 remove_pages_from_cache: bool = False, direct_io: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``write_buffer_bytes``: the size of each write while batches keep
        up; ``bulk_write_buffer_bytes`` (0: the same): the size once a batch
        took more than four fifths of the time since the one before (see
        :meth:`write_batch`; ``clock`` times them)."""
        self.directory = Path(directory)
        self._drop_pages = remove_pages_from_cache and CAN_DROP_PAGES
        self._direct = direct_io and _O_DIRECT != 0
        """Logs are written with O_DIRECT through :attr:`_stage` (False where
        the platform or the file system has no direct I/O)."""
        self._stage: mmap.mmap | None = None
        """Direct I/O: page-aligned staging for the current log's unwritten
        bytes; its first ``_stage_len`` bytes belong at ``_stage_base``."""
        self._stage_base = 0
        self._stage_len = 0
        self._cur_dropped = 0
        """Offset of the current log below which its pages were dropped."""
        self._cur_kicked = 0
        """Offset of the current log below which writeback was started."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        self._small_piece_bytes = write_buffer_bytes
        self._bulk_piece_bytes = max(write_buffer_bytes, bulk_write_buffer_bytes)
        self._write_buffer_bytes = write_buffer_bytes
        """The size of each write of the current batch (one of the two above)."""
        self._last_batch_started: float | None = None
        self._clock = clock
        self._tracker = tracker
        self._logs = list_entry_logs(self.directory)
        self._next_id = (self._logs[-1] + 1) if self._logs else 1
        self._cur_id = 0
        self._cur_fd = -1
        self._cur_off = 0
        self._fd_lock = threading.Lock()
        self._read_fds: dict[int, int] = {}
        self._closed = False

    @property
    def piece_bytes(self) -> int:
        """The size of each write of the next batch (see :meth:`write_batch`)."""
        return self._write_buffer_bytes

    @property
    def current_log_id(self) -> int:
        """The log being appended to (0 before the first write since open)."""
        return self._cur_id

    def log_ids(self) -> list[int]:
        with self._fd_lock:
            return list(self._logs)

    # --- writing (checkpoint thread only) --------------------------------------

    def write_batch(self, items: Sequence[tuple[tuple[int, int], bytes]]
                    ) -> tuple[IndexRows, dict[int, set[int]]]:
        """Append ``((ledger_id, entry_id), entry)`` items in the given order;
        when it returns, everything written is fsynced.  Returns where each
        entry went and, per log id written, the set of ledger ids it received.

        Each batch is written in pieces of ``write_buffer_bytes``, small so
        that a journal sharing the disk waits behind little; but a batch that
        took more than four fifths of the time since the previous one started
        (the checkpoints are falling behind their inflow, so the write cache
        fills and adds will stall) makes the next batch use the bulk pieces,
        which the device takes faster; it goes back once a batch is quick
        again.  (At half the interval, single 1 KiB appends at 35 MB/s a
        bookie already switched, and their p99 went back up.)"""
        started = self._clock()
        try:
            return self._write_batch(items)
        except BaseException:
            # Never append after a failed write: the next batch starts a new
            # log (this one's unreferenced tail is garbage for GC).
            if self._cur_fd >= 0:
                os.close(self._cur_fd)
                self._cur_fd = -1
                self._cur_id = 0
            raise
        finally:
            last, self._last_batch_started = self._last_batch_started, started
            behind = last is not None \
                and self._clock() - started > (started - last) * BEHIND_FRACTION
            self._write_buffer_bytes = self._bulk_piece_bytes if behind \
                else self._small_piece_bytes

    def _write_batch(self, items: Sequence[tuple[tuple[int, int], bytes]]
                     ) -> tuple[IndexRows, dict[int, set[int]]]:
        rows = IndexRows([], [], [], [], [])
        ledgers: dict[int, set[int]] = {}
        created = False
        for start in range(0, len(items), CHUNK_ENTRIES):
            created |= self._write_chunk(items[start:start + CHUNK_ENTRIES], rows, ledgers)
        if items:
            if self._direct:
                self._write_stage(final=True)
            sync_file(self._cur_fd, self._tracker, entry_log_name(self._cur_id), self._cur_off)
            end = whole_pages(self._cur_off)
            if self._drop_pages and not self._direct and end > self._cur_dropped:
                drop_cached_pages(self._cur_fd, self._cur_dropped, end - self._cur_dropped)
                self._cur_dropped = end
        if created:
            fsync_dir(self.directory)
        return rows, ledgers

    def _write_chunk(self, items: Sequence[tuple[tuple[int, int], bytes]], rows: IndexRows,
                     ledgers: dict[int, set[int]]) -> bool:
        """Append ``items`` (at most :data:`CHUNK_ENTRIES`) and their rows; no
        fsync.  Returns whether a log was started."""
        # Every per-entry step below is a C-level map/accumulate/join: Python
        # only loops per log and per write_buffer_bytes piece.
        keys = list(map(_KEY, items))
        entries = list(map(_ENTRY, items))
        lengths = list(map(len, entries))
        ends = list(accumulate(map(_PLUS_PREFIX, lengths)))  # bytes of records 0..i
        rows.ledger_ids.extend(map(_KEY, keys))
        rows.entry_ids.extend(map(_ENTRY, keys))
        rows.lengths.extend(lengths)
        created = False
        pos, count = 0, len(items)
        while pos < count:
            if self._cur_fd < 0:
                self._start_log()
                created = True
            off = self._cur_off
            base = ends[pos - 1] if pos else 0
            cut = bisect_right(ends, base + self._max_bytes - off, pos)
            if cut == pos:  # the next record does not fit
                if off > LOG_HEADER_SIZE:
                    self._finish_current()
                    continue
                cut = pos + 1  # larger than a whole log: a log of its own
            self._write_records(entries, lengths, ends, pos, cut)
            log_id = self._cur_id
            rows.log_ids.extend(repeat(log_id, cut - pos))
            # offset of record i = off + (ends[i] - base) - (lengths[i] + prefix)
            rows.offsets.extend(map(sub, ends[pos:cut], map(
                partial(add, RECORD_PREFIX_SIZE + base - off), lengths[pos:cut])))
            ledgers.setdefault(log_id, set()).update(map(_KEY, keys[pos:cut]))
            pos = cut
        return created

    def _write_records(self, entries: list[bytes], lengths: list[int], ends: list[int],
                       pos: int, cut: int) -> None:
        """Write records ``pos..cut-1`` at the end of the current log, in
        pieces of about ``write_buffer_bytes``."""
        fd, off, chunk = self._cur_fd, self._cur_off, self._write_buffer_bytes
        while pos < cut:
            base = ends[pos - 1] if pos else 0
            end = max(pos + 1, bisect_right(ends, base + chunk, pos, cut))
            piece = b"".join(chain.from_iterable(
                zip(map(RECORD_PREFIX.pack, lengths[pos:end]), entries[pos:end], strict=True)))
            pos = end
            if self._direct:
                self._stage_write(piece)
                off += len(piece)
                continue
            off = pwrite_all(fd, piece, off)
            if self._drop_pages:
                # Start the writeback of what this piece filled now (DONTNEED
                # hands dirty pages to writeback and drops nothing dirty), so
                # the checkpoint's fsync finds little left, and journal
                # fsyncs never queue behind a whole checkpoint written at once.
                kicked = whole_pages(off)
                if kicked > self._cur_kicked:
                    drop_cached_pages(fd, self._cur_kicked, kicked - self._cur_kicked)
                    self._cur_kicked = kicked
        self._cur_off = off

    # --- direct I/O ------------------------------------------------------------
    # O_DIRECT writes must start at a page-aligned offset and cover whole pages
    # from a page-aligned buffer.  Records are copied into the staging map;
    # its whole pages are written as they fill, and the partly filled last
    # page stays staged (file offset _stage_base) to be completed by later
    # records.  Before an fsync that last page is written too, zero-padded,
    # and written again once more records complete it: the bytes it held
    # are rewritten unchanged.  The padding past the end of the last record
    # is never read (reads go by the index).

    def _stage_write(self, data: bytes) -> None:
        stage = self._stage
        assert stage is not None
        with memoryview(data) as view:
            done, size = 0, len(view)
            while done < size:
                n = min(size - done, len(stage) - self._stage_len)
                stage[self._stage_len:self._stage_len + n] = view[done:done + n]
                self._stage_len += n
                done += n
                if self._stage_len == len(stage) or done == size:
                    self._write_stage(final=False)
                    if not self._direct:  # refused: the rest goes through the page cache
                        pwrite_all(self._cur_fd, view[done:], self._stage_base)
                        return

    def _write_stage(self, *, final: bool) -> None:
        """Write the staged whole pages, and with ``final`` the partly filled
        last page too (zero-padded); keep that page staged."""
        stage, staged = self._stage, self._stage_len
        assert stage is not None
        whole = staged - staged % _PAGE
        upto = whole
        if final and staged > whole:
            upto = whole + _PAGE
            stage[staged:upto] = bytes(upto - staged)
        if upto:
            refused = ""
            with memoryview(stage) as view, view[:upto] as pages:
                try:
                    pwrite_all(self._cur_fd, pages, self._stage_base)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    refused = str(e)  # (not e: its traceback holds views of the stage)
            if refused:
                self._leave_direct_io(refused)
                return
        if whole:
            stage.move(0, whole, staged - whole)
            self._stage_base += whole
            self._stage_len = staged - whole

    def _leave_direct_io(self, error: str) -> None:
        """A direct write was refused (a file system that opens with O_DIRECT
        but cannot write so): clear the flag on the current log, write what
        is staged through the page cache, and write buffered from now on."""
        log.warning("entry log %s: direct write refused (%s); writing through the page cache",
                    entry_log_name(self._cur_id), error)
        fd, stage, staged = self._cur_fd, self._stage, self._stage_len
        assert stage is not None
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
        pwrite_all(fd, stage[:staged], self._stage_base)
        self._stage_base += staged
        self._stage_len = 0
        self._direct = False

    def _open_log(self, name: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        path = self.directory / name
        if self._direct:
            try:
                return os.open(path, flags | _O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                # This file system has no direct I/O: buffered writes from now on.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._direct = False
        return os.open(path, flags, 0o644)

    def _start_log(self) -> None:
        log_id = self._next_id
        name = entry_log_name(log_id)
        fd = self._open_log(name)
        if self._tracker is not None:
            self._tracker.created(name)
        header = _LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, 0, log_id)
        try:
            if self._direct:
                if self._stage is None:  # room for a write piece and a part page
                    self._stage = mmap.mmap(-1, whole_pages(self._bulk_piece_bytes) + 2 * _PAGE)
                self._stage[:len(header)] = header
                self._stage_base, self._stage_len = 0, len(header)
            else:
                pwrite_all(fd, header, 0)
        except BaseException:
            os.close(fd)
            raise
        self._next_id += 1
        self._cur_id = log_id
        self._cur_fd = fd
        self._cur_off = LOG_HEADER_SIZE
        self._cur_dropped = 0
        self._cur_kicked = 0
        with self._fd_lock:
            self._logs.append(log_id)

    def _finish_current(self) -> None:
        if self._direct:
            self._write_stage(final=True)
        sync_file(self._cur_fd, self._tracker, entry_log_name(self._cur_id), self._cur_off)
        if self._drop_pages and not self._direct:
            drop_cached_pages(self._cur_fd, self._cur_dropped, 0)  # 0: to the end
        os.close(self._cur_fd)
        self._cur_fd = -1

    # --- reading (any thread) --------------------------------------------------

    def _read_fd(self, log_id: int) -> int:
        fd = self._read_fds.get(log_id)
        if fd is not None:
            return fd
        with self._fd_lock:
            fd = self._read_fds.get(log_id)
            if fd is None:
                if self._closed:
                    raise StorageError("entry logger closed")
                try:
                    fd = os.open(self.directory / entry_log_name(log_id), os.O_RDONLY)
                except FileNotFoundError:
                    raise StorageError(f"entry log {log_id} is missing") from None
                try:
                    _check_log_header(log_id, os.pread(fd, LOG_HEADER_SIZE, 0))
                except BaseException:
                    os.close(fd)
                    raise
                self._read_fds[log_id] = fd
            return fd

    def read_run(self, log_id: int, ledger_id: int, run: list[tuple[int, int, int]]
                 ) -> list[tuple[int, bytes]]:
        """``(entry_id, entry)`` of records laid back to back in one log
        (``(entry_id, offset, length)`` as :meth:`LedgerIndex.locate_run`
        plans them), read with one ``pread``, each checked against the plan."""
        data = self._pread_run(log_id, run)
        view = memoryview(data)
        unpack = RECORD_HEAD.unpack_from
        first = run[0][1]
        out = []
        for entry_id, offset, length in run:
            pos = offset - first
            head = unpack(data, pos)
            if head != (length, ledger_id, entry_id):
                raise _bad_record(log_id, offset, head, ledger_id, entry_id, length)
            out.append((entry_id, bytes(view[pos + RECORD_PREFIX_SIZE:pos + RECORD_PREFIX_SIZE
                                              + length])))
        return out

    def read_records(self, log_id: int, ledger_id: int, run: list[tuple[int, int, int]]
                     ) -> bytes:
        """The same run as raw records, ``(u32 length | entry)*``: BP-62's
        entry list as is.  The first and the last record are checked against
        the plan (the index vouches for the ones between: it placed each
        right after the one before)."""
        data = self._pread_run(log_id, run)
        unpack = RECORD_HEAD.unpack_from
        first = run[0][1]
        for entry_id, offset, length in (run[0], run[-1]):
            head = unpack(data, offset - first)
            if head != (length, ledger_id, entry_id):
                raise _bad_record(log_id, offset, head, ledger_id, entry_id, length)
        return data

    def _pread_run(self, log_id: int, run: list[tuple[int, int, int]]) -> bytes:
        """The bytes of the run's records; an I/O error is a StorageError."""
        first = run[0][1]
        _last_id, last_offset, last_length = run[-1]
        if last_length < MIN_ENTRY_BYTES:
            raise StorageError(f"entry log {log_id} offset {last_offset}: index gives an entry "
                               f"of {last_length} bytes, shorter than its ids")
        try:
            return pread_exact(self._read_fd(log_id),
                               last_offset + RECORD_PREFIX_SIZE + last_length - first, first)
        except OSError as e:
            raise StorageError(f"reading entry log {log_id}: {e}") from e

    # --- housekeeping --------------------------------------------------------

    def remove(self, log_id: int) -> None:
        """Delete a log that is not the current one."""
        if log_id == self._cur_id:
            raise StorageError(f"entry log {log_id} is being written")
        name = entry_log_name(log_id)
        with self._fd_lock:
            fd = self._read_fds.pop(log_id, None)
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)
            if log_id in self._logs:
                self._logs.remove(log_id)
        if self._tracker is not None:
            self._tracker.removed(name)

    def close(self) -> None:
        with self._fd_lock:
            self._closed = True
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        if self._cur_fd >= 0:
            os.close(self._cur_fd)
            self._cur_fd = -1
        if self._stage is not None:
            with contextlib.suppress(BufferError):  # a view still held (a failed write's
                self._stage.close()                 # traceback): freed with the last one
            self._stage = None
        if self._tracker is not None:
            self._tracker.close()
