"""The stored entry format and its digests (layout in :mod:`quire.protocol`).

The writer builds each entry once; bookies store and return it verbatim; the
reader verifies the digest and the ids before it trusts a byte of payload::

    i64 ledger_id | i64 entry_id | i64 lac | i64 length | digest | payload
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from dataclasses import dataclass

import crc32c as _crc32c

from quire.errors import DigestMismatchError
from quire.security.ledger_keys import LedgerKeys, mac_key
from quire.types import DigestType

ENTRY_HEADER_LEN = 32
_ENTRY_HEADER = struct.Struct(">qqqq")
_IDS = struct.Struct(">qq")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CRC32C_RECORD = struct.Struct(">Iqq16xI")
"""A batch answer's record of a CRC32C entry: length, ledger and entry id,
(lac and length skipped), digest."""

DIGEST_LEN = {
    DigestType.CRC32C: 4,
    DigestType.CRC32: 8,
    DigestType.HMAC_SHA1: 20,
    DigestType.NONE: 0,
}


def peek_entry_ids(entry: bytes | memoryview) -> tuple[int, int]:
    """``(ledger_id, entry_id)`` of a stored entry without verifying it."""
    if len(entry) < _IDS.size:
        raise ValueError("entry shorter than its ids")
    ledger_id, entry_id = _IDS.unpack_from(entry)
    return ledger_id, entry_id


@dataclass(frozen=True, slots=True)
class EntryHeader:
    ledger_id: int
    entry_id: int
    lac: int
    length: int


class DigestManager:
    """Builds and verifies stored entries of one ledger."""

    __slots__ = ("_hmac_key", "digest_len", "digest_type", "ledger_id")

    def __init__(self, ledger_id: int, digest_type: DigestType, password: bytes) -> None:
        self._set(ledger_id, digest_type,
                  mac_key(password) if digest_type is DigestType.HMAC_SHA1 else b"")

    @classmethod
    def of_keys(cls, ledger_id: int, digest_type: DigestType, keys: LedgerKeys
                ) -> DigestManager:
        """The manager of a ledger whose keys are known, not its password
        (what the metadata store keeps)."""
        manager = cls.__new__(cls)
        manager._set(ledger_id, digest_type,
                     keys.mac_key if digest_type is DigestType.HMAC_SHA1 else b"")
        return manager

    def _set(self, ledger_id: int, digest_type: DigestType, hmac_key: bytes) -> None:
        self.ledger_id = ledger_id
        self.digest_type = digest_type
        self.digest_len = DIGEST_LEN[digest_type]
        self._hmac_key = hmac_key

    def _digest(self, header: bytes | memoryview, payload: bytes | memoryview) -> bytes:
        kind = self.digest_type
        if kind is DigestType.CRC32C:
            return _U32.pack(_crc32c.crc32c(payload, _crc32c.crc32c(header)))
        if kind is DigestType.CRC32:
            return _U64.pack(zlib.crc32(payload, zlib.crc32(header)))
        if kind is DigestType.HMAC_SHA1:
            mac = hmac.new(self._hmac_key, header, hashlib.sha1)
            mac.update(payload)
            return mac.digest()
        return b""

    def encode(self, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """One stored entry; ``length`` is the ledger's payload bytes up to
        and including this entry."""
        header = _ENTRY_HEADER.pack(self.ledger_id, entry_id, lac, length)
        return b"".join((header, self._digest(header, payload), payload))

    def verify_payload(self, entry: bytes, entry_id: int) -> bytes:
        """The payload of ``entry`` after the same checks as :meth:`verify`
        (the reader's hot path: no header object, one copy)."""
        head_len = ENTRY_HEADER_LEN + self.digest_len
        if len(entry) < head_len:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry of {len(entry)} bytes is shorter than its header")
        ledger_id, found_id = _IDS.unpack_from(entry)
        if ledger_id != self.ledger_id or found_id != entry_id:
            raise DigestMismatchError(
                f"entry is {ledger_id}:{found_id}, expected {self.ledger_id}:{entry_id}")
        kind = self.digest_type
        if kind is DigestType.CRC32C:
            view = memoryview(entry)
            ok = _U32.unpack_from(entry, ENTRY_HEADER_LEN)[0] == _crc32c.crc32c(
                view[head_len:], _crc32c.crc32c(view[:ENTRY_HEADER_LEN]))
        else:
            view = memoryview(entry)
            ok = hmac.compare_digest(self._digest(view[:ENTRY_HEADER_LEN], view[head_len:]),
                                     view[ENTRY_HEADER_LEN:head_len])
        if not ok:
            raise DigestMismatchError(f"digest mismatch on entry {ledger_id}:{found_id}")
        return entry[head_len:]

    def verify_records(self, records: bytes, first_entry_id: int, max_count: int
                       ) -> list[bytes]:
        """The payloads of the first ``max_count`` entries of ``records``, a
        batch answer's entry list ``(u32 entry_len | entry)*`` whose entries
        should be ``first_entry_id, +1, ...``, up to the first that fails
        :meth:`verify_payload`'s checks: the verified prefix, possibly empty.
        For CRC32C (the batch-read hot path) one pass over the bytes: per
        entry one unpack, two checksum calls over views, one payload copy."""
        payloads: list[bytes] = []
        append = payloads.append
        expected = first_entry_id
        end = len(records)
        if self.digest_type is not DigestType.CRC32C:
            pos = 0
            while pos + 4 <= end and len(payloads) < max_count:
                stop = pos + 4 + _U32.unpack_from(records, pos)[0]
                try:
                    append(self.verify_payload(records[pos + 4:stop], expected))
                except DigestMismatchError:
                    break
                pos = stop
                expected += 1
            return payloads
        crc = _crc32c.crc32c
        unpack = _CRC32C_RECORD.unpack_from
        view = memoryview(records)
        ledger = self.ledger_id
        last = first_entry_id + max_count - 1
        header_at = 4  # record offset of the entry (and of its 32-byte header)
        payload_at = header_at + ENTRY_HEADER_LEN + 4  # after the u32 digest
        pos = 0
        try:
            while pos < end and expected <= last:
                size, ledger_id, entry_id, digest = unpack(records, pos)
                stop = pos + 4 + size
                if (ledger_id != ledger or entry_id != expected or size < payload_at - 4
                        or stop > end):
                    break
                start = pos + payload_at
                if crc(view[start:stop], crc(view[pos + header_at:start - 4])) != digest:
                    break
                append(records[start:stop])
                pos = stop
                expected += 1
        except struct.error:  # a record too short for its header
            pass
        return payloads

    def verify(self, entry: bytes, expected_entry_id: int | None = None
               ) -> tuple[EntryHeader, memoryview]:
        """Check digest and ids; return the header and a view of the payload.

        Raises :class:`DigestMismatchError` for any entry that is short, has a
        bad digest, or belongs to another ledger or entry id.
        """
        view = memoryview(entry)
        head_len = ENTRY_HEADER_LEN + self.digest_len
        if len(view) < head_len:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry of {len(view)} bytes is shorter than its header")
        ledger_id, entry_id, lac, length = _ENTRY_HEADER.unpack_from(view)
        if ledger_id != self.ledger_id or (
                expected_entry_id is not None and entry_id != expected_entry_id):
            raise DigestMismatchError(
                f"entry is {ledger_id}:{entry_id}, expected "
                f"{self.ledger_id}:{expected_entry_id}")
        payload = view[head_len:]
        expected = self._digest(view[:ENTRY_HEADER_LEN], payload)
        if not hmac.compare_digest(expected, view[ENTRY_HEADER_LEN:head_len]):
            raise DigestMismatchError(f"digest mismatch on entry {ledger_id}:{entry_id}")
        return EntryHeader(ledger_id, entry_id, lac, length), payload
