"""A CBOR decoder (RFC 8949), enough to read what the Pravega client's
``serde_cbor`` writes (sans-IO).

Layout of one item: an initial byte ``major type (3 bits) | additional
info (5 bits)``; info 0..23 is the argument itself, 24/25/26/27 say it
follows in 1/2/4/8 big-endian bytes, 31 means indefinite length::

    0 unsigned int   1 negative int (-1 - n)   2 bytes (n)   3 text (n UTF-8)
    4 array (n items)   5 map (n key/value pairs)   6 tag n, then an item
    7 simple: 20 false, 21 true, 22 null, 23 undefined; 25/26/27 half/single/double float

Map keys that are maps or arrays (serde's struct keys) come out as
:class:`FrozenKey` (hashable; ``.value`` is the decoded dict or list).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from quire.errors import ProtocolError


@dataclass(frozen=True)
class FrozenKey:
    """A map key that is itself a map or an array."""

    value: Any

    def __hash__(self) -> int:
        return hash(repr(self.value))


def loads(data: bytes) -> Any:
    """The one item ``data`` holds (ProtocolError if malformed or if bytes remain)."""
    value, end = _item(memoryview(data), 0)
    if end != len(data):
        raise ProtocolError(f"CBOR: {len(data) - end} bytes after the item")
    return value


def _argument(data: memoryview, pos: int, info: int) -> tuple[int, int]:
    if info < 24:
        return info, pos
    size = {24: 1, 25: 2, 26: 4, 27: 8}.get(info)
    if size is None or pos + size > len(data):
        raise ProtocolError(f"CBOR: bad length encoding {info} at {pos}")
    return int.from_bytes(data[pos:pos + size], "big"), pos + size


def _item(data: memoryview, pos: int) -> tuple[Any, int]:
    if pos >= len(data):
        raise ProtocolError("CBOR: truncated")
    initial = data[pos]
    major, info = initial >> 5, initial & 0x1F
    pos += 1
    if major == 7:
        if info in (20, 21, 22, 23):
            return {20: False, 21: True, 22: None, 23: None}[info], pos
        fmt = {25: ">e", 26: ">f", 27: ">d"}.get(info)
        if fmt is None:
            raise ProtocolError(f"CBOR: simple value {info} at {pos - 1}")
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, data[pos:pos + size])[0], pos + size
    if info == 31:
        raise ProtocolError("CBOR: indefinite lengths are not supported")
    n, pos = _argument(data, pos, info)
    if major == 0:
        return n, pos
    if major == 1:
        return -1 - n, pos
    if major in (2, 3):
        if pos + n > len(data):
            raise ProtocolError("CBOR: truncated string")
        raw = bytes(data[pos:pos + n])
        return (raw if major == 2 else raw.decode()), pos + n
    if major == 4:
        items = []
        for _ in range(n):
            item, pos = _item(data, pos)
            items.append(item)
        return items, pos
    if major == 5:
        mapping = {}
        for _ in range(n):
            key, pos = _item(data, pos)
            value, pos = _item(data, pos)
            mapping[FrozenKey(key) if isinstance(key, dict | list) else key] = value
        return mapping, pos
    return _item(data, pos)  # major 6: a tag, then the item it tags
