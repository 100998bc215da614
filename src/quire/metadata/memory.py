"""The ``memory://`` driver: an in-process store, for unit tests only.

``memory://`` opens a private instance; ``memory://NAME`` shares one instance
among every store opened with that name in this process, until the last of
them is closed.  Bookie leases work as in SQLite (a store that stops renewing
loses its registrations), so tests see the same liveness behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

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

    def ledger_ids(self) -> list[int]:
        return sorted(k for k in self._data.rows[Table.LEDGERS] if isinstance(k, int))

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


class MemoryStore(EmbeddedStore):
    """An in-process :class:`~quire.metadata.store.MetadataStore`."""

    def __init__(self, uri: str, name: str, data: _Instance, *,
                 lease_ms: int, poll_interval_ms: int) -> None:
        super().__init__(uri, lease_ms=lease_ms, poll_interval_ms=poll_interval_ms)
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
