"""The storage engine's seams: what :class:`~quire.bookie.storage.BookieStorage`
(its parts, the ``engine_*`` modules; and group commit, the add path,
services, repair) calls on its journal and on its ledger storage (entry
logs + index + read cache).

Each is a :class:`typing.Protocol`, checked only by mypy (no ``isinstance``,
nothing at run time, so the hot paths are the engine classes' own calls);
the engine's class, then the simulation's twin, of each:

* :class:`EngineJournal` (and its part :class:`SyncableJournal`, all group
  commit needs): :class:`~quire.bookie.storage.journal.Journal` (its parts
  in the ``journal_*`` modules), ``SimJournal``;
* :class:`EngineLedgerStorage`:
  :class:`~quire.bookie.storage.ledger_storage.LedgerStorage`,
  ``SimLedgerStorage``; its parts :class:`EngineIndex`
  (:class:`~quire.bookie.storage.index.LedgerIndex`, ``SimIndex``),
  :class:`EntryLogList` (:class:`~quire.bookie.storage.entry_log.EntryLogger`)
  and :class:`EntryLogCompactor`
  (:class:`~quire.bookie.storage.compaction.Compactor`; the twin has
  neither entry logs nor anything to compact)

(the twins live in :mod:`quire.simulation.disk` and subclass none of these
classes).  Sequence numbers ("seqs") count the records appended by this
process, 1, 2, ...; they are not persisted.  A *mark*
(:class:`~quire.bookie.storage.journal_format.JournalMark`) is a position in the
journal that survives restarts: the checkpoint commits one as the replay
start.  Errors are :class:`~quire.errors.StorageError` (or an ``OSError``
the engine wraps in one); after a write or sync error the journal is failed
and every later write or sync raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from quire.bookie.storage.compaction import CompactionStats, Exclusive
from quire.bookie.storage.journal import JournalCounters
from quire.bookie.storage.journal_format import JournalMark, JournalRecord
from quire.bookie.storage.ledger_storage import EntryKey, ReadCache
from quire.bookie.storage.state import LedgerState


class SyncableJournal(Protocol):
    """What group commit needs of the journal (see the storage engine)."""

    def sync(self) -> int:
        """Write and fsync everything appended so far; return the highest
        sequence number now durable.  Called on one thread only (the
        ``quire-fsync`` thread, or the loop when syncs are fast)."""
        ...


class EngineJournal(SyncableJournal, Protocol):
    """The bookie's redo log as the engine uses it.

    Lifecycle: opened (not started) -> :meth:`replay` from the committed
    mark, run to its end -> :meth:`start` -> appends, writes, syncs,
    :meth:`remove_files_before` -> :meth:`close` (or :meth:`abandon`).

    Durability: an appended record sits in a memory buffer (lost by any
    crash); :meth:`write_buffered` puts it in the file (survives ``kill -9``,
    not a power loss); :meth:`sync` makes it durable (survives a power
    loss).  Records become durable in append order: a synced seq covers
    every lower one.  After a power loss replay yields a prefix of what was
    written: everything synced, then possibly some unsynced records (a torn
    one ends replay).

    Threads: appends, :meth:`mark`, :attr:`append_seq` and
    :meth:`write_buffered` on any thread (the loop); :meth:`sync` on one
    thread (the fsync thread or the loop); :meth:`remove_files_before` and
    :meth:`close` on the checkpoint thread; :meth:`replay`, :meth:`start`
    and :meth:`abandon` race with nothing.  None of the loop's calls waits
    for an fsync."""

    def replay(self, from_mark: JournalMark | None) -> Iterator[JournalRecord]:
        """Every valid record at or after ``from_mark`` (None: from the
        oldest kept), in append order, each with the mark just after it;
        stops at the first torn or missing record.  Before :meth:`start`."""
        ...

    def start(self) -> None:
        """Make what replay found durable and open the journal for appends
        after it (what replay did not reach is never replayed again)."""
        ...

    def append(self, record: bytes | bytearray | memoryview) -> int:
        """Buffer one framed record (``journal.encode_record``); return its seq."""
        ...

    def append_add_entry(self, ledger_id: int, entry_id: int, entry: bytes) -> int:
        """Buffer one ADD_ENTRY record; return its seq."""
        ...

    def append_add_entries(self, adds: Sequence[tuple[int, int, bytes]]) -> int:
        """Buffer an ADD_ENTRY record per ``(ledger_id, entry_id, entry)``,
        with consecutive seqs; return the last."""
        ...

    def append_add_run(self, ledger_id: int, entry_ids: Sequence[int],
                       entries: Sequence[bytes]) -> int:
        """:meth:`append_add_entries` for one ledger's adds given as columns."""
        ...

    def mark(self) -> JournalMark:
        """The position just after the last appended record (buffered or
        not): replay from it yields only records appended later."""
        ...

    @property
    def append_seq(self) -> int:
        """Seq of the last appended record (0 if none)."""
        ...

    def write_buffered(self) -> int:
        """Write the buffer to the file, no fsync; return the highest seq
        now written (BP-14 volatile adds are answered at this point)."""
        ...

    def remove_files_before(self, mark: JournalMark) -> list[int]:
        """Drop what lies wholly before ``mark`` (never anything unsynced:
        a committed checkpoint covers it); return the removed file seqs."""
        ...

    def counters(self) -> JournalCounters:
        """Running totals for metrics (appended/written bytes, fsyncs...)."""
        ...

    def close(self) -> None:
        """Write, sync and close (a failed journal is only closed)."""
        ...

    def abandon(self) -> None:
        """Close as ``kill -9`` would: the buffer is dropped, what was
        written stays for the next replay."""
        ...


class EngineIndex(Protocol):
    """The checkpointed index as the engine reads it, and the running mark.

    Everything it returns is as of the last committed checkpoint
    (:meth:`EngineLedgerStorage.flush` writes it).  Reads run on any thread;
    the marks' writes on the checkpoint thread (or at open).  Writes are
    durable when they return."""

    @property
    def created(self) -> bool:
        """True if this open created the index (a new or emptied disk)."""
        ...

    def load_ledger_states(self) -> dict[int, LedgerState]:
        """Every checkpointed ledger's state, by ledger id."""
        ...

    def has_ledger_state(self, ledger_id: int) -> bool: ...

    def journal_mark(self) -> JournalMark | None:
        """The replay mark of the last checkpoint (None: replay everything)."""
        ...

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of the ledger, -1 if none."""
        ...

    def entry_ids(self, ledger_id: int, first: int, last: int) -> list[int]:
        """The indexed entry ids from ``first`` to ``last`` (inclusive), in order."""
        ...

    def running_mark(self) -> bool | None:
        """The unclean-shutdown mark (BP-46): None if absent (clean
        shutdown or new disk), else the ``journal_write_data`` it recorded."""
        ...

    def set_running_mark(self, journal_write_data: bool) -> None:
        """Durably record that a run with this journal mode has started."""
        ...

    def clear_running_mark(self) -> None:
        """Durably remove the running mark (the last write of a clean close)."""
        ...


class EntryLogList(Protocol):
    """The entry logs, as far as the engine's statistics look at them."""

    def log_ids(self) -> list[int]:
        """Ids of the entry logs on disk."""
        ...


class EntryLogCompactor(Protocol):
    """Entry-log compaction (see :mod:`~quire.bookie.storage.compaction`)."""

    def compact(self, threshold: float, is_live: Callable[[int], bool],
                exclusive: Exclusive) -> CompactionStats:
        """Copy the live entries out of every log whose live fraction is
        below ``threshold`` and remove it; runs on its own thread, taking
        ``exclusive`` for each piece it writes and for its index commit."""
        ...


class EngineLedgerStorage(Protocol):
    """The checkpointed layer below the engine's write cache: entry logs,
    index, read cache.

    :meth:`flush` is the checkpoint: entries, ledger states, deletions and
    the journal replay mark become durable together, atomically (a crash
    leaves all of it or none), when it returns; until then the engine keeps
    serving the entries from memory.  :meth:`flush`, :meth:`gc_entry_logs`
    and :meth:`close` run on the checkpoint thread, serialised by the
    engine's checkpoint lock; reads run on any thread.  Errors:
    ``OSError`` or :class:`~quire.errors.StorageError` (the engine then
    keeps the work for the next checkpoint)."""

    @property
    def index(self) -> EngineIndex: ...

    @property
    def read_cache(self) -> ReadCache:
        """Recently read checkpointed entries (statistics; dropped with a ledger)."""
        ...

    @property
    def entry_logger(self) -> EntryLogList: ...

    @property
    def compactor(self) -> EntryLogCompactor: ...

    def read(self, ledger_id: int, entry_id: int) -> bytes | None:
        """A checkpointed entry, None if not stored."""
        ...

    def read_records(self, ledger_id: int, start: int, max_count: int,
                     max_bytes: int) -> tuple[int, list[bytes]]:
        """Checkpointed entries ``start, start + 1, ...`` as records
        ``(u32 length | entry)*``: how many, and byte strings that joined
        make them; stops at the first missing one, ``max_count``, or before
        passing ``max_bytes`` (the first is always returned)."""
        ...

    def flush(self, entries: Mapping[EntryKey, bytes], states: Mapping[int, LedgerState],
              deletions: Iterable[int], mark: JournalMark) -> int:
        """The checkpoint (see the class docstring); returns the entry bytes written."""
        ...

    def gc_entry_logs(self, is_live: Callable[[int], bool]) -> list[int]:
        """Remove the entry logs none of whose ledgers ``is_live``; return their ids."""
        ...

    def close(self) -> None: ...
