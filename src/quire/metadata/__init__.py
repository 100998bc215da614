"""Quire's metadata store: ledgers, the bookie registry, cookies, named
records, leased records and leader election, behind one async
:class:`MetadataStore` interface.

Open one with :func:`open_store`; the URI picks the driver:

* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``: the
  embedded default, shared safely by the processes of one host;
* ``zk://host:port[,host:port...]/chroot``: a ZooKeeper ensemble;
* ``memory://`` or ``memory://NAME``: in-process, for unit tests.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from quire.errors import ConfigError
from quire.metadata.election import read_leader, watch_leader
from quire.metadata.memory import open_memory
from quire.metadata.model import (
    BookieInfo,
    CheckRecord,
    CreateLedger,
    CreateRecord,
    DeleteLedger,
    DeleteRecord,
    LedgerMetadata,
    Op,
    UpdateLedger,
    UpdateRecord,
    Versioned,
    deserialize,
    ledger_json,
    serialize,
)
from quire.metadata.sqlite import open_sqlite
from quire.metadata.store import (
    Election,
    ElectionView,
    Leadership,
    LeaseState,
    MetadataStore,
    Watch,
)
from quire.metadata.zookeeper import open_zookeeper

log = logging.getLogger("quire.metadata")

__all__ = [
    "BookieInfo",
    "CheckRecord",
    "CreateLedger",
    "CreateRecord",
    "DeleteLedger",
    "DeleteRecord",
    "Election",
    "ElectionView",
    "Leadership",
    "LeaseState",
    "LedgerMetadata",
    "MetadataStore",
    "Op",
    "UpdateLedger",
    "UpdateRecord",
    "Versioned",
    "Watch",
    "deserialize",
    "ledger_json",
    "open_leased_store",
    "open_store",
    "read_leader",
    "serialize",
    "watch_leader",
]

_DRIVERS: dict[str, Callable[..., Awaitable[MetadataStore]]] = {
    "memory": open_memory,
    "sqlite": open_sqlite,
    "zk": open_zookeeper,
}


async def open_store(uri: str, *, create: bool = True, **options: Any) -> MetadataStore:
    """Open the store named by ``uri``, connected and ready.

    ``create``: a store that does not exist yet (no SQLite file, no layout
    under the ZooKeeper chroot) is initialised, as a server or a command
    that creates things needs; its ``initialised`` attribute then says so.
    A caller that only reads passes ``create=False`` and gets
    :class:`~quire.errors.NoMetadataError` instead (reading never creates).

    ``options`` are the driver's keyword options: ``lease_ms`` and
    ``poll_interval_ms`` (memory, sqlite), ``busy_timeout_ms`` (sqlite),
    ``session_timeout_ms`` and ``connect_timeout_ms`` (zk).  An unknown
    scheme or option raises :class:`~quire.errors.ConfigError`; a store that
    cannot be reached raises :class:`~quire.errors.MetadataError`.
    """
    scheme, separator, _ = uri.partition("://")
    opener = _DRIVERS.get(scheme) if separator else None
    if opener is None:
        raise ConfigError(f"unknown metadata store URI {uri!r}: expected sqlite:///path.db, "
                          "zk://host:port/chroot or memory://")
    try:
        inspect.signature(opener).bind(uri, **options)
    except TypeError as e:
        raise ConfigError(f"bad option for a {scheme}:// metadata store: {e}") from None
    if scheme != "memory":
        options["create"] = create
    store = await opener(uri, **options)
    if getattr(store, "initialised", False):
        log.info("%s: initialised a new Quire metadata store", uri)
    return store


async def open_leased_store(uri: str, lease_ms: int = 0) -> MetadataStore:
    """Open the store of a process whose liveness it holds (a bookie's
    registration, a segment store's host record, a controller's session):
    ``lease_ms`` is the lease of the embedded drivers and the session
    timeout of ZooKeeper, whose lease *is* its session (0: the driver's
    default).  One key therefore sets how long a process cut off from the
    store keeps its leased records, whatever the driver."""
    if lease_ms <= 0:
        return await open_store(uri)
    if uri.startswith("zk://"):
        return await open_store(uri, session_timeout_ms=lease_ms)
    return await open_store(uri, lease_ms=lease_ms)
