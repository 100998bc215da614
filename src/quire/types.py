"""Small value types shared by every layer (no imports from the rest of Quire)."""

from __future__ import annotations

import enum


class LedgerType(enum.Enum):
    """How durable an acknowledged add is (BP-14); stored in ledger metadata,
    fixed for the ledger's life."""

    PD_JOURNAL = "PD_JOURNAL"
    """Persistent durability: acknowledged after the journal fsync (default)."""
    VD_JOURNAL = "VD_JOURNAL"
    """Volatile durability: acknowledged once in the journal file (page cache)."""


class DigestType(enum.Enum):
    """Digest protecting every stored entry (computed by the writer)."""

    CRC32C = "CRC32C"
    CRC32 = "CRC32"
    HMAC_SHA1 = "HMAC_SHA1"
    NONE = "NONE"


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class BookieState(enum.Enum):
    WRITABLE = "WRITABLE"
    READ_ONLY = "READ_ONLY"


NO_ENTRY = -1
"""Entry id meaning "none yet" (an empty ledger's LAC, last entry id...)."""
