"""Settings of the bookie storage engine (one frozen dataclass).

Directory layout
----------------
Only the **first** of ``journal_dirs`` and the **first** of ``ledger_dirs``
are used (several disks per role are not supported yet; giving more than one
is a :class:`~quire.errors.ConfigError` rather than a silently unused disk).
Inside them the engine uses its own subdirectories, so a journal dir and a
ledger dir may be the same directory (single-disk layout)::

    <journal_dir>/journal/<seq:016x>.jnl      journal files (preallocated)
    <journal_dir>/journal/LOCK                 flock: one process per journal
    <ledger_dir>/ledgers/entrylog/<id:08x>.log entry logs
    <ledger_dir>/ledgers/index/                LMDB environment (index, states, mark)
    <ledger_dir>/ledgers/LOCK                  flock: one process per ledger dir

With ``power_loss_tracking`` each of ``journal/`` and ``ledgers/entrylog/``
also holds a ``.quire-synced`` sidecar (see :mod:`quire.bookie.storage.sync_tracker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quire.errors import ConfigError

_MiB = 1024 * 1024
_GiB = 1024 * _MiB


@dataclass(frozen=True)
class StorageConfig:
    journal_dirs: tuple[Path, ...]
    """Journal directories; only the first is used."""
    ledger_dirs: tuple[Path, ...]
    """Ledger (entry log + index) directories; only the first is used."""
    journal_file_size_bytes: int = 64 * _MiB
    """Size each journal file is preallocated to (``posix_fallocate``); the
    journal rolls to a new file when the next record does not fit."""
    journal_max_group_bytes: int = 4 * _MiB
    """Buffered journal bytes above which :attr:`Journal.group_full` turns
    true (the server should write/sync rather than keep grouping)."""
    journal_write_data: bool = True
    """BP-46: false skips the journal for add requests: an add is answered
    once its entry is in the write cache, without an fsync, and counts as
    synced (BP-14 SYNC, LastAddSynced) only once a checkpoint wrote it to
    fsynced entry logs and the index.  A crash or power loss loses the
    entries answered since the last checkpoint.  Master keys, fences,
    explicit LACs, BP-14 cursors and recovery adds still go through the
    journal, which is still replayed at start.  The engine records it in its
    running mark, so a crash of a run without the journal is known at the
    next start (see :mod:`quire.bookie.storage.shutdown`)."""
    journal_preallocate: bool = True
    """Preallocate journal files (turn off only on filesystems without
    ``fallocate`` support)."""
    journal_reuse_files_max: int = 4
    """How many journal files wholly before the replay mark are kept to be
    reused (renamed) as later files instead of deleted, as BookKeeper's
    ``journalReuseFiles`` does; 0 deletes them.  A reused file's blocks are
    already written, so its fsyncs have no extent conversion to commit.
    Costs up to this many times ``journal_file_size_bytes`` of disk."""
    journal_remove_pages_from_cache: bool = True
    """After each journal fsync, advise the kernel to drop the synced journal
    pages from the page cache (BookKeeper's ``journalRemovePagesFromCache``):
    the journal is only read back at replay, and the freed pages serve the
    next writes instead of the page cache growing with journal data.  BP-14
    volatile writes, never fsynced by themselves, are handed to writeback
    every MiB and dropped once written."""
    write_cache_max_bytes: int = 256 * _MiB
    """Write cache size above which :attr:`BookieStorage.checkpoint_due` is true.
    It should hold more than a checkpoint interval of adds: while a
    checkpoint runs, the next cache fills, and once that one is full every
    connection stops reading until the checkpoint is done.  At 64 MiB one
    bookie taking 80,000 1 KiB adds a second paused twice in 8 s."""
    write_cache_reject_ratio: float = 2.0
    """Adds are refused with TOO_MANY_REQUESTS while the write cache holds more
    than ``ratio * write_cache_max_bytes`` (a checkpoint cannot keep up);
    ``0`` disables the limit.  The cache being checkpointed is not counted, so
    entry memory peaks near ``(ratio + 1) * write_cache_max_bytes``."""
    read_cache_max_bytes: int = 32 * _MiB
    """LRU cache (by entry bytes) of entries read back from entry logs; 0 disables it."""
    read_ahead_bytes: int = 256 * 1024
    """A read that misses the caches also reads the ledger's following
    entries from the same entry log, up to this many bytes, into the read
    cache (one ``pread``; 0 reads the one entry)."""
    entry_log_max_bytes: int = 512 * _MiB
    """An entry log is closed and a new one started once it would grow past this."""
    entry_log_write_buffer_bytes: int = 256 * 1024
    """Checkpoints write entry logs in pieces of about this size, each one
    write to the device, while they keep up with the adds.  Small enough that
    a journal write arriving during a checkpoint waits behind little: where
    the journal shares the disk with the entry logs (or with other bookies),
    each journal write (a write and a device cache flush) queued behind 1 MiB
    pieces and flushed them with its own, and took 20-50 ms during every
    checkpoint against 1-2 ms between them; with 256 KiB pieces it stays
    under 10 ms (``docs/performance.md``, "Checkpoints and the journal's
    tail")."""
    entry_log_bulk_write_buffer_bytes: int = 1 * _MiB
    """... and in pieces of this size once a checkpoint took more than four
    fifths of the time since the one before (the checkpoints are falling
    behind, the write cache fills and adds will wait): larger writes move
    more bytes per second through a busy device.  With small pieces only, a disk kept full
    by adds (blocks of 100 KiB at 60-70 MB/s a bookie, three bookies on one
    disk) fell behind until adds stalled for 3-4 s."""
    entry_log_remove_pages_from_cache: bool = True
    """After each checkpoint's fsync, advise the kernel to drop the entry-log
    pages it wrote (the partly written last page stays), as BookKeeper's
    direct-I/O entry logger never caches them.  Recent entries are read from
    the write cache until their checkpoint; after it, from the read cache
    and the disk, where the kernel's read-ahead serves sequential reads.  The
    page cache then does not grow by every byte checkpointed, and the next
    checkpoint fills pages just freed rather than new ones.  Off: written
    pages stay cached until the kernel evicts them."""
    entry_log_direct_io: bool = True
    """Write entry logs with ``O_DIRECT`` (BookKeeper's direct-I/O entry
    logger, BP-47), through a page-aligned staging buffer: a checkpoint's
    bytes go from that buffer to the disk without passing through the page
    cache, so no page-cache page is allocated, filled and written back for
    them (on this project's VMs a new page-cache page costs 1.5-3.7 us; see
    ARCHITECTURE.md).  Where the file system refuses ``O_DIRECT`` (tmpfs on
    older kernels), at open or at the first write, the logs are written
    through the page cache, as with this off (a warning is logged for a
    refused write).  Off: ``entry_log_remove_pages_from_cache`` applies."""
    compaction_chunk_bytes: int = 4 * _MiB
    """Compaction copies a log's live entries in pieces of about this many
    bytes, each written and fsynced under the checkpoint lock (a checkpoint
    waits for at most one piece; adds never wait)."""
    index_map_size_bytes: int = 64 * _GiB
    """LMDB map size (address space, sparse on disk)."""
    power_loss_tracking: bool = False
    """Test seam: record every fsynced file length so that
    :func:`quire.testing.power_loss.emulate_power_loss` can drop the rest."""
    test_skip_journal_fsync: bool = False
    """Test seam, never for production: the journal skips every fsync (and so
    records none) yet ``sync()`` still reports records durable.  Proves that
    the power-loss emulation catches a bookie acknowledging before fsync."""

    test_kill_during_compaction: str = ""
    """Test seam, never for production: ``"copied"`` or ``"committed"``
    makes the bookie process kill itself (``SIGKILL``) at that step of its
    first entry-log compaction (see :mod:`quire.bookie.storage.compaction`)."""

    def __post_init__(self) -> None:
        if not self.journal_dirs:
            raise ConfigError("journal_dirs: at least one directory is required")
        if not self.ledger_dirs:
            raise ConfigError("ledger_dirs: at least one directory is required")
        if len(self.journal_dirs) > 1 or len(self.ledger_dirs) > 1:
            raise ConfigError(
                "the storage engine supports exactly one journal dir and one ledger dir "
                f"(got {len(self.journal_dirs)} and {len(self.ledger_dirs)})")
        if self.journal_file_size_bytes < 4096:
            raise ConfigError("journal_file_size_bytes must be at least 4096")
        if self.journal_max_group_bytes <= 0:
            raise ConfigError("journal_max_group_bytes must be positive")
        if self.journal_reuse_files_max < 0:
            raise ConfigError("journal_reuse_files_max must be 0 or more")
        if self.write_cache_max_bytes <= 0:
            raise ConfigError("write_cache_max_bytes must be positive")
        if self.write_cache_reject_ratio < 0 or (
                0 < self.write_cache_reject_ratio < 1):
            raise ConfigError("write_cache_reject_ratio must be 0 (off) or at least 1")
        if self.read_ahead_bytes < 0:
            raise ConfigError("read_ahead_bytes must not be negative")
        if self.read_cache_max_bytes < 0:
            raise ConfigError("read_cache_max_bytes must not be negative")
        if self.entry_log_max_bytes < 4096:
            raise ConfigError("entry_log_max_bytes must be at least 4096")
        if self.entry_log_write_buffer_bytes <= 0:
            raise ConfigError("entry_log_write_buffer_bytes must be positive")
        if self.entry_log_bulk_write_buffer_bytes < self.entry_log_write_buffer_bytes:
            raise ConfigError("entry_log_bulk_write_buffer_bytes must be at least "
                              "entry_log_write_buffer_bytes")
        if self.compaction_chunk_bytes <= 0:
            raise ConfigError("compaction_chunk_bytes must be positive")
        if self.test_kill_during_compaction not in ("", "copied", "committed"):
            raise ConfigError("test_kill_during_compaction must be '', 'copied' or 'committed'")
        if self.index_map_size_bytes < 1 * _MiB:
            raise ConfigError("index_map_size_bytes must be at least 1 MiB")

    @property
    def journal_dir(self) -> Path:
        """``<journal_dirs[0]>/journal``."""
        return Path(self.journal_dirs[0]) / "journal"

    @property
    def ledgers_dir(self) -> Path:
        """``<ledger_dirs[0]>/ledgers``."""
        return Path(self.ledger_dirs[0]) / "ledgers"

    @property
    def entry_log_dir(self) -> Path:
        return self.ledgers_dir / "entrylog"

    @property
    def index_dir(self) -> Path:
        return self.ledgers_dir / "index"
