"""Quire's ledger client (BookKeeper's client, asyncio).

Entry points: :class:`Client` (async) and :class:`SyncClient` (blocking).
Modules, one job each:

* :mod:`~quire.client.config` -- :class:`ClientConfig`;
* :mod:`~quire.client.context` -- what every handle of one client shares;
* :mod:`~quire.client.placement` -- ensemble choice and striped write sets;
* :mod:`~quire.client.reads` -- entry reads from replicas;
* :mod:`~quire.client.batch_reads` -- BP-62 batch reads;
* :mod:`~quire.client.read_handle` -- :class:`ReadHandle`;
* :mod:`~quire.client.write_handle` -- :class:`WriteHandle`, the add path;
* :mod:`~quire.client.ensemble_change` -- a writer's replacement of failed bookies;
* :mod:`~quire.client.writer_lac` -- BP-14's LAC and ``sync()``, WRITE_LAC;
* :mod:`~quire.client.ledger_metadata` -- a writer's compare-and-set of its metadata;
* :mod:`~quire.client.recovery` -- fencing and closing a ledger;
* :mod:`~quire.client.passwords` -- a ledger's keys from the caller's password(s);
* :mod:`~quire.client.client`, :mod:`~quire.client.sync_client` -- the clients.

Bookies are called through :mod:`quire.peer` (connections, the bookie pool,
typed calls).
"""

from quire.client.client import Client
from quire.client.config import ClientConfig
from quire.client.passwords import LedgerPasswords, Password, keys_for
from quire.client.read_handle import ReadHandle
from quire.client.reads import LedgerEntry
from quire.client.sync_client import SyncClient, SyncReadHandle, SyncWriteHandle
from quire.client.write_handle import WriteHandle

__all__ = [
    "Client",
    "ClientConfig",
    "LedgerEntry",
    "LedgerPasswords",
    "Password",
    "ReadHandle",
    "SyncClient",
    "SyncReadHandle",
    "SyncWriteHandle",
    "WriteHandle",
    "keys_for",
]
