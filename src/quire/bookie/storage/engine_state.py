"""The storage engine's in-memory state, which all its parts share.

:class:`~quire.bookie.storage.BookieStorage` is one object assembled from
parts, each a class over :class:`EngineState` in a module of its own:

* :mod:`~quire.bookie.storage.engine_replay`: the journal's records
  applied at open;
* :mod:`~quire.bookie.storage.engine_adds`: the three add paths
  (``add_entry``, ``add_entries``, ``add_run``);
* :mod:`~quire.bookie.storage.engine_fencing`: fencing, the explicit LAC,
  ledger state updates and limbo;
* :mod:`~quire.bookie.storage.engine_reads`: reads and the state getters;
* :mod:`~quire.bookie.storage.engine_checkpoints`: the checkpoint;
* :mod:`~quire.bookie.storage.engine_deletion`: deletion, entry-log GC and
  compaction.

They are parts of one object, not objects of their own, so that the add
path reaches the write cache, the ledger table and the journal as
attributes of ``self``, as one class did: no hop through another object
and no call between objects per add or per run.

This module holds what they share: the ledger table (a :class:`KnownLedger`
per id), the write cache and the one being checkpointed, the ledgers whose
state or deletion the next checkpoint commits, the locks, and the helpers
more than one part calls.  The threading contract and the lock order are in
:mod:`~quire.bookie.storage.bookie_storage`.
"""

from __future__ import annotations

import threading

from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.journal_format import (
    JournalMark,
    encode_set_master_key,
)
from quire.bookie.storage.ledger_storage import EntryKey
from quire.bookie.storage.seams import EngineJournal, EngineLedgerStorage
from quire.bookie.storage.shutdown import LastShutdown
from quire.bookie.storage.state import LedgerState
from quire.errors import BadRequestError, NoSuchLedgerError, StorageError

LAST_ENTRY = -1
"""``read_entry`` entry id meaning "the last entry stored"."""
MAX_ID = (1 << 63) - 1


class KnownLedger:
    """In-memory bookkeeping for one known ledger (engine lock held)."""

    __slots__ = ("cache_epoch", "index_max", "max_added", "state")

    def __init__(self, state: LedgerState) -> None:
        self.state = state
        self.max_added = -1
        """Highest entry id added (or replayed) since open."""
        self.index_max: int | None = None
        """Highest indexed entry id at first need (lazy)."""
        self.cache_epoch = -1
        """Write-cache epoch of the latest add (to skip scans on delete)."""


class EngineState:
    """The state of :class:`~quire.bookie.storage.BookieStorage` (see the
    module docstring); its parts subclass this."""

    def __init__(self, config: StorageConfig, journal: EngineJournal,
                 store: EngineLedgerStorage,
                 lock_fds: list[int], states: dict[int, LedgerState],
                 mark: JournalMark | None, last_shutdown: LastShutdown) -> None:
        self.config = config
        self.last_shutdown = last_shutdown
        """How the previous run ended, as found at open (BP-46)."""
        self.journal: EngineJournal = journal
        self._store: EngineLedgerStorage = store
        self._lock_fds = lock_fds
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._compaction_lock = threading.Lock()
        self._ledgers: dict[int, KnownLedger] = {
            lid: KnownLedger(st) for lid, st in states.items()}
        self._cache: dict[EntryKey, bytes] = {}
        self._cache_bytes = 0
        self._flushing: dict[EntryKey, bytes] = {}
        self._epoch = 0
        self.checkpointed_epoch = -1
        """Every entry cached in a write-cache epoch up to this one is in
        fsynced entry logs and the index (see :attr:`write_epoch`)."""
        self._dirty: set[int] = set()
        self._pending_deletes: set[int] = set()
        self._committed_mark = mark
        self._checkpoint_max_bytes = config.write_cache_max_bytes
        ratio = config.write_cache_reject_ratio
        self._reject_bytes = int(ratio * config.write_cache_max_bytes) if ratio else 0
        self._closed = False
        self._checkpoints = 0
        self._checkpointed_entries = 0
        self._replayed = 0
        self._replay_skipped = 0

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("storage engine closed")

    def _known(self, ledger_id: int) -> KnownLedger:
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(f"ledger {ledger_id}")
        return info

    def _create_locked(self, ledger_id: int, master_key: bytes) -> KnownLedger:
        """A new ledger, its master key journaled (engine lock held): the
        first add or fence of an unknown ledger."""
        key = bytes(master_key)
        if len(key) > 255:
            raise BadRequestError("master key longer than 255 bytes")
        if ledger_id < 0:  # (a fencing read of one: found by benchmarks/fuzz_bookie.py)
            raise BadRequestError(f"bad ledger id {ledger_id}")
        info = KnownLedger(LedgerState(key))
        self.journal.append(encode_set_master_key(ledger_id, key))
        self._ledgers[ledger_id] = info
        self._dirty.add(ledger_id)
        return info

    def _delete_locked(self, doomed: dict[int, KnownLedger]) -> None:
        """Forget ``doomed`` ledgers (id -> info): one pass over each cache
        that holds any of them (engine lock held, or replay)."""
        in_cache: set[int] = set()
        in_flush: set[int] = set()
        for ledger_id, info in doomed.items():
            del self._ledgers[ledger_id]
            self._dirty.discard(ledger_id)
            self._pending_deletes.add(ledger_id)
            if info.cache_epoch == self._epoch:
                in_cache.add(ledger_id)
            elif info.cache_epoch == self._epoch - 1 and self._flushing:
                in_flush.add(ledger_id)
        if in_cache:
            for key in [k for k in self._cache if k[0] in in_cache]:
                self._cache_bytes -= len(self._cache.pop(key))
        if in_flush:
            # Never mutate the dict the checkpoint thread is writing out.
            self._flushing = {k: v for k, v in self._flushing.items() if k[0] not in in_flush}

    # --- the write cache ------------------------------------------------------

    @property
    def checkpoint_due(self) -> bool:
        """True once the write cache holds ``write_cache_max_bytes`` or more."""
        return self._cache_bytes >= self._checkpoint_max_bytes

    @property
    def write_cache_bytes(self) -> int:
        return self._cache_bytes

    @property
    def write_epoch(self) -> int:
        """The write-cache epoch adds go to now: each checkpoint writes out
        the cache of one epoch and starts the next (the journal bypass's
        clock: see :attr:`checkpointed_epoch`)."""
        return self._epoch
