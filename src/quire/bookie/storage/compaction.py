"""Entry-log compaction: copy the live entries out of mostly dead logs.

GC (:meth:`~quire.bookie.storage.ledger_storage.LedgerStorage.gc_entry_logs`)
removes an entry log once none of its ledgers exists.  A log that also holds
one live ledger would be kept whole for as long as that ledger lives;
compaction (BookKeeper's minor and major compaction) reclaims it:

1. **Choose.**  A log's *live fraction* is the record bytes of its ledgers
   that still exist over the log's size.  The bytes come from the index's
   ``usage`` rows, written by each checkpoint
   (:func:`~quire.bookie.storage.index.usage_of_rows`)
   and by each compaction, so choosing reads no log.  Logs below the
   threshold are compacted (the one being written never is).
2. **Copy.**  The log's live rows (one index walk per live ledger, over
   the entry ids its usage row says it has in the log) are read
   with one ``pread`` per run of back-to-back records, each record checked
   against its row, and appended to the current entry log in pieces of
   ``compaction_chunk_bytes``; each piece is fsynced before the next.  Reads
   happen outside every lock; each piece's write holds the checkpoint lock
   (the entry logger has one writer at a time) for that piece only, never
   the engine lock: adds go on, a checkpoint waits for at most one piece.
3. **Commit.**  One index transaction points every row that still holds
   what was read at its copy, skipping rows deleted or rewritten meanwhile
   (a ledger deleted, a recovery re-add checkpointed), adds the copies' bytes
   to their log's usage and removes the old log's records.
4. **Remove.**  Only after that commit is the old log deleted.

Crash safety, at every step: before the commit the index names the old copy
only, whose log still exists (the partial copies are unreferenced bytes in a
log, as after a crashed checkpoint: counted as dead there, compacted or
removed later); after it the index names the new copy only, which was
fsynced before the commit; a log whose records are gone but whose file
survived (a crash before the unlink) is an unknown log that GC removes.  A
read racing a compaction that finds its log gone looks the entry up again
(:class:`~quire.bookie.storage.ledger_storage.LedgerStorage`).

``on_step`` is a test seam: it is called with ``"copied"`` (the copies are
durable, the index is not committed) and ``"committed"`` (before the old
log is removed), so that tests can crash a compaction at exactly those
points (:func:`kill_at` for a real bookie process).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from operator import add, itemgetter
from typing import Protocol

from quire.bookie.storage.entry_log import (
    LOG_HEADER_SIZE,
    RECORD_PREFIX_SIZE,
    EntryLogger,
    IndexRows,
    entry_log_name,
)
from quire.bookie.storage.index import LedgerIndex, MovedRows
from quire.errors import StorageError

log = logging.getLogger(__name__)

STEP_COPIED = "copied"
STEP_COMMITTED = "committed"
COMPACTION_STEPS = frozenset({STEP_COPIED, STEP_COMMITTED})
_PLUS_PREFIX = partial(add, RECORD_PREFIX_SIZE)
_LEDGER, _ENTRY, _VALUE = itemgetter(0), itemgetter(1), itemgetter(2)


def kill_at(step: str) -> Callable[[str], None]:
    """An ``on_step`` that kills this process (``SIGKILL``, as ``kill -9``)
    at ``step``: the ``test_kill_during_compaction`` seam of real bookies."""
    if step not in COMPACTION_STEPS:
        raise ValueError(f"unknown compaction step {step!r}")

    def on_step(reached: str) -> None:
        if reached == step:
            log.warning("test_kill_during_compaction: killing this bookie at %r", step)
            os.kill(os.getpid(), signal.SIGKILL)

    return on_step


class Exclusive(Protocol):
    """Holds the engine's checkpoint lock (one writer of entry logs at a
    time) for a ``with`` block, after checking that the engine is open
    (:class:`~quire.errors.StorageError` otherwise).  Never takes the engine
    lock: adds are not held up."""

    def __call__(self) -> AbstractContextManager[None]: ...


@dataclass(frozen=True)
class LogUse:
    """One entry log as compaction sees it."""

    log_id: int
    size_bytes: int
    """Bytes of records (the file's size less its header)."""
    live_bytes: int
    """Record bytes of ledgers that still exist."""
    live_ranges: tuple[tuple[int, int, int], ...] = ()
    """Those ledgers, with the lowest and highest entry id each has there:
    ``(ledger id, first, last)``."""

    @property
    def live_fraction(self) -> float:
        return self.live_bytes / self.size_bytes if self.size_bytes > 0 else 0.0


@dataclass(frozen=True)
class CompactionStats:
    logs_compacted: int = 0
    entries_moved: int = 0
    bytes_moved: int = 0
    """Record bytes of the entries moved."""
    bytes_reclaimed: int = 0
    """Bytes of the removed logs less the bytes written for their copies."""
    logs_failed: int = 0
    """Logs left as they were because reading or copying them failed."""
    duration_s: float = 0.0

    def __add__(self, other: CompactionStats) -> CompactionStats:
        return CompactionStats(
            self.logs_compacted + other.logs_compacted,
            self.entries_moved + other.entries_moved, self.bytes_moved + other.bytes_moved,
            self.bytes_reclaimed + other.bytes_reclaimed,
            self.logs_failed + other.logs_failed, self.duration_s + other.duration_s)


class Compactor:
    """Compacts the entry logs of one index and entry logger (see the module
    docstring).  One compaction at a time: the caller serialises calls (and
    GC) with them."""

    def __init__(self, index: LedgerIndex, entry_logger: EntryLogger, *, chunk_bytes: int,
                 on_step: Callable[[str], None] | None = None) -> None:
        self._index = index
        self._logger = entry_logger
        self._chunk_bytes = chunk_bytes
        self.on_step = on_step
        """Test seam, called at each of :data:`COMPACTION_STEPS`."""

    def usage(self, is_live: Callable[[int], bool]) -> list[LogUse]:
        """Every entry log the index knows, but the one being written, with
        its live bytes."""
        current = self._logger.current_log_id
        known = self._index.log_ledgers()
        log_ids = [log_id for log_id in self._logger.log_ids()
                   if log_id != current and log_id in known]
        by_log = self._index.log_usage(log_ids)
        out = []
        for log_id in log_ids:
            try:
                size = os.stat(self._logger.directory / entry_log_name(log_id)).st_size
            except FileNotFoundError:
                continue
            live = sorted((ledger_id, use) for ledger_id, use in by_log[log_id].items()
                          if is_live(ledger_id))
            out.append(LogUse(log_id, max(0, size - LOG_HEADER_SIZE),
                              sum(use.record_bytes for _lid, use in live),
                              tuple((lid, use.first_entry, use.last_entry) for lid, use in live)))
        return out

    def compact(self, threshold: float, is_live: Callable[[int], bool],
                exclusive: Exclusive) -> CompactionStats:
        """Compact every log whose live fraction is below ``threshold``,
        least live first."""
        if threshold <= 0:
            return CompactionStats()
        chosen = sorted((use for use in self.usage(is_live) if use.live_fraction < threshold),
                        key=lambda use: use.live_fraction)
        stats = CompactionStats()
        for use in chosen:
            try:
                stats += self._compact_log(use, is_live, exclusive)
            except (StorageError, OSError) as e:  # (a write failing on a full disk)
                with exclusive():
                    pass  # an engine closed meanwhile ends the run (this raises)
                log.warning("compaction of entry log %d failed, kept as is: %s", use.log_id, e)
                stats += CompactionStats(logs_failed=1)
        return stats

    def _compact_log(self, use: LogUse, is_live: Callable[[int], bool],
                     exclusive: Exclusive) -> CompactionStats:
        started = time.perf_counter()
        log_id = use.log_id
        with exclusive():
            # Chosen without the lock: a checkpoint may have started it since.
            # Not current now (the lock held), it never will be: ids only grow.
            if log_id == self._logger.current_log_id:
                return CompactionStats()
        rows = self._index.rows_in_log(log_id, [(ledger_id, first, last) for ledger_id, first, last
                                                in use.live_ranges if is_live(ledger_id)])
        moves = MovedRows([], [], [], IndexRows([], [], [], [], []))
        written = 0
        for piece in self._pieces(rows):
            items = self._read(log_id, piece)
            with exclusive():
                new_rows, _ledgers = self._logger.write_batch(items)
            written += sum(new_rows.lengths) + RECORD_PREFIX_SIZE * len(new_rows.lengths)
            moves.ledger_ids.extend(map(_LEDGER, piece))
            moves.entry_ids.extend(map(_ENTRY, piece))
            moves.old_values.extend(map(_VALUE, piece))
            for column, added in zip(moves.copies, new_rows, strict=True):
                column.extend(added)
        self._step(STEP_COPIED)
        with exclusive():
            moved, moved_bytes = self._index.commit_compaction(log_id, moves)
            self._step(STEP_COMMITTED)
            self._logger.remove(log_id)
        reclaimed = use.size_bytes + LOG_HEADER_SIZE - written
        log.info("compacted entry log %d (%.0f%% live): %d entries (%d bytes) moved",
                 log_id, 100 * use.live_fraction, moved, moved_bytes)
        return CompactionStats(1, moved, moved_bytes, reclaimed, 0,
                               time.perf_counter() - started)

    def _step(self, step: str) -> None:
        if self.on_step is not None:
            self.on_step(step)

    def _pieces(self, rows: list[tuple[int, int, bytes, int, int]]
                ) -> Iterator[list[tuple[int, int, bytes, int, int]]]:
        """``rows`` in pieces of about ``chunk_bytes`` of records."""
        piece: list[tuple[int, int, bytes, int, int]] = []
        size = 0
        for row in rows:
            piece.append(row)
            size += RECORD_PREFIX_SIZE + row[4]
            if size >= self._chunk_bytes:
                yield piece
                piece, size = [], 0
        if piece:
            yield piece

    def _read(self, log_id: int, piece: list[tuple[int, int, bytes, int, int]]
              ) -> list[tuple[tuple[int, int], bytes]]:
        """The entries of ``piece``: one ``pread`` per run of one ledger's
        records laid back to back, each checked against its row."""
        items: list[tuple[tuple[int, int], bytes]] = []
        run: list[tuple[int, int, int]] = []
        run_ledger = -1
        end = -1
        for ledger_id, entry_id, _value, offset, length in piece:
            if run and (ledger_id != run_ledger or offset != end):
                items.extend(((run_ledger, eid), data)
                             for eid, data in self._logger.read_run(log_id, run_ledger, run))
                run = []
            run_ledger = ledger_id
            run.append((entry_id, offset, length))
            end = offset + RECORD_PREFIX_SIZE + length
        if run:
            items.extend(((run_ledger, eid), data)
                         for eid, data in self._logger.read_run(log_id, run_ledger, run))
        return items
