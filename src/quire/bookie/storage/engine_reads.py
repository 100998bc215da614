"""The storage engine's reads: entries from the write cache, then the cache
being checkpointed, then the ledger storage (its read cache, then index +
entry log, ``pread``); and the getters of the ledgers' state.

A read that misses the caches reads the ledger storage with the engine lock
released (see the benign race in :mod:`~quire.bookie.storage.bookie_storage`).
"""

from __future__ import annotations

from quire.bookie.storage.engine_state import LAST_ENTRY, EngineState, KnownLedger
from quire.bookie.storage.entry_log import RECORD_PREFIX, RECORD_PREFIX_SIZE
from quire.bookie.storage.state import LedgerState
from quire.errors import BadRequestError, NoSuchEntryError, NoSuchLedgerError, QuireError


class EngineReads(EngineState):
    """The reads of :class:`~quire.bookie.storage.BookieStorage`."""

    def _last_entry_locked(self, ledger_id: int, info: KnownLedger) -> int:
        if info.index_max is None:
            info.index_max = self._store.index.last_entry_id(ledger_id)
        return max(info.max_added, info.index_max)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry; ``entry_id == -1`` means the last one stored.

        Raises :class:`NoSuchLedgerError` if the ledger is unknown (or
        deleted), :class:`NoSuchEntryError` if the entry is not stored."""
        with self._lock:
            self._check_open()
            info = self._ledgers.get(ledger_id)
            if info is None:
                raise NoSuchLedgerError(f"ledger {ledger_id}")
            if entry_id < 0:
                if entry_id != LAST_ENTRY:
                    raise BadRequestError(f"bad entry id {entry_id}")
                entry_id = self._last_entry_locked(ledger_id, info)
                if entry_id < 0:
                    raise NoSuchEntryError(f"ledger {ledger_id} has no entries")
            key = (ledger_id, entry_id)
            data = self._cache.get(key)
            if data is None:
                data = self._flushing.get(key)
            if data is not None:
                return data
        data = self._store.read(ledger_id, entry_id)
        if data is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}")
        return data

    def read_records(self, ledger_id: int, start: int, max_count: int, max_bytes: int
                     ) -> tuple[int, list[bytes]]:
        """Stored entries ``start, start + 1, ...`` in order (BP-62's batch)
        as records, ``(u32 length | entry)*``, the layout of a batch
        response's entry list and of an entry log: how many entries, and the
        byte strings that joined make the records.  At most ``max_count``
        entries, stopping at the first missing one or error, or before the
        records would pass ``max_bytes``; the first entry is always
        returned.  Raises what :meth:`read_entry` raises when the first entry
        cannot be read.  One lock per run of cached entries, and one
        ``pread``, passed on as read, per run of checkpointed ones: no
        per-entry lock, lookup or copy."""
        chunks: list[bytes] = []
        count = size = 0
        entry_id = start
        pack = RECORD_PREFIX.pack
        while count < max_count:
            with self._lock:
                self._check_open()
                if ledger_id not in self._ledgers:
                    if count:
                        return count, chunks
                    raise NoSuchLedgerError(f"ledger {ledger_id}")
                cache, flushing = self._cache, self._flushing
                while count < max_count:
                    key = (ledger_id, entry_id)
                    data = cache.get(key)
                    if data is None:
                        data = flushing.get(key)
                        if data is None:
                            break
                    size += RECORD_PREFIX_SIZE + len(data)
                    if count and size > max_bytes:
                        return count, chunks
                    chunks.append(pack(len(data)))
                    chunks.append(data)
                    count += 1
                    entry_id += 1
            if count >= max_count:
                break
            try:
                got, records = self._store.read_records(ledger_id, entry_id, max_count - count,
                                                        max_bytes - size)
            except QuireError:
                if count:
                    return count, chunks
                raise
            if not got:
                if count:
                    return count, chunks
                raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}")
            run_bytes = sum(map(len, records))
            if count and size + run_bytes > max_bytes:
                # a run goes past the room only by its first entry
                return count, chunks
            chunks += records
            size += run_bytes
            count += got
            entry_id += got
        return count, chunks

    def stored_entry_ids(self, ledger_id: int, first: int, last: int) -> set[int]:
        """The ids from ``first`` to ``last`` (inclusive) of the entries
        stored for the ledger, in the write cache or the index (BP-46
        repair: what this bookie lacks is what it should hold minus these)."""
        with self._lock:
            self._check_open()
            if ledger_id not in self._ledgers:
                return set()
            caches = (self._cache, self._flushing)
            if last - first < sum(map(len, caches)):  # look each id up
                pending = {entry_id for entry_id in range(first, last + 1)
                           if (ledger_id, entry_id) in self._cache
                           or (ledger_id, entry_id) in self._flushing}
            else:  # walk the (smaller) caches
                pending = {entry_id for cached in caches for (lid, entry_id) in cached
                           if lid == ledger_id and first <= entry_id <= last}
        return pending.union(self._store.index.entry_ids(ledger_id, first, last))

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest entry id stored for the ledger (-1 if none)."""
        with self._lock:
            return self._last_entry_locked(ledger_id, self._known(ledger_id))

    def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def is_fenced(self, ledger_id: int) -> bool:
        with self._lock:
            return self._known(ledger_id).state.fenced

    def get_master_key(self, ledger_id: int) -> bytes | None:
        """The ledger's master key, or None if the ledger is unknown."""
        info = self._ledgers.get(ledger_id)
        return None if info is None else info.state.master_key

    def get_explicit_lac(self, ledger_id: int) -> int:
        with self._lock:
            return self._known(ledger_id).state.explicit_lac

    def get_ledger_state(self, ledger_id: int) -> LedgerState:
        with self._lock:
            return self._known(ledger_id).state

    def list_ledgers(self) -> list[int]:
        with self._lock:
            return sorted(self._ledgers)
