"""The storage engine's ledger state changes: fencing, the explicit LAC,
generic state updates, and limbo (BP-46).

Each change is journaled like an add and durable once a sync covers the
seq it returns; the next checkpoint commits the ledger's state to the index.

Limbo.  :meth:`~EngineFencing.mark_limbo` fences ledgers and puts them in
limbo (the bookie may have lost some of their entries) in one durable index
commit (:meth:`~EngineFencing.mark_fenced` only fences, for closed
ledgers); :meth:`~EngineFencing.clear_limbo` journals the end of it.  A
ledger this bookie never stored is created by ``mark_limbo`` with an empty
master key, meaning "not known": the first fence adopts the key it brings.
The storage answers reads of limbo ledgers as of any other; turning
negatives into UNKNOWN is the request handlers' job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from quire.bookie.storage.engine_checkpoints import EngineCheckpoints
from quire.bookie.storage.engine_state import MAX_ID, KnownLedger
from quire.bookie.storage.journal_format import (
    encode_explicit_lac,
    encode_fence,
    encode_ledger_state,
)
from quire.bookie.storage.state import LedgerState
from quire.errors import BadRequestError, UnauthorizedError
from quire.security.ledger_keys import same_key

_UPDATABLE_FIELDS = frozenset({"fenced", "explicit_lac", "limbo", "sync_cursor"})


class EngineFencing(EngineCheckpoints):
    """Fencing, ledger state and limbo of
    :class:`~quire.bookie.storage.BookieStorage` (limbo marks are committed
    by a checkpoint, hence the base)."""

    def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger (creating it with this key if unknown); return the
        journal seq to wait for before answering."""
        with self._lock:
            self._check_open()
            info = self._ledgers.get(ledger_id)
            if info is None:
                info = self._create_locked(ledger_id, master_key)
            elif not same_key(info.state.master_key, master_key):
                if info.state.master_key:
                    raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
                # created by mark_limbo without a key: adopt this one
                info.state = dataclasses.replace(info.state, master_key=bytes(master_key),
                                                 fenced=True)
                self._dirty.add(ledger_id)
                return self.journal.append(encode_ledger_state(ledger_id, info.state.encode()))
            if info.state.fenced:
                return self.journal.append_seq
            info.state = dataclasses.replace(info.state, fenced=True)
            self._dirty.add(ledger_id)
            return self.journal.append(encode_fence(ledger_id))

    def set_explicit_lac(self, ledger_id: int, lac: int) -> int:
        """Record an explicit LAC (kept only if higher); return a journal seq."""
        with self._lock:
            self._check_open()
            info = self._known(ledger_id)
            if lac <= info.state.explicit_lac:
                return self.journal.append_seq
            info.state = dataclasses.replace(info.state, explicit_lac=lac)
            self._dirty.add(ledger_id)
            return self.journal.append(encode_explicit_lac(ledger_id, lac))

    def update_ledger_state(self, ledger_id: int, **fields: Any) -> int:
        """Change any of ``fenced``, ``explicit_lac``, ``limbo``,
        ``sync_cursor`` (journaled as one LEDGER_STATE record); return its seq."""
        unknown = set(fields) - _UPDATABLE_FIELDS
        if unknown:
            raise ValueError(f"cannot update ledger state fields {sorted(unknown)}")
        with self._lock:
            self._check_open()
            info = self._known(ledger_id)
            state = dataclasses.replace(info.state, **fields)
            if state == info.state:
                return self.journal.append_seq
            encoded = state.encode()
            seq = self.journal.append(encode_ledger_state(ledger_id, encoded))
            info.state = state
            self._dirty.add(ledger_id)
            return seq

    def mark_limbo(self, ledger_ids: Iterable[int]) -> None:
        """BP-46 phase one: fence each ledger and put it in limbo, creating
        (without a master key) those this bookie never stored; durable, in
        one index commit (a checkpoint), when this returns."""
        self._protect(ledger_ids, limbo=True)

    def mark_fenced(self, ledger_ids: Iterable[int]) -> None:
        """BP-46 phase one for ledgers whose end is decided (CLOSED): fence
        each, creating (without a master key) those this bookie never
        stored, so that a writer that missed the close is refused here too;
        durable, in one index commit, when this returns."""
        self._protect(ledger_ids, limbo=False)

    def _protect(self, ledger_ids: Iterable[int], *, limbo: bool) -> None:
        with self._checkpoint_lock:
            self._check_open()
            with self._lock:
                for ledger_id in ledger_ids:
                    if not 0 <= ledger_id <= MAX_ID:
                        raise BadRequestError(f"bad ledger id {ledger_id}")
                    info = self._ledgers.get(ledger_id)
                    if info is None:
                        self._ledgers[ledger_id] = KnownLedger(
                            LedgerState(b"", fenced=True, limbo=limbo))
                    elif not info.state.fenced or (limbo and not info.state.limbo):
                        info.state = dataclasses.replace(info.state, fenced=True,
                                                         limbo=info.state.limbo or limbo)
                    else:
                        continue
                    self._dirty.add(ledger_id)
            self._checkpoint_locked()

    def clear_limbo(self, ledger_id: int) -> int:
        """The ledger is repaired: end its limbo (it stays fenced).  Returns
        the journal seq that makes this durable once synced."""
        return self.update_ledger_state(ledger_id, limbo=False)

    def is_limbo(self, ledger_id: int) -> bool:
        """True if the ledger is in limbo (False if unknown)."""
        info = self._ledgers.get(ledger_id)
        return info is not None and info.state.limbo

    def limbo_ledgers(self) -> list[int]:
        with self._lock:
            return sorted(lid for lid, info in self._ledgers.items() if info.state.limbo)
