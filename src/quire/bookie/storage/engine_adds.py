"""The storage engine's add paths (the loop thread's, and the bookie's hot
path): an add checks the ledger's master key and fence, appends an
ADD_ENTRY record to the journal buffer (unless BP-46's journal bypass) and
puts the entry in the write cache; it returns the record's journal seq and
does no syscall.

* :meth:`~EngineAdds.add_run`: the usual batch, taken column-wise with no
  bytecode per add; it declines (None) anything else;
* :meth:`~EngineAdds.add_entries`: any batch, each add decided in turn;
* :meth:`~EngineAdds.add_entry`: one add.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import is_, lt

from quire.bookie.storage.engine_state import MAX_ID, EngineState, KnownLedger
from quire.errors import (
    BadRequestError,
    LedgerFencedError,
    StorageError,
    TooManyRequestsError,
    UnauthorizedError,
)
from quire.security.ledger_keys import same_key


class EngineAdds(EngineState):
    """The add paths of :class:`~quire.bookie.storage.BookieStorage`."""

    def add_entry(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                  master_key: bytes, *, recovery: bool = False) -> int:
        """Store an entry; return its journal seq (ack once that is durable).

        ``entry`` is kept verbatim.  Like every stored entry of the protocol
        it must begin with its ledger id and entry id (u64 each): reads from
        an entry log check those against the index (StorageError if not).

        The first add (or fence) of an unknown ledger sets its master key; a
        different key raises :class:`UnauthorizedError`.  A fenced ledger
        refuses adds (:class:`LedgerFencedError`) unless ``recovery``.
        """
        with self._lock:
            return self._add_locked(ledger_id, entry_id, entry, master_key, recovery)

    def add_entries(self, adds: Sequence[tuple[int, int, bytes, bytes]], *,
                    recovery: bool = False, journal: bool = True) -> list[int | Exception]:
        """:meth:`add_entry` (with ``recovery``) for each ``(ledger_id,
        entry_id, entry, master_key)`` in order, under one lock acquisition.
        Each result is the entry's journal seq, or the exception
        ``add_entry`` would have raised for it (later items are still added).
        The server's add path for adds not taken as a run (:meth:`add_run`).

        ``journal=False`` is BP-46's journal bypass: the entries go to the
        write cache only (a ledger's creation is still journaled), and each
        result is the :attr:`write_epoch` holding the entry instead of a
        journal seq; the entry is durable once :attr:`checkpointed_epoch`
        reaches that epoch, and lost with the write cache before that."""
        # The checks of each add, then one journal call for a run of accepted
        # adds (a ledger's creation, journaled between two runs, keeps the
        # journal order of add_entry one by one), then the write cache.
        results: list[int | Exception] = []
        append_result = results.append
        accepted: list[tuple[int, int, bytes]] = []
        infos: list[KnownLedger] = []
        seqs: list[int] = []
        def journal_run() -> None:  # the accepted adds not journaled yet, in one call
            run = accepted[len(seqs):]
            if not run:
                return
            if not journal:
                seqs.extend(repeat(self._epoch, len(run)))
                return
            last = self.journal.append_add_entries(run)
            seqs.extend(range(last - len(run) + 1, last + 1))

        with self._lock:
            check = self._check_add_locked
            cache_bytes = self._cache_bytes
            for ledger_id, entry_id, entry, master_key in adds:
                try:
                    info, entry = check(ledger_id, entry_id, entry, master_key, recovery,
                                        cache_bytes)
                    if info is None:
                        journal_run()  # before the creation record
                        info = self._create_locked(ledger_id, master_key)
                except Exception as e:  # returned: the caller answers it, as for add_entry
                    append_result(e)
                    continue
                cache_bytes += len(entry)
                append_result(len(accepted))  # replaced by its seq below
                accepted.append((ledger_id, entry_id, entry))
                infos.append(info)
            if not accepted:
                return results
            journal_run()
            cache = self._cache_locked
            for (ledger_id, entry_id, entry), info in zip(accepted, infos, strict=True):
                cache(info, ledger_id, entry_id, entry)
        if len(accepted) == len(results):
            return seqs  # type: ignore[return-value]  # (list is invariant)
        return [r if type(r) is not int else seqs[r] for r in results]

    def add_run(self, ledger_id: int, master_key: bytes, entry_ids: list[int],
                entries: list[bytes], *, journal: bool = True) -> int | None:
        """:meth:`add_entries` for the usual batch, taken column-wise: adds
        of one known ledger, unfenced, under its master key, with entry ids
        strictly increasing and none in the write cache yet, ``bytes``
        entries, and room in the write cache for all.  Returns the last
        add's journal seq (the others precede it one by one); None, with
        nothing changed, for any batch that is not such a run, which the
        caller hands to :meth:`add_entries` (every refusal is decided there,
        one add at a time).  No bytecode runs per add: each step is a
        C-level ``map``, ``zip`` or dict update.  ``journal=False``: the
        journal bypass of :meth:`add_entries`; returns the write epoch
        holding the run instead of a journal seq."""
        if not entry_ids or not 0 <= ledger_id <= MAX_ID or entry_ids[0] < 0 \
                or entry_ids[-1] > MAX_ID or not all(map(lt, entry_ids, entry_ids[1:])) \
                or not all(map(is_, map(type, entries), repeat(bytes))):
            return None
        keys = list(zip(repeat(ledger_id), entry_ids))
        size = sum(map(len, entries))
        with self._lock:
            info = self._ledgers.get(ledger_id)
            if self._closed or info is None or not same_key(info.state.master_key, master_key) \
                    or info.state.fenced or not self._cache.keys().isdisjoint(keys) \
                    or (self._reject_bytes and self._cache_bytes + size > self._reject_bytes):
                return None
            last = self.journal.append_add_run(ledger_id, entry_ids, entries) if journal \
                else self._epoch
            self._cache.update(zip(keys, entries, strict=True))
            self._cache_bytes += size
            info.cache_epoch = self._epoch
            if entry_ids[-1] > info.max_added:
                info.max_added = entry_ids[-1]
            return last

    def _add_locked(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                    master_key: bytes, recovery: bool) -> int:
        """The checks, journal record and cache update of one add (lock held)."""
        info, data = self._check_add_locked(ledger_id, entry_id, entry, master_key, recovery,
                                            self._cache_bytes)
        if info is None:
            info = self._create_locked(ledger_id, master_key)
        seq = self.journal.append_add_entry(ledger_id, entry_id, data)
        self._cache_locked(info, ledger_id, entry_id, data)
        return seq

    def _check_add_locked(self, ledger_id: int, entry_id: int, entry: bytes | memoryview,
                          master_key: bytes, recovery: bool, cache_bytes: int
                          ) -> tuple[KnownLedger | None, bytes]:
        """The checks of one add (lock held), with ``cache_bytes`` in the
        write cache before it: raises what :meth:`add_entry` raises, else
        returns the ledger (None: unknown, to be created with this key) and
        the entry as ``bytes``."""
        if not 0 <= ledger_id <= MAX_ID or not 0 <= entry_id <= MAX_ID:
            raise BadRequestError(f"bad ledger/entry id ({ledger_id}, {entry_id})")
        if type(entry) is not bytes:
            entry = bytes(entry)
        if self._closed:
            raise StorageError("storage engine closed")
        if self._reject_bytes and cache_bytes + len(entry) > self._reject_bytes:
            raise TooManyRequestsError("write cache full: checkpoint behind")
        info = self._ledgers.get(ledger_id)
        if info is not None:
            state = info.state
            if not same_key(state.master_key, master_key) and (state.master_key or recovery):
                # (a key-less limbo ledger refuses plain adds as fenced, below)
                raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
            if state.fenced and not recovery:
                raise LedgerFencedError(f"ledger {ledger_id} is fenced")
        return info, entry

    def _cache_locked(self, info: KnownLedger, ledger_id: int, entry_id: int,
                      entry: bytes) -> None:
        """Put a journaled add in the write cache (lock held)."""
        cache = self._cache
        key = (ledger_id, entry_id)
        old = cache.get(key)
        cache[key] = entry
        self._cache_bytes += len(entry) if old is None else len(entry) - len(old)
        info.cache_epoch = self._epoch
        if entry_id > info.max_added:
            info.max_added = entry_id
