"""The bookie storage engine: journal, write cache, entry logs, LMDB index.

Synchronous (no asyncio, no network); see
:mod:`quire.bookie.storage.bookie_storage` for the design and the threading
contract, and the ``journal``, ``entry_log``, ``index`` and ``state``
modules for the on-disk byte layouts.
"""

from quire.bookie.storage.bookie_storage import BookieStorage, StorageStats
from quire.bookie.storage.config import StorageConfig
from quire.bookie.storage.engine_checkpoints import CheckpointStats
from quire.bookie.storage.engine_state import LAST_ENTRY
from quire.bookie.storage.journal import Journal, JournalCounters
from quire.bookie.storage.journal_format import JournalMark
from quire.bookie.storage.journal_state import SyncStats
from quire.bookie.storage.shutdown import LastShutdown, ShutdownKind
from quire.bookie.storage.state import LedgerState

__all__ = [
    "LAST_ENTRY",
    "BookieStorage",
    "CheckpointStats",
    "Journal",
    "JournalCounters",
    "JournalMark",
    "LastShutdown",
    "LedgerState",
    "ShutdownKind",
    "StorageConfig",
    "StorageStats",
    "SyncStats",
]
