"""The journal's byte layout and its codecs (sans-IO): file names and
headers, records and their bodies, and :class:`JournalMark` positions.  The
journal that writes and reads them is :mod:`~quire.bookie.storage.journal`.

Files
-----
``journal/<file seq:016x>.jnl`` (file seqs start at 1 and only grow; a
file kept for reuse is ``<file seq:016x>.jnl.free``).  Each file starts
with a 64-byte header, big-endian::

    offset  size  field
    0       4     magic b"QJNL"
    4       2     format version = 2 (1 is still read)
    6       2     reserved (0)
    8       8     file seq (uint64)
    16      8     prev file seq: the file this one continues (uint64)
    24      8     prev end offset: where valid records of that file ended
    32      4     crc32c of bytes 0..31
    36      28    reserved (0)

The (prev file seq, prev end offset) link names where the previous file's
valid records ended: replay stops where a file does not continue the one
before it (see "Files" in :mod:`~quire.bookie.storage.journal`).

From format version 2 every record's crc is XORed with a *salt* of the file
seq it is written in (``crc32c`` of the seq, 8 bytes big-endian), so that
the old records a reused file still holds after its new end of data fail
the check and end replay like a torn tail (see "Reused files" in
:mod:`~quire.bookie.storage.journal`).  Version 1 files have salt 0.

Records
-------
Records follow the header back to back, never split across files::

    offset  size  field
    0       4     length L of type + body (uint32, >= 1; 0 = end of data)
    4       4     crc32c of type + body, XOR the file's salt (uint32)
    8       1     record type
    9       L-1   body

Bodies (integers big-endian, ids unsigned 64-bit):

=================  ====  ===================================================
type               code  body
=================  ====  ===================================================
ADD_ENTRY          1     ledger_id u64, entry_id u64, entry bytes (the rest)
SET_MASTER_KEY     2     ledger_id u64, master key (the rest; 20 bytes)
FENCE              3     ledger_id u64
EXPLICIT_LAC       4     ledger_id u64, lac i64
LEDGER_STATE       5     ledger_id u64, encoded LedgerState (see ``state``)
DELETE_LEDGER      6     ledger_id u64
=================  ====  ===================================================

Replay of a file stops at the first record whose length is 0, runs past the
end of the file, or whose crc does not match (a torn or never-written tail).

Positions
---------
A :class:`JournalMark` ``(file_seq, offset)`` is a position in that file
(see "Positions" in :mod:`~quire.bookie.storage.journal`).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import add, xor
from typing import NamedTuple

from crc32c import crc32c

REC_ADD_ENTRY = 1
REC_SET_MASTER_KEY = 2
REC_FENCE = 3
REC_EXPLICIT_LAC = 4
REC_LEDGER_STATE = 5
REC_DELETE_LEDGER = 6

FILE_MAGIC = b"QJNL"
FILE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
FILE_HEADER_SIZE = 64
_FILE_HEADER = struct.Struct(">4sHHQQQ")  # 32 bytes, then crc u32, then zeros
U32 = struct.Struct(">I")
REC_HEADER = struct.Struct(">II")  # length, crc
REC_HEADER_SIZE = REC_HEADER.size
_ADD_HEAD = struct.Struct(">BQQ")  # type, ledger, entry (covered by the crc)
ADD_RECORD_OVERHEAD = REC_HEADER_SIZE + _ADD_HEAD.size
"""Bytes of an ADD_ENTRY record besides its entry."""
_LEDGER = struct.Struct(">Q")
_LEDGER_LAC = struct.Struct(">Qq")
_LEDGER_ENTRY = struct.Struct(">QQ")
_TYPE = struct.Struct(">B")
JOURNAL_SUFFIX = ".jnl"
FREE_SUFFIX = ".jnl.free"
MAX_RECORD_BYTES = 0xFFFFFFFF
"""Largest length field of a record (its type and body)."""


class JournalMark(NamedTuple):
    """A position in the journal: ``offset`` bytes into file ``file_seq``."""

    file_seq: int
    offset: int


class JournalRecord(NamedTuple):
    """One replayed record; ``end`` is the position just after it."""

    rtype: int
    body: bytes
    end: JournalMark


# --- records ---------------------------------------------------------------


def encode_record(rtype: int, body: bytes | bytearray | memoryview = b"") -> bytes:
    """Frame one record: ``[len][crc][type][body]``."""
    type_byte = _TYPE.pack(rtype)
    length = 1 + len(body)
    if length > MAX_RECORD_BYTES:
        raise ValueError("journal record too large")
    return REC_HEADER.pack(length, crc32c(body, crc32c(type_byte))) + type_byte + bytes(body)


def add_records(ledger_ids: Sequence[int], entry_ids: Sequence[int],
                entries: Sequence[bytes], salt: int) -> bytes:
    """ADD_ENTRY records for one file (crcs XORed with its ``salt``), back to
    back, built by C-level ``map`` steps: the one place their bytes are laid
    out for appends (:func:`encode_record` frames the other types)."""
    heads = list(map(_ADD_HEAD.pack, repeat(REC_ADD_ENTRY), ledger_ids, entry_ids))
    crcs = map(xor, map(crc32c, entries, map(crc32c, heads)), repeat(salt))
    records = map(REC_HEADER.pack, map(add, repeat(_ADD_HEAD.size), map(len, entries)), crcs)
    return b"".join(chain.from_iterable(zip(records, heads, entries, strict=True)))


def encode_set_master_key(ledger_id: int, master_key: bytes) -> bytes:
    return encode_record(REC_SET_MASTER_KEY, _LEDGER.pack(ledger_id) + master_key)


def encode_fence(ledger_id: int) -> bytes:
    return encode_record(REC_FENCE, _LEDGER.pack(ledger_id))


def encode_explicit_lac(ledger_id: int, lac: int) -> bytes:
    return encode_record(REC_EXPLICIT_LAC, _LEDGER_LAC.pack(ledger_id, lac))


def encode_ledger_state(ledger_id: int, encoded_state: bytes) -> bytes:
    return encode_record(REC_LEDGER_STATE, _LEDGER.pack(ledger_id) + encoded_state)


def encode_delete_ledger(ledger_id: int) -> bytes:
    return encode_record(REC_DELETE_LEDGER, _LEDGER.pack(ledger_id))


def decode_ledger_id(body: bytes) -> int:
    """The ledger id every record body starts with."""
    return int(_LEDGER.unpack_from(body, 0)[0])


def decode_add_entry(body: bytes) -> tuple[int, int, bytes]:
    """``(ledger_id, entry_id, entry)`` of an ADD_ENTRY body."""
    ledger_id, entry_id = _LEDGER_ENTRY.unpack_from(body, 0)
    return ledger_id, entry_id, body[16:]


def decode_explicit_lac(body: bytes) -> tuple[int, int]:
    ledger_id, lac = _LEDGER_LAC.unpack_from(body, 0)
    return int(ledger_id), int(lac)


def scan_records(data: mmap.mmap | bytes, start: int,
                 salt: int) -> Iterator[tuple[int, bytes, int]]:
    """``(type, body, end offset)`` for each valid record from ``start``."""
    size = len(data)
    pos = start
    header = REC_HEADER
    while pos + REC_HEADER_SIZE < size:
        length, crc = header.unpack_from(data, pos)
        if length == 0:
            return
        end = pos + REC_HEADER_SIZE + length
        if end > size:
            return
        payload = data[pos + REC_HEADER_SIZE:end]
        if crc32c(payload) ^ salt != crc:
            return
        yield payload[0], payload[1:], end
        pos = end


# --- files ------------------------------------------------------------------


def encode_file_header(file_seq: int, prev: JournalMark) -> bytes:
    head = _FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0, file_seq, prev.file_seq, prev.offset)
    out = head + U32.pack(crc32c(head))
    return out + bytes(FILE_HEADER_SIZE - len(out))


def file_salt(file_seq: int, version: int = FILE_VERSION) -> int:
    """What record crcs of file ``file_seq`` are XORed with (see "Files" above)."""
    return crc32c(_LEDGER.pack(file_seq)) if version >= 2 else 0


def decode_file_header(data: bytes | mmap.mmap) -> tuple[int, JournalMark, int] | None:
    """``(file_seq, prev, salt)`` or None if the header is missing or corrupt."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    head = bytes(data[:_FILE_HEADER.size])
    (crc,) = U32.unpack_from(data, _FILE_HEADER.size)
    if crc != crc32c(head):
        return None
    magic, version, _reserved, file_seq, prev_seq, prev_off = _FILE_HEADER.unpack(head)
    if magic != FILE_MAGIC or version not in _READABLE_VERSIONS:
        return None
    return file_seq, JournalMark(prev_seq, prev_off), file_salt(file_seq, version)


def journal_file_name(file_seq: int) -> str:
    return f"{file_seq:016x}{JOURNAL_SUFFIX}"
