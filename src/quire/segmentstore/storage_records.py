"""Codecs of the storage writer's tier-2 records (sans-IO: bytes in, values out).

Three kinds of bytes the storage writer puts in tier-2 besides segments' raw
data, each read back from tier-2 alone (by :func:`read_layout`'s callers,
the checker and recovery):

* an **attribute batch**, appended to ``<segment>$attributes`` by one flush:
  the attributes changed since the previous flush and a footer naming the
  data segment's flushed length when the values were taken (the batch's
  *recorded offset* into the data segment);
* an **index batch**, appended to ``<table>$index`` by one flush: the keys
  changed since the previous flush with their versions (a key's version is
  its entry's offset in the table segment, so it is a recorded offset too),
  and a footer "indexed up to offset N of the table segment";
* a **journal snapshot**, one chunk of the container's system journal: the
  layouts of the container-metadata segments (whose own layouts cannot be
  recorded in the storage-metadata table they make up).

Byte layout (big-endian, no padding)::

    attribute_batch := magic:u32 (0x51415442 "QATB") | count:u32
                       | (key:u128 | value:i64){count} | data_length:u64
    index_batch     := magic:u32 (0x51495842 "QIXB") | count:u32
                       | (key_length:u32 | key | version:i64){count}
                       | indexed_length:u64                (version -1: removed)
    layout_record   := segment_id:u64 | type_tag:u8 | layout
                       (a storage-metadata table value: whose layout it is, so a
                       name deleted and created again is told apart, and that
                       segment's SegmentType, so disaster recovery brings it
                       back as the kind it was: type_tag is 0x80 | type.  A
                       record written before the tag (segment_id:u64 | layout,
                       whose byte 8 is the layout's version, 1) reads as type 0,
                       not known)
    journal         := magic:u32 (0x51534a53 "QSJS") | version:u8 (1)
                       | container:u32 | epoch:u64 | count:u32
                       | (layout_length:u32 | layout){count}
                       (layout: quire.tier2.layout's encode_layout)

A segment of batches is read batch after batch; a batch cut short (the
segment's recorded length never ends inside one, but a caller may pass a
prefix) ends the reading, and anything else malformed raises
:class:`~quire.errors.CorruptRecordError`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from quire.errors import CorruptRecordError
from quire.tier2 import SegmentLayout, decode_layout, encode_layout

ATTRIBUTE_MAGIC = 0x51415442
INDEX_MAGIC = 0x51495842
JOURNAL_MAGIC = 0x514A5353
JOURNAL_VERSION = 1
REMOVED_VERSION = -1
_BATCH_HEAD = struct.Struct(">II")
_ATTRIBUTE = struct.Struct(">QQq")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_U8 = struct.Struct(">B")
_TYPE_TAG = 0x80
_I64 = struct.Struct(">q")
_JOURNAL_HEAD = struct.Struct(">IBIQI")


@dataclass(frozen=True)
class AttributeBatch:
    """Attribute values as of ``data_length`` bytes of their data segment."""

    values: tuple[tuple[int, int], ...]
    data_length: int


@dataclass(frozen=True)
class IndexBatch:
    """Keys' versions (``REMOVED_VERSION``: removed) as of ``indexed_length``."""

    versions: tuple[tuple[bytes, int], ...]
    indexed_length: int


@dataclass(frozen=True)
class JournalSnapshot:
    """The container-metadata segments' layouts, written by owner ``epoch``."""

    container_id: int
    epoch: int
    layouts: tuple[SegmentLayout, ...]


def encode_attribute_batch(values: Mapping[int, int], data_length: int) -> bytes:
    parts = [_BATCH_HEAD.pack(ATTRIBUTE_MAGIC, len(values))]
    for key, value in values.items():
        parts.append(_ATTRIBUTE.pack(key >> 64, key & 0xFFFF_FFFF_FFFF_FFFF, value))
    parts.append(_U64.pack(data_length))
    return b"".join(parts)


def encode_index_batch(versions: Mapping[bytes, int], indexed_length: int) -> bytes:
    parts = [_BATCH_HEAD.pack(INDEX_MAGIC, len(versions))]
    for key, version in versions.items():
        parts += (_U32.pack(len(key)), key, _I64.pack(version))
    parts.append(_U64.pack(indexed_length))
    return b"".join(parts)


def decode_attribute_batches(data: bytes) -> list[AttributeBatch]:
    """Every whole batch in ``data`` (a ``$attributes`` segment from offset 0)."""
    view = memoryview(data)
    out: list[AttributeBatch] = []
    at = 0
    while at + _BATCH_HEAD.size <= len(view):
        magic, count = _BATCH_HEAD.unpack_from(view, at)
        if magic != ATTRIBUTE_MAGIC:
            raise CorruptRecordError(f"no attribute batch at offset {at}")
        end = at + _BATCH_HEAD.size + count * _ATTRIBUTE.size + _U64.size
        if end > len(view):
            break
        pos = at + _BATCH_HEAD.size
        values = []
        for _ in range(count):
            high, low, value = _ATTRIBUTE.unpack_from(view, pos)
            values.append(((high << 64) | low, value))
            pos += _ATTRIBUTE.size
        (data_length,) = _U64.unpack_from(view, pos)
        out.append(AttributeBatch(tuple(values), data_length))
        at = end
    return out


def decode_index_batches(data: bytes) -> list[IndexBatch]:
    """Every whole batch in ``data`` (a ``$index`` segment from offset 0)."""
    view = memoryview(data)
    out: list[IndexBatch] = []
    at = 0
    while at + _BATCH_HEAD.size <= len(view):
        magic, count = _BATCH_HEAD.unpack_from(view, at)
        if magic != INDEX_MAGIC:
            raise CorruptRecordError(f"no index batch at offset {at}")
        pos = at + _BATCH_HEAD.size
        versions = []
        whole = True
        for _ in range(count):
            if pos + _U32.size > len(view):
                whole = False
                break
            (key_length,) = _U32.unpack_from(view, pos)
            if pos + _U32.size + key_length + _I64.size > len(view):
                whole = False
                break
            key = bytes(view[pos + _U32.size:pos + _U32.size + key_length])
            (version,) = _I64.unpack_from(view, pos + _U32.size + key_length)
            versions.append((key, version))
            pos += _U32.size + key_length + _I64.size
        if not whole or pos + _U64.size > len(view):
            break
        (indexed_length,) = _U64.unpack_from(view, pos)
        out.append(IndexBatch(tuple(versions), indexed_length))
        at = pos + _U64.size
    return out


def encode_layout_record(segment_id: int, layout: SegmentLayout,
                         segment_type: int = 0) -> bytes:
    if not 0 <= segment_type < _TYPE_TAG:
        raise ValueError(f"segment type {segment_type} does not fit a layout record")
    return _U64.pack(segment_id) + _U8.pack(_TYPE_TAG | segment_type) + encode_layout(layout)


def decode_typed_layout_record(data: bytes) -> tuple[int, int, SegmentLayout]:
    """``(segment_id, segment_type, layout)`` of :func:`encode_layout_record`'s
    bytes (type 0 for a record written before the type tag)."""
    if len(data) < _U64.size + _U8.size:
        raise CorruptRecordError(f"a layout record of {len(data)} bytes is cut short")
    segment_id = _U64.unpack_from(data, 0)[0]
    tag = data[_U64.size]
    if not tag & _TYPE_TAG:
        return segment_id, 0, decode_layout(data[_U64.size:])
    return segment_id, tag & ~_TYPE_TAG, decode_layout(data[_U64.size + _U8.size:])


def decode_layout_record(data: bytes) -> tuple[int, SegmentLayout]:
    """``(segment_id, layout)`` of :func:`encode_layout_record`'s bytes."""
    segment_id, _segment_type, layout = decode_typed_layout_record(data)
    return segment_id, layout


def encode_journal(snapshot: JournalSnapshot) -> bytes:
    parts = [_JOURNAL_HEAD.pack(JOURNAL_MAGIC, JOURNAL_VERSION, snapshot.container_id,
                                snapshot.epoch, len(snapshot.layouts))]
    for layout in snapshot.layouts:
        encoded = encode_layout(layout)
        parts += (_U32.pack(len(encoded)), encoded)
    return b"".join(parts)


def decode_journal(data: bytes) -> JournalSnapshot:
    """The snapshot :func:`encode_journal` made (CorruptRecordError for anything else)."""
    view = memoryview(data)
    if len(view) < _JOURNAL_HEAD.size:
        raise CorruptRecordError(f"a journal snapshot of {len(view)} bytes is cut short")
    magic, version, container_id, epoch, count = _JOURNAL_HEAD.unpack_from(view, 0)
    if magic != JOURNAL_MAGIC or version != JOURNAL_VERSION:
        raise CorruptRecordError(f"not a journal snapshot (magic {magic:#x}, version {version})")
    at = _JOURNAL_HEAD.size
    layouts = []
    for _ in range(count):
        if at + _U32.size > len(view):
            raise CorruptRecordError("a journal snapshot is cut short")
        (size,) = _U32.unpack_from(view, at)
        if at + _U32.size + size > len(view):
            raise CorruptRecordError("a journal snapshot is cut short")
        layouts.append(decode_layout(bytes(view[at + _U32.size:at + _U32.size + size])))
        at += _U32.size + size
    if at != len(view):
        raise CorruptRecordError(f"{len(view) - at} bytes after a journal snapshot")
    return JournalSnapshot(container_id, epoch, tuple(layouts))
