"""The storage engine's deletion of ledgers and reclaiming of their space.

:meth:`~EngineDeletion.delete_ledger` stops serving the ledger at once and
journals a DELETE_LEDGER record (durable once synced, like any state
change); the next checkpoint removes its index rows and state in its
transaction.  :meth:`~EngineDeletion.gc_entry_logs` (which first
checkpoints pending deletions) then removes the entry logs all of whose
ledgers are gone, and :meth:`~EngineDeletion.compact_entry_logs` copies the
live entries out of logs below a live fraction and removes them (see
:mod:`~quire.bookie.storage.compaction`).  Ledger ids are assumed not to be
reused: re-creating a deleted id before the deletion is checkpointed may
expose old entries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from quire.bookie.storage.compaction import CompactionStats
from quire.bookie.storage.engine_checkpoints import EngineCheckpoints
from quire.bookie.storage.engine_state import KnownLedger
from quire.bookie.storage.journal_format import encode_delete_ledger


class EngineDeletion(EngineCheckpoints):
    """Deletion, entry-log GC and compaction of
    :class:`~quire.bookie.storage.BookieStorage` (the last two checkpoint
    pending deletions first, hence the base)."""

    def delete_ledger(self, ledger_id: int) -> int:
        """Stop serving the ledger now; journal its deletion (return the seq);
        the next checkpoint removes its index rows and state."""
        return self.delete_ledgers([ledger_id])

    def delete_ledgers(self, ledger_ids: Iterable[int]) -> int:
        """:meth:`delete_ledger` for many at once: one pass over the write
        cache for all of them (GC may drop thousands of ledgers in one run,
        and a pass per ledger held the lock, and the loop, for as long)."""
        deleted: list[int] = []
        with self._lock:
            self._check_open()
            seq = self.journal.append_seq
            doomed: dict[int, KnownLedger] = {}
            for ledger_id in ledger_ids:
                info = self._ledgers.get(ledger_id)
                if info is not None and ledger_id not in doomed:
                    seq = self.journal.append(encode_delete_ledger(ledger_id))
                    doomed[ledger_id] = info
            self._delete_locked(doomed)
            deleted = list(doomed)
        for ledger_id in deleted:
            self._store.read_cache.discard_ledger(ledger_id)
        return seq

    def gc_entry_logs(self) -> list[int]:
        """Checkpoint pending deletions, then remove every entry log none of
        whose ledgers exists any more; return the removed log ids."""
        with self._compaction_lock, self._checkpoint_lock:
            self._check_open()
            if self._pending_deletes:
                self._checkpoint_locked()
            return self._store.gc_entry_logs(self._is_live)

    def _is_live(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers or self._store.index.has_ledger_state(ledger_id)

    def compact_entry_logs(self, threshold: float) -> CompactionStats:
        """Checkpoint pending deletions, then compact every entry log whose
        live fraction is below ``threshold`` (see
        :mod:`~quire.bookie.storage.compaction`)."""
        with self._compaction_lock:
            with self._checkpoint_lock:
                self._check_open()
                if self._pending_deletes:
                    self._checkpoint_locked()
            return self._store.compactor.compact(threshold, self._is_live, self._exclusive)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._checkpoint_lock:
            self._check_open()
            yield
