"""Quire's metadata store: ledgers, the bookie registry, cookies, named
records, leased records and leader election, behind one async
:class:`MetadataStore` interface.

Open one with :func:`open_store`; the URI picks the driver:

* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``: the
  embedded default, shared safely by the processes of one host;
* ``zk://host:port[,host:port...]/chroot``: a ZooKeeper ensemble, with
  digest ACLs and TLS if the ``zookeeper_*`` options say so
  (:class:`~quire.security.ZooKeeperSecurityConfig`); :func:`secure_store`
  gives a tree made without ACLs the ACL;
* ``memory://`` or ``memory://NAME``: in-process, for unit tests.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

from quire.errors import ConfigError
from quire.metadata._zkaccess import SecuredTree
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
from quire.metadata.zookeeper import open_zookeeper, secure_zookeeper
from quire.security import ZooKeeperSecurityConfig

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
    "SecuredTree",
    "UpdateLedger",
    "UpdateRecord",
    "Versioned",
    "Watch",
    "deserialize",
    "ledger_json",
    "open_leased_store",
    "open_store",
    "read_leader",
    "secure_store",
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
    ``session_timeout_ms``, ``connect_timeout_ms`` and the ``zookeeper_*``
    keys of :class:`~quire.security.ZooKeeperSecurityConfig` (zk; another
    store refuses them unless they are empty).  An unknown scheme or option
    raises :class:`~quire.errors.ConfigError`; a store that cannot be
    reached raises :class:`~quire.errors.MetadataError`, one that refuses
    this process :class:`~quire.errors.MetadataAccessDeniedError`.
    """
    scheme, separator, _ = uri.partition("://")
    opener = _DRIVERS.get(scheme) if separator else None
    if opener is None:
        raise ConfigError(f"unknown metadata store URI {uri!r}: expected sqlite:///path.db, "
                          "zk://host:port/chroot or memory://")
    if scheme != "zk":
        given = [name for name in _ZOOKEEPER_OPTIONS if options.pop(name, "")]
        if given:
            raise ConfigError(f"{', '.join(given)}: for zk:// metadata stores only, "
                              f"not {scheme}://")
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


async def open_leased_store(uri: str, lease_ms: int = 0, **options: Any) -> MetadataStore:
    """Open the store of a process whose liveness it holds (a bookie's
    registration, a segment store's host record, a controller's session):
    ``lease_ms`` is the lease of the embedded drivers and the session
    timeout of ZooKeeper, whose lease *is* its session (0: the driver's
    default).  One key therefore sets how long a process cut off from the
    store keeps its leased records, whatever the driver.  ``options``: as
    :func:`open_store`'s (the process's ``zookeeper_*`` settings)."""
    if lease_ms <= 0:
        return await open_store(uri, **options)
    if uri.startswith("zk://"):
        return await open_store(uri, session_timeout_ms=lease_ms, **options)
    return await open_store(uri, lease_ms=lease_ms, **options)


async def secure_store(uri: str, settings: ZooKeeperSecurityConfig, *,
                       progress: Callable[[SecuredTree], None] | None = None) -> SecuredTree:
    """Give every znode of the ``zk://`` store at ``uri`` the ACL of
    ``settings``' ``zookeeper_digest_file`` (``quire metadata secure``): the
    upgrade in place of a tree made without ACLs; idempotent, ``progress``
    called as it goes.  ConfigError for another store (only ZooKeeper's
    nodes carry ACLs: a SQLite file is guarded by its file mode)."""
    if not uri.startswith("zk://"):
        raise ConfigError(f"only a zk:// metadata store has ACLs to set, not {uri!r}")
    return await secure_zookeeper(uri, settings, progress=progress)


_ZOOKEEPER_OPTIONS = tuple(f.name for f in fields(ZooKeeperSecurityConfig))
