"""Quire: a replicated log store (BookKeeper-style ledgers).

The ledger client and the names its users need::

    import quire

    client = await quire.Client.connect("sqlite:////tmp/quire/meta.db")
    ledger = await client.create_ledger(ensemble_size=3, write_quorum_size=3,
                                        ack_quorum_size=2, password=b"secret")

The ledger client's names are loaded on first use (PEP 562): importing a
module of another layer (``quire.errors``, ``quire.streams``, the Spark data
source in a fresh Python worker) does not pay for the ledger client.
"""

from typing import TYPE_CHECKING, Any

from quire.errors import (
    BookieUnavailableError,
    ClientClosedError,
    ClientError,
    ClientTimeoutError,
    DigestMismatchError,
    EnsembleChangeRefusedError,
    EntryNotAvailableError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotSyncedError,
    LedgerRecoveryError,
    MetadataError,
    MetadataNotFoundError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    QueueFullError,
    QuireError,
    ReadBeyondLastAddConfirmedError,
    UnauthorizedError,
)
from quire.types import DigestType, LedgerState, LedgerType

if TYPE_CHECKING:
    from quire.client import (
        Client,
        ClientConfig,
        LedgerEntry,
        LedgerPasswords,
        ReadHandle,
        SyncClient,
        WriteHandle,
    )

_CLIENT_NAMES = frozenset({"Client", "ClientConfig", "LedgerEntry", "LedgerPasswords",
                           "ReadHandle", "SyncClient", "WriteHandle"})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        import quire.client

        value = getattr(quire.client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'quire' has no attribute {name!r}")

__all__ = [
    "BookieUnavailableError",
    "Client",
    "ClientClosedError",
    "ClientConfig",
    "ClientError",
    "ClientTimeoutError",
    "DigestMismatchError",
    "DigestType",
    "EnsembleChangeRefusedError",
    "EntryNotAvailableError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerFencedError",
    "LedgerNotSyncedError",
    "LedgerPasswords",
    "LedgerRecoveryError",
    "LedgerState",
    "LedgerType",
    "MetadataError",
    "MetadataNotFoundError",
    "NoSuchEntryError",
    "NotEnoughBookiesError",
    "QueueFullError",
    "QuireError",
    "ReadBeyondLastAddConfirmedError",
    "ReadHandle",
    "SyncClient",
    "UnauthorizedError",
    "WriteHandle",
]
