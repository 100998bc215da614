"""Per-ledger state a bookie keeps durably (not the ledger's metadata).

Not to be confused with :class:`quire.types.LedgerState` (the metadata
store's OPEN/IN_RECOVERY/CLOSED): this is what one bookie knows about its
own copy of a ledger.

Encoding (value of the LMDB ``ledgers`` table and body of the journal's
LEDGER_STATE record), all integers big-endian::

    offset  size  field
    0       1     version = 1
    1       1     flags: bit 0 fenced, bit 1 limbo (other bits must be 0)
    2       8     explicit_lac (int64, -1 = none)
    10      1     master key length K
    11      K     master key (normally 20 bytes: SHA-1 of the password)
    11+K    4     sync cursor length C (uint32)
    15+K    C     sync cursor (opaque bytes, reserved for BP-14/46 work)

A decoder meeting another version raises :class:`~quire.errors.StorageError`
(state is never silently dropped).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from quire.errors import StorageError

STATE_VERSION = 1
_FLAG_FENCED = 0x01
_FLAG_LIMBO = 0x02
_KNOWN_FLAGS = _FLAG_FENCED | _FLAG_LIMBO
_HEAD = struct.Struct(">BBqB")
_U32 = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class LedgerState:
    """What the bookie stores about one ledger it has seen."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    limbo: bool = False
    """Reserved (BP-46): the bookie may have lost entries of this ledger."""
    sync_cursor: bytes = b""
    """Reserved: opaque to the storage engine."""

    def encode(self) -> bytes:
        if len(self.master_key) > 255:
            raise ValueError("master key longer than 255 bytes")
        flags = (_FLAG_FENCED if self.fenced else 0) | (_FLAG_LIMBO if self.limbo else 0)
        return b"".join((
            _HEAD.pack(STATE_VERSION, flags, self.explicit_lac, len(self.master_key)),
            self.master_key,
            _U32.pack(len(self.sync_cursor)),
            self.sync_cursor,
        ))

    @classmethod
    def decode(cls, data: bytes | memoryview) -> LedgerState:
        data = bytes(data)
        try:
            version, flags, lac, key_len = _HEAD.unpack_from(data, 0)
            if version != STATE_VERSION:
                raise StorageError(f"unknown ledger state version {version}")
            if flags & ~_KNOWN_FLAGS:
                raise StorageError(f"unknown ledger state flags {flags:#x}")
            pos = _HEAD.size
            key = data[pos:pos + key_len]
            pos += key_len
            (cursor_len,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            cursor = data[pos:pos + cursor_len]
            if len(key) != key_len or len(cursor) != cursor_len or pos + cursor_len != len(data):
                raise StorageError("ledger state has a wrong length")
        except struct.error as e:
            raise StorageError(f"truncated ledger state: {e}") from None
        return cls(key, bool(flags & _FLAG_FENCED), lac, bool(flags & _FLAG_LIMBO), cursor)
