"""Table segments: a key-value table kept as the data of a TABLE segment (sans-IO).

A table update is one append to the segment, a batch of entries::

    entry := key_length:u32 | value_length:i32 | key | value
             (value_length -1: the key's removal, no value bytes)

A key's *version* is the offset of its latest entry in the segment, so
versions are non-negative and increase, and a reader that remembers a
position can ask for every entry after it (:func:`decode_entries`).  The
index (key to version and value) is memory only: the container rebuilds it
from the segment's data on replay.  For PDP-40 (part 2) it will become a
segment of its own (``<segment>$index``) holding offsets into this one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from quire.errors import (
    CorruptRecordError,
    SegmentStoreError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
)

_HEAD = struct.Struct(">Ii")
ANY_VERSION: int | None = None
"""An entry's expected version: unconditional."""
NOT_EXISTS = -1
"""An entry's expected version: the key must not exist."""
MAX_KEY_BYTES = 8192
MAX_VALUE_BYTES = 1040384


@dataclass(frozen=True, slots=True)
class TableEntry:
    key: bytes
    value: bytes | None
    """None when read with ``keys_only``."""
    version: int


@dataclass(frozen=True, slots=True)
class TableIteratorPage:
    """One page of :meth:`~quire.segmentstore.SegmentStore.table_iterate`;
    ``token`` resumes after it (None: the table was read to its end)."""

    entries: list[TableEntry]
    token: bytes | None


@dataclass(frozen=True, slots=True)
class TableDelta:
    """Live entries whose version is at or after the position asked for, in
    version order; ``last_position`` is where to ask next (past removals and
    overwritten entries too); ``should_clear``: the position was truncated
    away, so the reader must start again from scratch."""

    entries: list[TableEntry]
    last_position: int
    should_clear: bool


def encode_batch(entries: Sequence[tuple[bytes, bytes | None]]) -> tuple[bytes, list[int]]:
    """The bytes of a batch and each entry's offset within it."""
    parts: list[bytes] = []
    offsets: list[int] = []
    at = 0
    for key, value in entries:
        offsets.append(at)
        head = _HEAD.pack(len(key), -1 if value is None else len(value))
        parts += (head, key) if value is None else (head, key, value)
        at += _HEAD.size + len(key) + (0 if value is None else len(value))
    return b"".join(parts), offsets


def decode_entries(data: bytes | memoryview, base: int
                   ) -> Iterator[tuple[int, bytes, bytes | None, int]]:
    """``(version, key, value or None, end)`` of each whole entry in ``data``,
    which starts at segment offset ``base`` on an entry boundary; stops at a
    partial entry (CorruptRecordError on lengths out of range)."""
    view = memoryview(data)
    pos = 0
    while pos + _HEAD.size <= len(view):
        key_length, value_length = _HEAD.unpack_from(view, pos)
        if key_length > MAX_KEY_BYTES or not -1 <= value_length <= MAX_VALUE_BYTES:
            raise CorruptRecordError(f"no table entry at offset {base + pos}")
        end = pos + _HEAD.size + key_length + max(value_length, 0)
        if end > len(view):
            return
        key = bytes(view[pos + _HEAD.size:pos + _HEAD.size + key_length])
        value = None if value_length < 0 else bytes(view[end - value_length:end])
        yield base + pos, key, value, base + end
        pos = end


@dataclass
class TableIndex:
    """Key to (version, value) of one table's live keys."""

    entries: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)

    def apply(self, data: bytes, offset: int) -> None:
        """Apply one appended batch at segment offset ``offset``."""
        for version, key, value, _end in decode_entries(data, offset):
            if value is None:
                self.entries.pop(key, None)
            else:
                self.entries[key] = (version, value)

    def copy(self) -> TableIndex:
        return TableIndex(dict(self.entries))

    def check_put(self, entries: Sequence[tuple[bytes, bytes, int | None]]) -> None:
        """Raise unless every entry's condition holds (nothing changes).  A key
        may come more than once (the Pravega client's synchronizer sends a
        map's version key once per change): each of its conditions is checked
        against the table before the batch, and its last entry wins."""
        for key, value, expected in entries:
            check_entry(key, value)
            self.check_version(key, expected)

    def check_version(self, key: bytes, expected: int | None) -> None:
        current = self.entries.get(key)
        if expected is None:
            return
        if expected == NOT_EXISTS:
            if current is not None:
                raise TableKeyBadVersionError(f"key {key!r} exists (version {current[0]})")
        elif current is None:
            raise TableKeyNotFoundError(f"key {key!r} does not exist")
        elif current[0] != expected:
            raise TableKeyBadVersionError(f"key {key!r} is at version {current[0]}, "
                                          f"not {expected}")


def check_entry(key: bytes, value: bytes | None) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise SegmentStoreError(f"a table key is 1 to {MAX_KEY_BYTES} bytes")
    if value is not None and (not isinstance(value, bytes) or len(value) > MAX_VALUE_BYTES):
        raise SegmentStoreError(f"a table value is bytes of at most {MAX_VALUE_BYTES}")
