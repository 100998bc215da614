"""Table segments: a key-value table kept as the data of a TABLE segment (sans-IO).

A table update is one append to the segment, a batch of entries::

    entry := key_length:u32 | value_length:i32 | key | value
             (value_length -1: the key's removal, no value bytes)
           | key_length:u32 | -2:i32 | version:i64 | value_length:u32 | key | value
             (a *copied* entry: a live entry copied forward by compaction,
              keeping its version)

A key's *version* is the offset of the entry that set its value, so
versions are non-negative and increase, and a reader that remembers a
position can ask for every entry after it (:func:`decode_entries`).  The
index (key to version and value) is memory only: the container rebuilds it
from the segment's data on replay.

**Compaction** (Pravega's table compaction): a table's segment grows with
every update, its live entries do not.  Once a table holds more than
twice its live entries' bytes and :data:`COMPACTION_SLACK_BYTES`, its
container copies every live entry forward (copied entries, in version
order, each keeping its version, so a client's conditional update still
holds) and truncates the segment where the copies begin
(:meth:`TableIndex.compaction`); its size follows its live data, not its
history.  A delta read after a compaction may give a live entry twice
(its copy too), with the same version.
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
_COPIED = -2
_COPY_HEAD = struct.Struct(">qI")
COMPACTION_SLACK_BYTES = 64 << 10
"""A table is compacted only once it holds this much more than twice its live entries."""
_ENTRY_OVERHEAD = _HEAD.size
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


def encode_copies(entries: Sequence[tuple[bytes, bytes, int]]) -> bytes:
    """The bytes of a batch of copied entries ``(key, value, version)``."""
    parts: list[bytes] = []
    for key, value, version in entries:
        parts += (_HEAD.pack(len(key), _COPIED), _COPY_HEAD.pack(version, len(value)), key,
                  value)
    return b"".join(parts)


def decode_entries(data: bytes | memoryview, base: int
                   ) -> Iterator[tuple[int, bytes, bytes | None, int]]:
    """``(version, key, value or None, end)`` of each whole entry in ``data``,
    which starts at segment offset ``base`` on an entry boundary; stops at a
    partial entry (CorruptRecordError on lengths out of range)."""
    view = memoryview(data)
    pos = 0
    while pos + _HEAD.size <= len(view):
        key_length, value_length = _HEAD.unpack_from(view, pos)
        start = pos + _HEAD.size
        version = base + pos
        if value_length == _COPIED:
            if start + _COPY_HEAD.size > len(view):
                return
            version, value_length = _COPY_HEAD.unpack_from(view, start)
            start += _COPY_HEAD.size
            if not 0 <= version < base + pos:
                raise CorruptRecordError(f"a copied table entry at offset {base + pos} has "
                                         f"version {version}")
        if key_length > MAX_KEY_BYTES or not -1 <= value_length <= MAX_VALUE_BYTES:
            raise CorruptRecordError(f"no table entry at offset {base + pos}")
        end = start + key_length + max(value_length, 0)
        if end > len(view):
            return
        key = bytes(view[start:start + key_length])
        value = None if value_length < 0 else bytes(view[end - value_length:end])
        yield version, key, value, base + end
        pos = end


def _entry_bytes(key: bytes, value: bytes) -> int:
    return _ENTRY_OVERHEAD + len(key) + len(value)


@dataclass
class TableIndex:
    """Key to (version, value) of one table's live keys, and what compaction
    needs: their bytes, and where copied ones sit."""

    entries: dict[bytes, tuple[int, bytes]] = field(default_factory=dict)
    live_bytes: int = 0
    """The live entries' bytes (as written once each)."""

    def apply(self, data: bytes, offset: int) -> None:
        """Apply one appended batch at segment offset ``offset``."""
        entries = self.entries
        for version, key, value, _end in decode_entries(data, offset):
            old = entries.pop(key, None) if value is None else entries.get(key)
            if old is not None:
                self.live_bytes -= _entry_bytes(key, old[1])
            if value is not None:
                entries[key] = (version, value)
                self.live_bytes += _entry_bytes(key, value)

    def copy(self) -> TableIndex:
        return TableIndex(dict(self.entries), self.live_bytes)

    def compaction(self, start_offset: int, length: int
                   ) -> list[tuple[bytes, bytes, int]] | None:
        """The entries compaction copies forward in a table segment holding
        bytes ``start_offset .. length`` (every live one, ``(key, value,
        version)`` in version order), or None while it holds at most twice
        its live bytes and :data:`COMPACTION_SLACK_BYTES` (see the module
        docstring).  The segment is truncated at ``length`` once they are
        appended (:func:`encode_copies`)."""
        if length - start_offset <= 2 * self.live_bytes + COMPACTION_SLACK_BYTES:
            return None
        return [(key, value, version) for key, (version, value)
                in sorted(self.entries.items(), key=lambda item: item[1][0])]

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
