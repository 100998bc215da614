"""The storage engine's replay: each journal record read back at open is
applied to the in-memory state as the write that journaled it did, which
rebuilds the write cache and the ledger states since the checkpoint mark
(see :meth:`~quire.bookie.storage.BookieStorage.open_over`)."""

from __future__ import annotations

import dataclasses

from quire.bookie.storage.engine_state import EngineState, KnownLedger
from quire.bookie.storage.journal_format import (
    REC_ADD_ENTRY,
    REC_DELETE_LEDGER,
    REC_EXPLICIT_LAC,
    REC_FENCE,
    REC_LEDGER_STATE,
    REC_SET_MASTER_KEY,
    JournalRecord,
    decode_add_entry,
    decode_explicit_lac,
    decode_ledger_id,
)
from quire.bookie.storage.state import LedgerState
from quire.errors import StorageError


class EngineReplay(EngineState):
    """The replay part of :class:`~quire.bookie.storage.BookieStorage`."""

    def _apply(self, record: JournalRecord) -> None:
        """Apply one replayed journal record (open, single-threaded)."""
        rtype, body = record.rtype, record.body
        self._replayed += 1
        if rtype == REC_ADD_ENTRY:
            ledger_id, entry_id, entry = decode_add_entry(body)
            info = self._ledgers.get(ledger_id)
            if info is None:
                self._replay_skipped += 1  # its SET_MASTER_KEY predates a deletion
                return
            old = self._cache.get((ledger_id, entry_id))
            self._cache[(ledger_id, entry_id)] = entry
            self._cache_bytes += len(entry) - (0 if old is None else len(old))
            info.cache_epoch = self._epoch
            if entry_id > info.max_added:
                info.max_added = entry_id
            return
        ledger_id = decode_ledger_id(body)
        info = self._ledgers.get(ledger_id)
        if rtype == REC_SET_MASTER_KEY:
            if info is None:
                self._ledgers[ledger_id] = KnownLedger(LedgerState(bytes(body[8:])))
        elif rtype == REC_LEDGER_STATE:
            state = LedgerState.decode(body[8:])
            if info is None:
                self._ledgers[ledger_id] = KnownLedger(state)
            else:
                info.state = state
        elif rtype == REC_DELETE_LEDGER:
            if info is not None:
                self._delete_locked({ledger_id: info})
            return
        elif info is None:
            self._replay_skipped += 1
            return
        elif rtype == REC_FENCE:
            info.state = dataclasses.replace(info.state, fenced=True)
        elif rtype == REC_EXPLICIT_LAC:
            _lid, lac = decode_explicit_lac(body)
            if lac > info.state.explicit_lac:
                info.state = dataclasses.replace(info.state, explicit_lac=lac)
        else:
            raise StorageError(f"journal record type {rtype} at {record.end} is unknown "
                               "(written by a newer version?)")
        self._dirty.add(ledger_id)
