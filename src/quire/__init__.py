"""Quire: a replicated log store (BookKeeper-style ledgers).

The ledger client and the names its users need::

    import quire

    client = await quire.Client.connect("sqlite:////tmp/quire/meta.db")
    ledger = await client.create_ledger(ensemble_size=3, write_quorum_size=3,
                                        ack_quorum_size=2, password=b"secret")
"""

from quire.client import (
    Client,
    ClientConfig,
    LedgerEntry,
    ReadHandle,
    SyncClient,
    WriteHandle,
)
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
