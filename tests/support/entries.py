"""Stored entries for storage-engine tests.

The engine keeps an entry verbatim and, like BookKeeper's, relies on it
beginning with its ledger id and entry id (big-endian u64 each), as every
stored entry of the protocol does; it checks those ids when it reads the
entry back from an entry log.
"""

from __future__ import annotations

import struct

_IDS = struct.Struct(">QQ")


def stored_entry(ledger_id: int, entry_id: int, body: bytes) -> bytes:
    """The ids the engine expects, then ``body``."""
    return _IDS.pack(ledger_id, entry_id) + body


def filler_entry(ledger_id: int, entry_id: int, size: int, pattern: bytes) -> bytes:
    """A ``size``-byte stored entry (at least the 16 bytes of ids) whose body
    repeats ``pattern`` (a ``%d %d`` format, filled with the ids)."""
    body = pattern % (ledger_id, entry_id) * (size // 2 + 1)
    return stored_entry(ledger_id, entry_id, body)[:max(size, _IDS.size)]
