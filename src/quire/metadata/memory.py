"""The ``memory://`` driver: an in-process store, for unit tests only.

``memory://`` opens a private instance; ``memory://NAME`` shares one instance
among every store opened with that name in this process, until the last of
them is closed.  Bookie leases and leased records work as in SQLite (a store
that stops renewing loses them), so tests see the same liveness behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import ConfigError, MetadataError
from quire.metadata._embedded import EmbeddedStore, Key, Lease, Row, Table, Txn

R = TypeVar("R")

SCHEME = "memory://"


class _Instance:
    """The data of one in-memory store, guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[Table, dict[Key, Row]] = {table: {} for table in Table}
        self.counters: dict[str, int] = {}
        self.leases: dict[str, Lease] = {}
        self.sessions: dict[str, int] = {}  # session -> expires_ms
        self.record_sessions: dict[str, str] = {}  # leased record key -> session
        self.users = 0


_shared: dict[str, _Instance] = {}
_shared_lock = threading.Lock()


class _MemoryTxn(Txn):
    """A transaction that remembers how to undo each change."""

    def __init__(self, data: _Instance) -> None:
        self._data = data
        self._undo: list[Callable[[], None]] = []

    def rollback(self) -> None:
        for undo in reversed(self._undo):
            undo()

    def _remember(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        if key in mapping:
            old = mapping[key]
            self._undo.append(lambda: mapping.__setitem__(key, old))
        else:
            self._undo.append(lambda: mapping.pop(key))

    def get(self, table: Table, key: Key) -> Row | None:
        return self._data.rows[table].get(key)

    def put(self, table: Table, key: Key, data: bytes, version: int) -> None:
        self._remember(self._data.rows[table], key)
        self._data.rows[table][key] = (data, version)

    def delete(self, table: Table, key: Key) -> None:
        self._remember(self._data.rows[table], key)
        del self._data.rows[table][key]
        if table is Table.RECORDS and key in self._data.record_sessions:
            self._remember(self._data.record_sessions, key)
            del self._data.record_sessions[key]

    def ledger_ids(self) -> list[int]:
        return sorted(k for k in self._data.rows[Table.LEDGERS] if isinstance(k, int))

    def cookie_ids(self) -> list[str]:
        return sorted(k for k in self._data.rows[Table.COOKIES] if isinstance(k, str))

    def record_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self._data.rows[Table.RECORDS]
                      if isinstance(k, str) and k.startswith(prefix))

    def next_counter(self, name: str) -> int:
        self._remember(self._data.counters, name)
        self._data.counters[name] = self._data.counters.get(name, 0) + 1
        return self._data.counters[name]

    def get_lease(self, bookie_id: str) -> Lease | None:
        return self._data.leases.get(bookie_id)

    def put_lease(self, lease: Lease) -> None:
        self._remember(self._data.leases, lease.bookie_id)
        self._data.leases[lease.bookie_id] = lease

    def delete_lease(self, bookie_id: str) -> None:
        if bookie_id in self._data.leases:
            self._remember(self._data.leases, bookie_id)
            del self._data.leases[bookie_id]

    def live_leases(self, now_ms: int) -> list[Lease]:
        return sorted(lease for lease in self._data.leases.values() if lease.expires_ms > now_ms)

    def session_expiry(self, session: str) -> int | None:
        return self._data.sessions.get(session)

    def put_session(self, session: str, expires_ms: int) -> None:
        self._remember(self._data.sessions, session)
        self._data.sessions[session] = expires_ms

    def delete_session(self, session: str) -> None:
        for key, owner in list(self._data.record_sessions.items()):
            if owner == session:
                self.delete(Table.RECORDS, key)
        if session in self._data.sessions:
            self._remember(self._data.sessions, session)
            del self._data.sessions[session]

    def lease_record(self, key: str, session: str) -> None:
        self._remember(self._data.record_sessions, key)
        self._data.record_sessions[key] = session

    def record_expiry(self, key: str) -> int | None:
        session = self._data.record_sessions.get(key)
        return None if session is None else self._data.sessions.get(session, 0)

    def dead_leased_keys(self, now_ms: int) -> list[str]:
        sessions = self._data.sessions
        return [key for key, session in self._data.record_sessions.items()
                if sessions.get(session, 0) <= now_ms]

    def drop_expired_leases(self, now_ms: int) -> None:
        for session, expires_ms in list(self._data.sessions.items()):
            if expires_ms <= now_ms:
                self.delete_session(session)
        for key in self.dead_leased_keys(now_ms):  # records of sessions gone before
            self.delete(Table.RECORDS, key)


class MemoryStore(EmbeddedStore):
    """An in-process :class:`~quire.metadata.store.MetadataStore`."""

    def __init__(self, uri: str, name: str, data: _Instance, *,
                 lease_ms: int, poll_interval_ms: int, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(uri, lease_ms=lease_ms, poll_interval_ms=poll_interval_ms,
                         clock=clock)
        self._name = name
        self._data: _Instance | None = data

    def _instance(self) -> _Instance:
        if self._data is None:
            raise MetadataError(f"{self.uri}: store is closed")
        return self._data

    async def _write(self, fn: Callable[[Txn], R]) -> R:
        data = self._instance()
        with data.lock:
            txn = _MemoryTxn(data)
            try:
                return fn(txn)
            except BaseException:
                txn.rollback()
                raise

    async def _read(self, fn: Callable[[Txn], R]) -> R:
        data = self._instance()
        with data.lock:
            return fn(_MemoryTxn(data))

    async def _release(self) -> None:
        data, self._data = self._data, None
        if data is not None and self._name:
            with _shared_lock:
                data.users -= 1
                if data.users == 0:
                    del _shared[self._name]


async def open_memory(uri: str, *, lease_ms: int = 3000,
                      poll_interval_ms: int = 50) -> MemoryStore:
    """Open ``memory://`` (private) or ``memory://NAME`` (shared in-process)."""
    if not uri.startswith(SCHEME):
        raise ConfigError(f"not a memory:// URI: {uri!r}")
    name = uri[len(SCHEME):]
    with _shared_lock:
        data = _shared.get(name) or _Instance()
        store = MemoryStore(uri, name, data, lease_ms=lease_ms,
                            poll_interval_ms=poll_interval_ms)
        if name:
            data.users += 1
            _shared[name] = data
    return store
