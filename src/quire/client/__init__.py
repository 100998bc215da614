"""Quire's ledger client (BookKeeper's client, asyncio).

Entry points: :class:`Client` (async) and :class:`SyncClient` (blocking).
Modules, one job each:

* :mod:`~quire.client.config` -- :class:`ClientConfig`;
* :mod:`~quire.client.context` -- what every handle of one client shares;
* :mod:`~quire.client.placement` -- ensemble choice and striped write sets;
* :mod:`~quire.client.reads` -- entry reads from replicas;
* :mod:`~quire.client.batch_reads` -- BP-62 batch reads;
* :mod:`~quire.client.ledger` -- :class:`ReadHandle` and :class:`WriteHandle`;
* :mod:`~quire.client.recovery` -- fencing and closing a ledger;
* :mod:`~quire.client.client`, :mod:`~quire.client.sync_client` -- the clients.

Bookies are called through :mod:`quire.peer` (connections, the bookie pool,
typed calls).
"""

from quire.client.client import Client
from quire.client.config import ClientConfig
from quire.client.ledger import ReadHandle, WriteHandle
from quire.client.reads import LedgerEntry
from quire.client.sync_client import SyncClient, SyncReadHandle, SyncWriteHandle

__all__ = [
    "Client",
    "ClientConfig",
    "LedgerEntry",
    "ReadHandle",
    "SyncClient",
    "SyncReadHandle",
    "SyncWriteHandle",
    "WriteHandle",
]
