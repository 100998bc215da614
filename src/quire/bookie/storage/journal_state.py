"""The journal's state, which all its parts share.

:class:`~quire.bookie.storage.journal.Journal` is one object assembled from
parts, each a class over :class:`JournalState` in a module of its own:

* :mod:`~quire.bookie.storage.journal_files`: its files (replay, start, new
  and reused files, removal) and the writes and fsyncs of one file;
* :mod:`~quire.bookie.storage.journal_appends`: the append paths into the
  in-memory buffer;
* :mod:`~quire.bookie.storage.journal_writer`: writing the buffer to the
  files, and the sync.

They are parts of one object, not objects of their own, so that the add
path's appends and group commit's writes and syncs reach the buffer and the
files as attributes of ``self``, as one class did.  This module holds what
they share: the fields below, grouped by the side that changes them and
the lock that guards them, and what the journal directory holds at open.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from quire.bookie.storage.files import CAN_DROP_PAGES, RWF_DSYNC
from quire.bookie.storage.journal_format import FREE_SUFFIX, JOURNAL_SUFFIX, JournalMark
from quire.bookie.storage.sync_tracker import SyncTracker


@dataclass(frozen=True)
class SyncStats:
    """What one :meth:`~quire.bookie.storage.journal.Journal.sync` that did
    an fsync covered."""

    records: int
    bytes: int
    files: int
    latency_s: float
    durable_seq: int


def list_journal_files(directory: Path) -> list[int]:
    """File seqs of the journal files in ``directory``, ascending."""
    seqs = []
    for name in os.listdir(directory):
        if name.endswith(JOURNAL_SUFFIX) and len(name) == 16 + len(JOURNAL_SUFFIX):
            try:
                seqs.append(int(name[:16], 16))
            except ValueError:
                continue
    return sorted(seqs)


class JournalState:
    """The state of :class:`~quire.bookie.storage.journal.Journal` (see the
    module docstring); its parts subclass this."""

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

    def _find_free_files(self) -> list[Path]:
        """The files a previous run kept for reuse, oldest first; any beyond
        ``reuse_files_max`` are deleted."""
        free = sorted(p for p in self.directory.glob("*" + FREE_SUFFIX) if p.is_file())
        keep = free[len(free) - self._reuse_max:] if self._reuse_max > 0 else []
        for path in free[:len(free) - len(keep)]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return keep
