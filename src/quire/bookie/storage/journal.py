"""The bookie journal: an append-only, preallocated, checksummed redo log.

Every add and every ledger state change is appended here first; group
commit (in the server) decides when to :meth:`Journal.sync`, so that many
appends share one ``fdatasync``.  The journal is replayed at start-up from
the checkpoint's *replay mark*; files wholly before the mark are removed
(or kept to be reused, see "Reused files").

Files
-----
``journal/<file seq:016x>.jnl``, file seqs start at 1 and only grow.  A new
file is started at every start (an old file is never appended to again) and
whenever the next record does not fit in the current one.  Each file is
preallocated to ``journal_file_size_bytes`` and starts with a 64-byte
header, big-endian::

    offset  size  field
    0       4     magic b"QJNL"
    4       2     format version = 2 (1 is still read)
    6       2     reserved (0)
    8       8     file seq (uint64)
    16      8     prev file seq: the file this one continues (uint64)
    24      8     prev end offset: where valid records of that file ended
    32      4     crc32c of bytes 0..31
    36      28    reserved (0)

The (prev file seq, prev end offset) link lets replay tell a clean roll from
a hole: after a power loss the tail of file N may be gone while a later file
survived; records after such a hole were never acknowledged as durable
(``sync`` fsyncs files in order), so replay stops at the hole and
:meth:`Journal.start` sets the later files aside (renamed ``*.discarded``).

Reused files.  A file wholly before the replay mark is not deleted but kept
(renamed ``<seq>.jnl.free``, at most ``reuse_files_max`` of them) and renamed
again to become a later file, as BookKeeper's ``journalReuseFiles`` does.
Its blocks are then already written: a ``posix_fallocate``d file's blocks
are *unwritten extents*, and the first write to each makes the next
``fdatasync`` commit a metadata change as well, which doubled the time of a
journal fsync here.  A reused file still holds its old records after the
new end of data, so from format version 2 every record's crc is XORed with
a *salt* of the file seq it is written in (``crc32c`` of the seq, 8 bytes
big-endian): an old record, written under another seq, fails the check and
ends replay like a torn tail.  Version 1 files have salt 0.

Each write of a preallocated file is padded with zeros to the next page
boundary (:func:`~quire.bookie.storage.files.pwrite_all`), so the kernel
never reads a partly covered page of a reused file back first; the next
write overwrites the padding, and zeros read as the end of data.

Records
-------
Records follow the header back to back, never split across files::

    offset  size  field
    0       4     length L of type + body (uint32, >= 1; 0 = end of data)
    4       4     crc32c of type + body, XOR the file's salt (uint32)
    8       1     record type
    9       L-1   body

Bodies (integers big-endian, ids unsigned 64-bit):

=================  ====  ===================================================
type               code  body
=================  ====  ===================================================
ADD_ENTRY          1     ledger_id u64, entry_id u64, entry bytes (the rest)
SET_MASTER_KEY     2     ledger_id u64, master key (the rest; 20 bytes)
FENCE              3     ledger_id u64
EXPLICIT_LAC       4     ledger_id u64, lac i64
LEDGER_STATE       5     ledger_id u64, encoded LedgerState (see ``state``)
DELETE_LEDGER      6     ledger_id u64
=================  ====  ===================================================

Replay of a file stops at the first record whose length is 0, runs past the
end of the file, or whose crc does not match (a torn or never-written tail).

Positions
---------
A :class:`JournalMark` ``(file_seq, offset)`` is a position in that file.
Positions are assigned when a record is *appended* (the decision to roll is
taken at append time too), so :meth:`Journal.mark` is exact even for records
still in the in-memory buffer.  Sequence numbers returned by
:meth:`Journal.append` count records appended by this process (1, 2, ...);
they are not persisted and restart at 1 after every open.

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

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import add, itemgetter, xor
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from quire.bookie.storage.files import (
    CAN_DROP_PAGES,
    RWF_DSYNC,
    drop_cached_pages,
    fsync_dir,
    pwrite_all,
    sync_file,
    whole_pages,
    write_synced,
)
from quire.bookie.storage.sync_tracker import SyncTracker
from quire.errors import StorageError

log = logging.getLogger(__name__)

REC_ADD_ENTRY = 1
REC_SET_MASTER_KEY = 2
REC_FENCE = 3
REC_EXPLICIT_LAC = 4
REC_LEDGER_STATE = 5
REC_DELETE_LEDGER = 6

FILE_MAGIC = b"QJNL"
FILE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
FILE_HEADER_SIZE = 64
_FILE_HEADER = struct.Struct(">4sHHQQQ")  # 32 bytes, then crc u32, then zeros
_U32 = struct.Struct(">I")
REC_HEADER = struct.Struct(">II")  # length, crc
REC_HEADER_SIZE = REC_HEADER.size
_ADD_HEAD = struct.Struct(">BQQ")  # type, ledger, entry (covered by the crc)
_ADD_RECORD_OVERHEAD = REC_HEADER_SIZE + _ADD_HEAD.size
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_LEDGER = struct.Struct(">Q")
_LEDGER_LAC = struct.Struct(">Qq")
_LEDGER_ENTRY = struct.Struct(">QQ")
_TYPE = struct.Struct(">B")
_SUFFIX = ".jnl"
_FREE_SUFFIX = ".jnl.free"
MAX_RECORD_BYTES = 0xFFFFFFFF
_DROP_MIN_BYTES = 1 << 20


class JournalMark(NamedTuple):
    """A position in the journal: ``offset`` bytes into file ``file_seq``."""

    file_seq: int
    offset: int


class JournalRecord(NamedTuple):
    """One replayed record; ``end`` is the position just after it."""

    rtype: int
    body: bytes
    end: JournalMark


@dataclass(frozen=True)
class SyncStats:
    """What one :meth:`Journal.sync` that did an fsync covered."""

    records: int
    bytes: int
    files: int
    latency_s: float
    durable_seq: int


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


# --- record codecs ---------------------------------------------------------


def encode_record(rtype: int, body: bytes | bytearray | memoryview = b"") -> bytes:
    """Frame one record: ``[len][crc][type][body]``."""
    type_byte = _TYPE.pack(rtype)
    length = 1 + len(body)
    if length > MAX_RECORD_BYTES:
        raise ValueError("journal record too large")
    return REC_HEADER.pack(length, crc32c(body, crc32c(type_byte))) + type_byte + bytes(body)


def _add_records(ledger_ids: Sequence[int], entry_ids: Sequence[int],
                 entries: Sequence[bytes], salt: int) -> bytes:
    """ADD_ENTRY records for one file (crcs XORed with its ``salt``), back to
    back, built by C-level ``map`` steps: the one place their bytes are laid
    out for appends (:func:`encode_record` frames the other types)."""
    heads = list(map(_ADD_HEAD.pack, repeat(REC_ADD_ENTRY), ledger_ids, entry_ids))
    crcs = map(xor, map(crc32c, entries, map(crc32c, heads)), repeat(salt))
    records = map(REC_HEADER.pack, map(add, repeat(_ADD_HEAD.size), map(len, entries)), crcs)
    return b"".join(chain.from_iterable(zip(records, heads, entries, strict=True)))


def encode_set_master_key(ledger_id: int, master_key: bytes) -> bytes:
    return encode_record(REC_SET_MASTER_KEY, _LEDGER.pack(ledger_id) + master_key)


def encode_fence(ledger_id: int) -> bytes:
    return encode_record(REC_FENCE, _LEDGER.pack(ledger_id))


def encode_explicit_lac(ledger_id: int, lac: int) -> bytes:
    return encode_record(REC_EXPLICIT_LAC, _LEDGER_LAC.pack(ledger_id, lac))


def encode_ledger_state(ledger_id: int, encoded_state: bytes) -> bytes:
    return encode_record(REC_LEDGER_STATE, _LEDGER.pack(ledger_id) + encoded_state)


def encode_delete_ledger(ledger_id: int) -> bytes:
    return encode_record(REC_DELETE_LEDGER, _LEDGER.pack(ledger_id))


def decode_ledger_id(body: bytes) -> int:
    """The ledger id every record body starts with."""
    return int(_LEDGER.unpack_from(body, 0)[0])


def decode_add_entry(body: bytes) -> tuple[int, int, bytes]:
    """``(ledger_id, entry_id, entry)`` of an ADD_ENTRY body."""
    ledger_id, entry_id = _LEDGER_ENTRY.unpack_from(body, 0)
    return ledger_id, entry_id, body[16:]


def decode_explicit_lac(body: bytes) -> tuple[int, int]:
    ledger_id, lac = _LEDGER_LAC.unpack_from(body, 0)
    return int(ledger_id), int(lac)


def _encode_file_header(file_seq: int, prev: JournalMark) -> bytes:
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0, file_seq, prev.file_seq, prev.offset)
    out = head + _U32.pack(crc32c(head))
    return out + bytes(FILE_HEADER_SIZE - len(out))


def file_salt(file_seq: int, version: int = FILE_VERSION) -> int:
    """What record crcs of file ``file_seq`` are XORed with (see "Reused files")."""
    return crc32c(_LEDGER.pack(file_seq)) if version >= 2 else 0


def _decode_file_header(data: bytes | mmap.mmap) -> tuple[int, JournalMark, int] | None:
    """``(file_seq, prev, salt)`` or None if the header is missing or corrupt."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    head = bytes(data[:_FILE_HEADER.size])
    (crc,) = _U32.unpack_from(data, _FILE_HEADER.size)
    if crc != crc32c(head):
        return None
    magic, version, _reserved, file_seq, prev_seq, prev_off = _FILE_HEADER.unpack(head)
    if magic != FILE_MAGIC or version not in _READABLE_VERSIONS:
        return None
    return file_seq, JournalMark(prev_seq, prev_off), file_salt(file_seq, version)


def journal_file_name(file_seq: int) -> str:
    return f"{file_seq:016x}{_SUFFIX}"


def list_journal_files(directory: Path) -> list[int]:
    """File seqs of the journal files in ``directory``, ascending."""
    seqs = []
    for name in os.listdir(directory):
        if name.endswith(_SUFFIX) and len(name) == 16 + len(_SUFFIX):
            try:
                seqs.append(int(name[:16], 16))
            except ValueError:
                continue
    return sorted(seqs)


def _scan_records(data: mmap.mmap | bytes, start: int,
                  salt: int) -> Iterator[tuple[int, bytes, int]]:
    """``(type, body, end offset)`` for each valid record from ``start``."""
    size = len(data)
    pos = start
    header = REC_HEADER
    while pos + REC_HEADER_SIZE < size:
        length, crc = header.unpack_from(data, pos)
        if length == 0:
            return
        end = pos + REC_HEADER_SIZE + length
        if end > size:
            return
        payload = data[pos + REC_HEADER_SIZE:end]
        if crc32c(payload) ^ salt != crc:
            return
        yield payload[0], payload[1:], end
        pos = end


class Journal:
    """See the module docstring.  Use :meth:`open`, then :meth:`replay`
    (optional), then :meth:`start` before appending."""

    def __init__(self, directory: Path, *, file_size_bytes: int, max_group_bytes: int,
                 preallocate: bool = True, tracker: SyncTracker | None = None,
                 skip_fsync_for_testing: bool = False,
                 remove_pages_from_cache: bool = False, reuse_files_max: int = 0,
                 dsync_writes: bool = False) -> None:
        self.directory = Path(directory)
        self._dsync_writes = dsync_writes and RWF_DSYNC != 0 and not skip_fsync_for_testing
        """Whether :meth:`sync` may write with ``RWF_DSYNC`` (turned off if
        the first file's header write is refused with it)."""
        self._reuse_max = reuse_files_max
        self._free = self._find_free_files()
        """Files kept for reuse, oldest first (see "Reused files")."""
        self._drop_pages = remove_pages_from_cache and CAN_DROP_PAGES
        self._dropped: dict[int, int] = {}  # file seq -> offset up to which pages were dropped
        """Sync side: page-cache drop position per file (see _drop_synced_pages)."""
        self._skip_fsync = skip_fsync_for_testing
        self._file_size = file_size_bytes
        self._max_group_bytes = max_group_bytes
        self._preallocate = preallocate
        self._tracker = tracker
        self._files = list_journal_files(self.directory)
        self._replay_end: JournalMark | None = None
        self._replayed_files: list[tuple[int, int]] = []  # (file seq, valid end)
        self._started = False
        self._closed = False
        self._failure: BaseException | None = None
        # Append side (changed holding _append_lock and _lock; read under _lock).
        self._lock = threading.Lock()
        self._append_lock = threading.Lock()
        """Serializes appenders (the tail position, salt and rolls); ``_lock``
        guards the buffer the fsync thread swaps."""
        self._buf = bytearray()
        self._rolls: list[tuple[int, int, JournalMark]] = []  # (buffer offset, new seq, prev)
        self._seq = 0
        self._tail_file = 0
        self._tail_off = 0
        self._tail_salt = 0
        self._appended_bytes = 0
        # Write side (guarded by _write_lock).
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._written_seq = 0
        self._cur_seq = 0
        self._cur_fd = -1
        self._cur_off = 0
        self._open_fds: dict[int, int] = {}
        self._dirty: dict[int, int] = {}  # file seq -> written length not yet synced
        self._dir_dirty = False
        self._written_bytes = 0
        self._write_calls = 0
        self._recycle_file = 0
        self._recycle_from = 0
        self._recycle_kicked = 0
        """Write side: the file and stretches :meth:`_recycle_written_pages` works on."""
        self._files_created = 0
        self._files_removed = 0
        # Sync side (guarded by _sync_lock).
        self._synced_seq = 0
        self._synced_bytes = 0
        self._fsync_count = 0
        self._fsync_latency_total = 0.0
        self.last_sync_stats: SyncStats | None = None

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

    def _find_free_files(self) -> list[Path]:
        """The files a previous run kept for reuse, oldest first; any beyond
        ``reuse_files_max`` are deleted."""
        free = sorted(p for p in self.directory.glob("*" + _FREE_SUFFIX) if p.is_file())
        keep = free[len(free) - self._reuse_max:] if self._reuse_max > 0 else []
        for path in free[:len(free) - len(keep)]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return keep

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
                header = _decode_file_header(data)
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
                for rtype, body, rec_end in _scan_records(data, start, header[2]):
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
            self._write_header(fd, name, _encode_file_header(file_seq, prev))
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

    # --- append (event loop) -------------------------------------------------

    def append(self, record: bytes | bytearray | memoryview) -> int:
        """Buffer one framed record (see :func:`encode_record`); return its seq."""
        n = len(record)
        with self._append_lock, self._lock:
            if not self._started:
                raise StorageError("journal not started")
            if self._tail_off + n > self._file_size and self._tail_off > FILE_HEADER_SIZE:
                self._roll_locked()
            buf = self._buf
            at = len(buf)
            buf += record
            if self._tail_salt:
                (crc,) = _U32.unpack_from(buf, at + 4)
                _U32.pack_into(buf, at + 4, crc ^ self._tail_salt)
            self._tail_off += n
            self._appended_bytes += n
            self._seq += 1
            return self._seq

    def append_add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> int:
        """Buffer one ADD_ENTRY record without building it separately first
        (:meth:`append_add_entries` with one add); return its seq."""
        return self.append_add_entries([(ledger_id, entry_id, entry)])

    def append_add_entries(self, adds: Sequence[tuple[int, int, bytes]]) -> int:
        """:meth:`append_add_entry` for each ``(ledger_id, entry_id, entry)``
        (the server's batched add path); their seqs are consecutive, and the
        last one is returned."""
        return self._append_adds(list(map(_FIRST, adds)), list(map(_SECOND, adds)),
                                 list(map(_THIRD, adds)))

    def append_add_run(self, ledger_id: int, entry_ids: Sequence[int],
                       entries: Sequence[bytes]) -> int:
        """:meth:`append_add_entries` for adds of one ledger, given as columns."""
        return self._append_adds([ledger_id] * len(entries), entry_ids, entries)

    def _append_adds(self, ledger_ids: Sequence[int], entry_ids: Sequence[int],
                     entries: Sequence[bytes]) -> int:
        """Buffer one ADD_ENTRY record per position of the three columns;
        return the last seq.

        The records between two file rolls are built in one go
        (:func:`_add_records`, no bytecode per record); only a batch that
        crosses the end of the file walks its record sizes one by one to
        place the roll.  They are built under the append lock only, then
        published under the buffer lock in one copy: the fsync thread takes
        the buffer lock to swap the buffer, and waiting there behind a whole
        batch cost it one more wait for the GIL."""
        sizes = list(map(add, repeat(_ADD_RECORD_OVERHEAD), map(len, entries)))
        with self._append_lock:
            with self._lock:
                if not self._started:
                    raise StorageError("journal not started")
                tail_file, tail, salt = self._tail_file, self._tail_off, self._tail_salt
            limit = self._file_size
            cuts: list[tuple[int, int, JournalMark]] = []  # (first add of a file, its seq, prev)
            total = sum(sizes)
            if tail + total > limit:
                for i, n in enumerate(sizes):
                    if tail + n > limit and tail > FILE_HEADER_SIZE:  # as _roll_locked does
                        cuts.append((i, tail_file + 1, JournalMark(tail_file, tail)))
                        tail_file, tail = tail_file + 1, FILE_HEADER_SIZE
                    tail += n
            else:
                tail += total
            parts: list[bytes] = []
            rolls: list[tuple[int, int, JournalMark]] = []  # (offset in the batch, seq, prev)
            built = first = 0
            for cut, seq, prev in cuts:
                parts.append(_add_records(ledger_ids[first:cut], entry_ids[first:cut],
                                          entries[first:cut], salt))
                built += len(parts[-1])
                rolls.append((built, seq, prev))
                first, salt = cut, file_salt(seq)
            parts.append(_add_records(ledger_ids[first:], entry_ids[first:], entries[first:], salt))
            data = b"".join(parts)
            with self._lock:
                base = len(self._buf)
                self._rolls += [(base + at, seq, prev) for at, seq, prev in rolls]
                self._buf += data
                self._tail_file, self._tail_off, self._tail_salt = tail_file, tail, salt
                self._appended_bytes += len(data)
                self._seq += len(entries)
                return self._seq

    def _roll_locked(self) -> None:
        prev = JournalMark(self._tail_file, self._tail_off)
        self._tail_file += 1
        self._tail_off = FILE_HEADER_SIZE
        self._tail_salt = file_salt(self._tail_file)
        self._rolls.append((len(self._buf), self._tail_file, prev))

    def mark(self) -> JournalMark:
        """The position just after the last appended record (buffered or not)."""
        with self._lock:
            return JournalMark(self._tail_file, self._tail_off)

    @property
    def append_seq(self) -> int:
        """Seq of the last appended record (0 if none)."""
        return self._seq

    @property
    def written_seq(self) -> int:
        """Highest seq written to the file (page cache)."""
        return self._written_seq

    @property
    def synced_seq(self) -> int:
        """Highest seq made durable by :meth:`sync`."""
        return self._synced_seq

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    @property
    def group_full(self) -> bool:
        """True once the buffer holds ``journal_max_group_bytes`` or more."""
        return len(self._buf) >= self._max_group_bytes

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
                free = path.with_name(path.name[:-len(_SUFFIX)] + _FREE_SUFFIX)
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
