"""A small CBOR (RFC 8949) decoder: what the Rust Pravega client's ``serde_cbor`` writes.

Byte layout of one data item: an initial byte, major type in its top 3
bits, "additional information" in its low 5::

    ai < 24        the argument is ai itself
    ai = 24/25/26/27  the argument follows in 1/2/4/8 bytes, big-endian
    ai = 31        indefinite length (types 2-5: items up to a 0xFF "break")

    major 0  unsigned integer (the argument)
    major 1  negative integer (-1 - argument)
    major 2  byte string of argument bytes        -> bytes
    major 3  text string of argument bytes, UTF-8 -> str
    major 4  array of argument items              -> list
    major 5  map of argument key/value pairs      -> dict (a key that is a
             map or array, as serde writes a struct key, becomes a tuple of
             its items, a map's as (key, value) pairs, so it hashes)
    major 6  tag (argument) then one item          -> the item (tags dropped)
    major 7  ai 20/21/22/23 false/true/null/undefined; 25/26/27 float16/32/64

Sans-IO: :func:`decode` takes the bytes of exactly one item and returns it.
Malformed input (truncated, a reserved encoding, bytes left after the item,
nesting deeper than :data:`MAX_DEPTH`) is a
:class:`~quire.errors.ProtocolError`.  Decode only: Quire reads what the
client wrote, never writes it.  The reader-group state the client keeps in
this encoding is :mod:`quire.pravega_wire.reader_group_state`.
"""

from __future__ import annotations

import struct
from typing import Any

from quire.errors import ProtocolError

MAX_DEPTH = 64


def decode(data: bytes) -> Any:
    """The one data item ``data`` holds (ProtocolError if malformed,
    truncated, or followed by more bytes)."""
    try:
        value, end = _item(data, 0, 0)
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed CBOR: {e}") from None
    if end != len(data):
        raise ProtocolError(f"CBOR: {len(data) - end} bytes after the item")
    return value


def _argument(data: bytes, offset: int, ai: int) -> tuple[int, int]:
    if ai < 24:
        return ai, offset
    size = {24: 1, 25: 2, 26: 4, 27: 8}.get(ai)
    if size is None:
        raise ProtocolError(f"CBOR: additional information {ai} at {offset}")
    if offset + size > len(data):
        raise ProtocolError("CBOR: truncated argument")
    return int.from_bytes(data[offset:offset + size], "big"), offset + size


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _item(data: bytes, offset: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise ProtocolError("CBOR: nested too deeply")
    initial = data[offset]
    major, ai = initial >> 5, initial & 0x1F
    offset += 1
    if major == 7:
        return _simple(data, offset, ai)
    if ai == 31:
        return _indefinite(data, offset, major, depth)
    arg, offset = _argument(data, offset, ai)
    if major == 0:
        return arg, offset
    if major == 1:
        return -1 - arg, offset
    if major in (2, 3):
        end = offset + arg
        if end > len(data):
            raise ProtocolError("CBOR: truncated string")
        raw = data[offset:end]
        return (raw.decode() if major == 3 else bytes(raw)), end
    if major == 4:
        items = []
        for _ in range(arg):
            item, offset = _item(data, offset, depth + 1)
            items.append(item)
        return items, offset
    if major == 5:
        mapping = {}
        for _ in range(arg):
            key, offset = _item(data, offset, depth + 1)
            value, offset = _item(data, offset, depth + 1)
            mapping[_hashable(key)] = value
        return mapping, offset
    return _item(data, offset, depth + 1)  # major 6: a tag, dropped


def _simple(data: bytes, offset: int, ai: int) -> tuple[Any, int]:
    if ai in (20, 21, 22, 23):
        return {20: False, 21: True, 22: None, 23: None}[ai], offset
    formats = {25: (">e", 2), 26: (">f", 4), 27: (">d", 8)}
    if ai in formats:
        fmt, size = formats[ai]
        return struct.unpack_from(fmt, data, offset)[0], offset + size
    if ai < 24:
        return ai, offset
    raise ProtocolError(f"CBOR: simple value {ai} at {offset - 1}")


def _indefinite(data: bytes, offset: int, major: int, depth: int) -> tuple[Any, int]:
    if major not in (2, 3, 4, 5):
        raise ProtocolError(f"CBOR: major type {major} has no indefinite length")
    items: list[Any] = []
    while data[offset] != 0xFF:
        item, offset = _item(data, offset, depth + 1)
        items.append(item)
    offset += 1
    if major == 2:
        if not all(isinstance(chunk, bytes) for chunk in items):
            raise ProtocolError("CBOR: a byte string chunk that is not a byte string")
        return b"".join(items), offset
    if major == 3:
        if not all(isinstance(chunk, str) for chunk in items):
            raise ProtocolError("CBOR: a text string chunk that is not a text string")
        return "".join(items), offset
    if major == 4:
        return items, offset
    if len(items) % 2:
        raise ProtocolError("CBOR: a map with a key and no value")
    return {_hashable(k): v for k, v in zip(items[::2], items[1::2], strict=True)}, offset
