"""In-memory twins of a bookie's disk: journal, entry logs and index.

The bookie's REAL storage engine (:class:`~quire.bookie.storage.BookieStorage`,
with its write cache, fencing, replay and checkpoints) runs over these, opened
with :meth:`BookieStorage.open_over`.  They implement the engine's seams
(:mod:`quire.bookie.storage.seams`, whose docstrings are the contract) and
subclass none of the engine's classes; only the read cache is the engine's
own :class:`~quire.bookie.storage.ledger_storage.ReadCache`, which is memory
only.

* :class:`SimJournal` (an :class:`~quire.bookie.storage.seams.EngineJournal`)
  stands in for :class:`~quire.bookie.storage.Journal`:
  records are kept whole (type and body, the journal's own record bodies);
  appended records sit in a buffer, ``write_buffered`` moves them to the
  "file" (:attr:`SimDisk.journal`), ``sync`` makes the file durable
  (:attr:`SimDisk.journal_synced`).  A position (``JournalMark``) is
  ``(0, records before it)`` counted from the disk's first record ever.
* :class:`SimLedgerStorage` (an
  :class:`~quire.bookie.storage.seams.EngineLedgerStorage`) stands in for
  the entry logs and the LMDB index
  (:class:`~quire.bookie.storage.ledger_storage.LedgerStorage`): a
  checkpoint's ``flush`` writes entries, ledger states and the replay mark
  in one step that is durable at once (the real one fsyncs the entry log
  before one index transaction commits everything, so it is atomic too).

:class:`SimDisk` is what survives the process: :meth:`SimDisk.power_loss`
drops what was never synced, keeping a random prefix of the journal writes
that were (the page cache may have written some back; a torn last record
fails its checksum and ends replay, which is the same as losing it).

Not simulated: entry-log GC and compaction (``gc_entry_logs`` finds
nothing to remove, ``compact`` nothing to compact; the simulated bookie
never runs ``compact_entry_logs``),
disk usage.  Slow fsyncs are the committer's
(:class:`~quire.simulation.cluster.SimCommitter`): a sync here takes no
virtual time.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from quire.bookie.storage import JournalCounters, JournalMark, LedgerState
from quire.bookie.storage.compaction import CompactionStats, Exclusive
from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.entry_log import RECORD_PREFIX
from quire.bookie.storage.journal_format import REC_ADD_ENTRY, REC_HEADER, JournalRecord
from quire.bookie.storage.ledger_storage import EntryKey, ReadCache

_ADD_BODY_HEAD = struct.Struct(">QQ")
"""An ADD_ENTRY record body: ledger id, entry id, then the entry."""


class SimDisk:
    """One bookie's durable state, kept across its crashes and restarts."""

    def __init__(self) -> None:
        self.journal: list[tuple[int, bytes]] = []
        """Records written to the journal "file": (type, body)."""
        self.journal_base = 0
        """Position of ``journal[0]`` (records before it were removed)."""
        self.journal_synced = 0
        """Position up to which the journal is durable."""
        self.entries: dict[EntryKey, bytes] = {}
        self.states: dict[int, LedgerState] = {}
        self.mark: JournalMark | None = None
        self.running: bool | None = None
        self.formatted = False
        """False until an index was created on this disk."""
        self.cookie = False
        """The bookie's cookie is stamped on this disk (a new or emptied
        disk has none; the boot stamps it, after phase one if due)."""

    @property
    def journal_end(self) -> int:
        return self.journal_base + len(self.journal)

    def power_loss(self, rng: random.Random) -> int:
        """Drop every journal record not synced but a random prefix of them;
        returns how many were lost."""
        unsynced = self.journal_end - self.journal_synced
        kept = rng.randint(0, unsynced) if unsynced else 0
        lost = unsynced - kept
        if lost:
            del self.journal[len(self.journal) - lost:]
        self.journal_synced = self.journal_end
        return lost


class SimJournal:
    """The journal's twin over a :class:`SimDisk` (see the module docstring):
    an :class:`~quire.bookie.storage.seams.EngineJournal`."""

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk
        self._buffer: list[tuple[int, bytes]] = []
        self._start_pos = -1
        """Disk position of this run's seq 0 (set by ``start``)."""
        self._seq = 0
        self._written_seq = 0
        self._synced_seq = 0
        self._appended_bytes = 0
        self._written_bytes = 0
        self._fsyncs = 0
        self._closed = False

    def replay(self, from_mark: JournalMark | None) -> Iterator[JournalRecord]:
        disk = self._disk
        start = disk.journal_base if from_mark is None else max(from_mark.offset,
                                                                 disk.journal_base)
        for pos in range(start, disk.journal_end):
            rtype, body = disk.journal[pos - disk.journal_base]
            yield JournalRecord(rtype, body, JournalMark(0, pos + 1))

    def start(self) -> None:
        disk = self._disk
        if disk.mark is not None and disk.mark.offset > disk.journal_end:
            # A crash lost unsynced records a checkpoint had already covered:
            # continue after the mark (the real journal starts a new file).
            disk.journal, disk.journal_base = [], disk.mark.offset
            disk.journal_synced = disk.mark.offset
        self._start_pos = disk.journal_end

    def append(self, record: bytes | bytearray | memoryview) -> int:
        length, _crc = REC_HEADER.unpack_from(record, 0)
        data = bytes(record)
        self._buffer.append((data[REC_HEADER.size], data[REC_HEADER.size + 1:
                                                          REC_HEADER.size + length]))
        self._appended_bytes += len(data)
        self._seq += 1
        return self._seq

    def append_add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> int:
        return self.append_add_entries([(ledger_id, entry_id, entry)])

    def append_add_entries(self, adds: Sequence[tuple[int, int, bytes]]) -> int:
        for ledger_id, entry_id, entry in adds:
            body = _ADD_BODY_HEAD.pack(ledger_id, entry_id) + entry
            self._buffer.append((REC_ADD_ENTRY, body))
            self._appended_bytes += len(body)
        self._seq += len(adds)
        return self._seq

    def append_add_run(self, ledger_id: int, entry_ids: Sequence[int],
                       entries: Sequence[bytes]) -> int:
        return self.append_add_entries(
            [(ledger_id, entry_id, entry) for entry_id, entry in zip(entry_ids, entries,
                                                                      strict=True)])

    def mark(self) -> JournalMark:
        return JournalMark(0, self._start_pos + self._seq)

    @property
    def append_seq(self) -> int:
        return self._seq

    @property
    def written_seq(self) -> int:
        return self._written_seq

    @property
    def synced_seq(self) -> int:
        return self._synced_seq

    def write_buffered(self) -> int:
        if self._buffer and not self._closed:  # (an abandoned run writes nothing)
            self._written_bytes += sum(len(body) for _t, body in self._buffer)
            self._disk.journal += self._buffer
            self._buffer = []
            self._written_seq = self._seq
        return self._written_seq

    def sync(self) -> int:
        self.write_buffered()
        if self._synced_seq < self._written_seq and not self._closed:
            self._disk.journal_synced = self._disk.journal_end
            self._synced_seq = self._written_seq
            self._fsyncs += 1
        return self._synced_seq

    def remove_files_before(self, mark: JournalMark) -> list[int]:
        disk = self._disk
        cut = min(mark.offset, disk.journal_synced)
        if cut > disk.journal_base:
            del disk.journal[:cut - disk.journal_base]
            disk.journal_base = cut
        return []

    def counters(self) -> JournalCounters:
        return JournalCounters(
            appended_records=self._seq, appended_bytes=self._appended_bytes,
            written_bytes=self._written_bytes, write_calls=self._fsyncs,
            fsync_count=self._fsyncs, fsync_latency_total_s=0.0,
            synced_records=self._synced_seq, files_created=0, files_removed=0)

    def close(self) -> None:
        if not self._closed:
            self.sync()
            self._closed = True

    def abandon(self) -> None:
        self._buffer = []
        self._closed = True


class SimIndex:
    """The LMDB index's twin: an :class:`~quire.bookie.storage.seams.EngineIndex`."""

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk
        self.created = not disk.formatted
        disk.formatted = True

    def last_entry_id(self, ledger_id: int) -> int:
        return max((e for lid, e in self._disk.entries if lid == ledger_id), default=-1)

    def entry_ids(self, ledger_id: int, first: int, last: int) -> list[int]:
        return sorted(e for lid, e in self._disk.entries
                      if lid == ledger_id and first <= e <= last)

    def load_ledger_states(self) -> dict[int, LedgerState]:
        return dict(self._disk.states)

    def has_ledger_state(self, ledger_id: int) -> bool:
        return ledger_id in self._disk.states

    def journal_mark(self) -> JournalMark | None:
        return self._disk.mark

    def running_mark(self) -> bool | None:
        return self._disk.running

    def set_running_mark(self, journal_write_data: bool) -> None:
        self._disk.running = journal_write_data

    def clear_running_mark(self) -> None:
        self._disk.running = None

    def close(self) -> None:
        pass


class _NoEntryLogs:
    """The entry logger's place: the twin keeps entries in the disk's dict."""

    def log_ids(self) -> list[int]:
        return []


class _NoCompaction:
    """The compactor's place: without entry logs there is nothing to compact."""

    def compact(self, threshold: float, is_live: Callable[[int], bool],
                exclusive: Exclusive) -> CompactionStats:
        return CompactionStats()


class SimLedgerStorage:
    """Entry logs + index twin over a :class:`SimDisk` (module docstring):
    an :class:`~quire.bookie.storage.seams.EngineLedgerStorage`."""

    def __init__(self, disk: SimDisk, config: StorageConfig) -> None:
        self._disk = disk
        self.index = SimIndex(disk)
        self.entry_logger = _NoEntryLogs()
        self.compactor = _NoCompaction()
        self.read_cache = ReadCache(config.read_cache_max_bytes)

    def read(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self._disk.entries.get((ledger_id, entry_id))

    def read_records(self, ledger_id: int, start: int, max_count: int,
                     max_bytes: int) -> tuple[int, list[bytes]]:
        entries = self._disk.entries
        chunks: list[bytes] = []
        size = count = 0
        while count < max_count:
            data = entries.get((ledger_id, start + count))
            if data is None:
                break
            size += RECORD_PREFIX.size + len(data)
            if count and size > max_bytes:
                break
            chunks += (RECORD_PREFIX.pack(len(data)), data)
            count += 1
        return count, [b"".join(chunks)] if count else []

    def flush(self, entries: Mapping[EntryKey, bytes], states: Mapping[int, LedgerState],
              deletions: Iterable[int], mark: JournalMark) -> int:
        disk = self._disk
        disk.entries.update(entries)
        disk.states.update(states)
        for ledger_id in deletions:
            disk.states.pop(ledger_id, None)
            for key in [k for k in disk.entries if k[0] == ledger_id]:
                del disk.entries[key]
        disk.mark = mark
        return sum(map(len, entries.values()))

    def gc_entry_logs(self, is_live: Callable[[int], bool]) -> list[int]:
        return []

    def close(self) -> None:
        pass
