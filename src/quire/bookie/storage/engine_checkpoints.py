"""The storage engine's checkpoint (its own thread, under the checkpoint
lock).

:meth:`~EngineCheckpoints.checkpoint` swaps the write cache for a fresh one
and captures the journal mark under the engine lock (so the mark covers
exactly the swapped entries and states), then, with no engine lock held,
has the ledger storage write the old cache sorted by ``(ledger, entry)`` to
the current entry log, fsync it, and commit index + ledger states +
deletions + journal replay mark in one LMDB transaction; then it removes
the journal files wholly before the mark.  A failed checkpoint puts its
work back to be retried (the journal still holds all of it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from quire.bookie.storage.engine_state import EngineState
from quire.bookie.storage.journal_format import JournalMark
from quire.bookie.storage.ledger_storage import EntryKey
from quire.bookie.storage.state import LedgerState
from quire.errors import StorageError


@dataclass(frozen=True)
class CheckpointStats:
    entries: int
    bytes: int
    ledger_states: int
    deleted_ledgers: int
    journal_files_removed: int
    duration_s: float
    mark: JournalMark


class EngineCheckpoints(EngineState):
    """The checkpoint of :class:`~quire.bookie.storage.BookieStorage`."""

    last_checkpoint: CheckpointStats | None = None
    """What the last checkpoint that wrote something did."""

    def checkpoint(self) -> CheckpointStats:
        """Flush the write cache to an entry log, commit index + states +
        replay mark durably, then drop journal files before the mark."""
        with self._checkpoint_lock:
            self._check_open()
            return self._checkpoint_locked()

    def _checkpoint_locked(self) -> CheckpointStats:
        started = time.perf_counter()
        with self._lock:
            mark = self.journal.mark()
            snapshot = self._cache
            epoch = self._epoch
            self._flushing = snapshot
            self._cache = {}
            self._cache_bytes = 0
            self._epoch += 1
            states = {lid: self._ledgers[lid].state for lid in self._dirty}
            self._dirty = set()
            deletions = self._pending_deletes
            self._pending_deletes = set()
        if not snapshot and not states and not deletions and mark == self._committed_mark:
            with self._lock:
                self._flushing = {}
            self.checkpointed_epoch = epoch
            return CheckpointStats(0, 0, 0, 0, 0, time.perf_counter() - started, mark)
        try:
            nbytes = self._store.flush(snapshot, states, deletions, mark)
        except BaseException as e:
            self._restore_after_failed_checkpoint(snapshot, states, deletions)
            if isinstance(e, OSError):
                raise StorageError(f"checkpoint failed: {e}") from e
            raise
        with self._lock:
            self._flushing = {}
        # A failed checkpoint put its entries back in a later epoch's cache,
        # so every epoch up to this one is now out.
        self.checkpointed_epoch = epoch
        self._committed_mark = mark
        removed = self.journal.remove_files_before(mark)
        self._checkpoints += 1
        self._checkpointed_entries += len(snapshot)
        stats = CheckpointStats(
            entries=len(snapshot), bytes=nbytes, ledger_states=len(states),
            deleted_ledgers=len(deletions), journal_files_removed=len(removed),
            duration_s=time.perf_counter() - started, mark=mark)
        self.last_checkpoint = stats
        return stats

    def _restore_after_failed_checkpoint(self, snapshot: dict[EntryKey, bytes],
                                         states: dict[int, LedgerState],
                                         deletions: set[int]) -> None:
        """Put a failed checkpoint's work back so that it is retried (the
        journal still holds all of it: its files are not removed)."""
        with self._lock:
            for key, value in snapshot.items():
                info = self._ledgers.get(key[0])
                if info is None or key in self._cache:
                    continue
                self._cache[key] = value
                self._cache_bytes += len(value)
                info.cache_epoch = self._epoch
            self._dirty |= states.keys() & self._ledgers.keys()
            self._pending_deletes |= deletions
            self._flushing = {}
