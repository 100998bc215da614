"""A segment's layout in tier-2: which chunks hold its bytes, and its codec.

A segment in tier-2 is a list of chunks holding its raw bytes, one after
another.  :class:`SegmentLayout` is that list (chunk names with the segment
offset of each chunk's first byte and its length) with the segment's
length, start offset (bytes below it are truncated away), sealed and
deleted flags.  It is a plain value: every change returns a new layout, and
the caller records it (in the container's storage metadata) before it acts
on tier-2 by it (deleting the chunks a truncate or a concat dropped, a
cycle later).

Invariants (checked at construction, :class:`~quire.errors.InvalidLayoutError`):
``0 <= start_offset <= length``; the chunks hold at least one byte each,
are contiguous and end at ``length``; the first chunk holds
``start_offset`` (a chunk wholly below it is dropped from the layout), so
with no chunks ``start_offset == length``; no chunk name appears twice.

**Chunk names** are ``<path>.E<epoch>.<counter>`` (:class:`ChunkNamer`),
``path`` the segment's name as tier-2 can hold it (:func:`chunk_path`: the
name itself, unless a part of it starts with ``.`` or is too long for a
file name; such a part is escaped or hashed; the layout keeps the real
name, so recovery and the checker give it back):
``epoch`` is the epoch the writing container took on its tier-1 log (each
open of a container takes a new, higher one, fencing the previous owner),
and ``counter`` counts the names one owner gave in that epoch.  So no name
is ever given twice, and a fenced owner that is still running only ever
writes or deletes names of its own older epoch, which no newer layout
holds unless that owner recorded them.  A merged segment's chunks keep
their names (a layout may hold chunks named after another segment).

Byte layout of :func:`encode_layout` (big-endian, no padding)::

    layout := version:u8 (1) | flags:u8 | start_offset:u64 | length:u64
              | segment_len:u16 | segment:utf-8 | chunk_count:u32 | chunk*
    chunk  := offset:u64 | length:u64 | name_len:u16 | name:utf-8
    flags  := bit 0 sealed, bit 1 deleted (other bits zero)
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from quire.errors import (
    ChunkNotFoundError,
    InvalidChunkNameError,
    InvalidLayoutError,
    SegmentTruncatedError,
)

from .chunk_storage import MAX_CHUNK_NAME_BYTES, ChunkStorage, check_chunk_name

LAYOUT_VERSION = 1
_HEAD = struct.Struct(">BBQQ")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CHUNK_HEAD = struct.Struct(">QQ")
_SEALED, _DELETED = 1, 2
_CHUNK_NAME = re.compile(r"(?P<segment>.+)\.E(?P<epoch>[0-9]+)\.(?P<counter>[0-9]+)")
MAX_PLAIN_PART_CHARS = 150
"""A segment name's part longer than this is hashed in chunk names (a file
name holds 255 bytes; the last part carries ``.E<epoch>.<counter>`` too)."""
_PLAIN_PART = re.compile(r"[A-Za-z0-9_\-#$][A-Za-z0-9._\-#$]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-#$]")
_MAX_PATH_CHARS = MAX_CHUNK_NAME_BYTES - 64
"""Room for ``.E<epoch>.<counter>`` (two 20-digit numbers at most)."""
_KEPT_PATH_CHARS = 300
"""Of a path too long for a chunk name, the leading parts kept readable."""


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of a segment: its name, the segment offset of its first
    byte, and how many bytes it holds."""

    name: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class SegmentLayout:
    """Where a segment's bytes are in tier-2 (see the module docstring)."""

    segment: str
    chunks: tuple[ChunkRef, ...] = ()
    start_offset: int = 0
    length: int = 0
    sealed: bool = False
    deleted: bool = False

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise InvalidLayoutError(f"layout of {self.segment!r}: {problem}")

    def _problem(self) -> str:
        if not 0 <= self.start_offset <= self.length:
            return f"start offset {self.start_offset} outside 0..{self.length}"
        if not self.chunks:
            return "" if self.start_offset == self.length else (
                f"no chunks, yet bytes {self.start_offset}..{self.length}")
        if len({c.name for c in self.chunks}) != len(self.chunks):
            return "a chunk name appears twice"
        expected = self.chunks[0].offset
        for chunk in self.chunks:
            if chunk.offset != expected or chunk.length <= 0:
                return (f"chunk {chunk.name} at {chunk.offset}+{chunk.length}, "
                        f"expected at {expected} with at least one byte")
            expected = chunk.end
        if expected != self.length:
            return f"the chunks end at {expected}, the segment at {self.length}"
        first = self.chunks[0]
        if not first.offset <= self.start_offset < first.end:
            return (f"the first chunk {first.name} ({first.offset}..{first.end}) does not "
                    f"hold start offset {self.start_offset}")
        return ""

    # --- changes (each returns a new layout) --------------------------------

    def _writable(self, doing: str) -> None:
        if self.sealed or self.deleted:
            raise InvalidLayoutError(f"{doing} {self.segment}: it is "
                                     f"{'deleted' if self.deleted else 'sealed'}")

    def with_chunk(self, name: str, length: int) -> SegmentLayout:
        """The segment grown by a new last chunk ``name`` of ``length`` bytes.
        A layout with no chunks (empty, or truncated to its end) starts its
        first chunk at ``length``."""
        self._writable("adding a chunk to")
        check_chunk_name(name)
        if length <= 0:
            raise InvalidLayoutError(f"chunk {name}: a chunk holds at least one byte")
        return replace(self, chunks=(*self.chunks, ChunkRef(name, self.length, length)),
                       length=self.length + length)

    def truncated(self, start_offset: int) -> tuple[SegmentLayout, list[str]]:
        """The layout with its start at ``start_offset`` (never moving back),
        and the chunks it no longer holds (wholly below the new start), for
        the caller to delete once the new layout is recorded."""
        if self.deleted or not self.start_offset <= start_offset <= self.length:
            raise InvalidLayoutError(f"truncating {self.segment} at {start_offset}: outside "
                                     f"{self.start_offset}..{self.length} or deleted")
        kept = tuple(c for c in self.chunks if c.end > start_offset)
        dropped = [c.name for c in self.chunks if c.end <= start_offset]
        return replace(self, chunks=kept, start_offset=start_offset), dropped

    def with_sealed(self) -> SegmentLayout:
        if self.deleted:
            raise InvalidLayoutError(f"sealing {self.segment}: it is deleted")
        return replace(self, sealed=True)

    def with_deleted(self) -> tuple[SegmentLayout, list[str]]:
        """The layout marked deleted (no chunks left) and the chunks to delete
        once that is recorded."""
        return (replace(self, chunks=(), start_offset=self.length, deleted=True),
                [c.name for c in self.chunks])

    def merged(self, source: SegmentLayout) -> tuple[SegmentLayout, SegmentLayout]:
        """The layout with the sealed ``source``'s bytes appended: its chunks
        join this one's, under their names; and ``source`` marked deleted
        with no chunks (they now belong to this segment, so nothing is
        deleted).  A source truncated above 0 cannot be merged."""
        self._writable("merging into")
        if not source.sealed or source.deleted or source.start_offset != 0:
            raise InvalidLayoutError(f"merging {source.segment} into {self.segment}: the source "
                                     "must be sealed, not deleted, and not truncated")
        moved = tuple(ChunkRef(c.name, c.offset + self.length, c.length) for c in source.chunks)
        target = replace(self, chunks=(*self.chunks, *moved), length=self.length + source.length)
        gone = replace(source, chunks=(), start_offset=source.length, deleted=True)
        return target, gone

    def concatenated(self, first: int, count: int, name: str) -> tuple[SegmentLayout, list[str]]:
        """The layout with chunks ``first .. first+count-1`` replaced by the one
        chunk ``name`` holding their bytes (made by
        :func:`~quire.tier2.concat_chunks`), and the names it replaced, to
        delete a cycle after the new layout is recorded."""
        check_chunk_name(name)
        if count < 2 or first < 0 or first + count > len(self.chunks):
            raise InvalidLayoutError(f"concatenating chunks {first}..{first + count - 1} of "
                                     f"{self.segment}: it has {len(self.chunks)}")
        replaced = self.chunks[first:first + count]
        joined = ChunkRef(name, replaced[0].offset, replaced[-1].end - replaced[0].offset)
        chunks = (*self.chunks[:first], joined, *self.chunks[first + count:])
        return replace(self, chunks=chunks), [c.name for c in replaced]

    # --- reading ----------------------------------------------------------------

    def pieces(self, offset: int, length: int) -> Iterator[tuple[ChunkRef, int, int]]:
        """``(chunk, offset in the chunk, bytes)`` covering the segment's bytes
        ``offset .. offset+length`` that it holds (up to its length)."""
        end = min(offset + length, self.length)
        for chunk in self.chunks:
            if chunk.end <= offset or chunk.offset >= end:
                continue
            start = max(offset, chunk.offset)
            yield chunk, start - chunk.offset, min(end, chunk.end) - start


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _chunk_part(part: str) -> str:
    """One part of a segment name as a chunk name can hold it: itself; or,
    starting with ``.`` (a file system's own names, hidden by listings),
    ``~`` and itself; or, too long or holding other characters, ``~``, a
    readable cut of it, ``@`` and a hash of it.  Segment names hold neither
    ``~`` nor ``@`` (:func:`quire.segmentstore.names.check_name`), so no
    escaped part equals another part or another escaped one."""
    if _PLAIN_PART.fullmatch(part) is not None and len(part) <= MAX_PLAIN_PART_CHARS:
        return part
    if len(part) < MAX_PLAIN_PART_CHARS and _UNSAFE.search(part) is None:
        return "~" + part  # a leading "." (".", ".." and ".name" alike)
    return f"~{_UNSAFE.sub('-', part[:64])}@{_digest(part)}"


def chunk_path(segment: str) -> str:
    """The path under which tier-2 keeps segment ``segment``'s chunks: its
    name where a file system and an S3 key can hold it as it is (every
    name Quire accepted before this rule existed), each other part escaped
    or hashed (:func:`_chunk_part`), and a name whose path would still be
    too long for a chunk name cut to its first parts and a hash of the
    whole name.  Distinct names give distinct paths (up to a 128-bit hash);
    the layout records the real name."""
    path = "/".join(_chunk_part(part) for part in segment.split("/"))
    if len(path) <= _MAX_PATH_CHARS:
        return path
    kept = path[:_KEPT_PATH_CHARS].rpartition("/")[0]
    return f"{kept}/~@{_digest(segment)}" if kept else f"~@{_digest(segment)}"


@dataclass
class ChunkNamer:
    """Gives the chunk names of one container owner:
    ``<chunk_path(segment)>.E<epoch>.<n>``, ``n`` counting up from 0 across
    all its segments."""

    epoch: int
    _next_counter: int = field(default=0, repr=False)

    def next_name(self, segment: str) -> str:
        name = f"{chunk_path(segment)}.E{self.epoch}.{self._next_counter}"
        check_chunk_name(name)
        self._next_counter += 1
        return name


def parse_chunk_name(name: str) -> tuple[str, int, int]:
    """``(path, epoch, counter)`` of a name :class:`ChunkNamer` gave (``path``
    is :func:`chunk_path` of the segment: its name, unless it had to be
    escaped)."""
    match = _CHUNK_NAME.fullmatch(name)
    if match is None:
        raise InvalidChunkNameError(f"chunk name {name!r}: not <segment>.E<epoch>.<counter>")
    return match["segment"], int(match["epoch"]), int(match["counter"])


async def read_segment(storage: ChunkStorage, layout: SegmentLayout, offset: int,
                       length: int) -> bytes:
    """The segment's bytes ``offset .. offset+length`` (fewer only where the
    segment ends), read across its chunks.

    Never wrong bytes: a read below the start offset, or one that finds a
    chunk vanished (a later truncate, delete or concat removed it: this
    layout is stale), raises :class:`~quire.errors.SegmentTruncatedError`
    whose ``start_offset`` is the lowest offset this layout can still vouch
    for (the end of the vanished chunk); the caller reads the layout again.
    A chunk holding fewer bytes than the layout records raises
    :class:`~quire.errors.InvalidLayoutError`.
    """
    if offset < 0 or length < 0:
        raise ValueError(f"read: offset ({offset}) and length ({length}) must not be negative")
    if offset < layout.start_offset:
        raise SegmentTruncatedError(
            f"{layout.segment}: read at {offset}, below its start offset {layout.start_offset}",
            layout.start_offset)
    if offset > layout.length:
        raise InvalidLayoutError(f"{layout.segment}: read at {offset}, past its length "
                                 f"{layout.length}")
    parts = []
    for chunk, chunk_offset, count in layout.pieces(offset, length):
        try:
            data = await storage.read(chunk.name, chunk_offset, count)
        except ChunkNotFoundError:
            raise SegmentTruncatedError(
                f"{layout.segment}: chunk {chunk.name} (bytes {chunk.offset}..{chunk.end}) is "
                "gone: truncated, deleted or replaced since this layout", chunk.end) from None
        if len(data) != count:
            raise InvalidLayoutError(
                f"{layout.segment}: chunk {chunk.name} holds {chunk_offset + len(data)} bytes, "
                f"its layout says {chunk.length}")
        parts.append(data)
    return b"".join(parts)


# --- codec ----------------------------------------------------------------------


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise InvalidLayoutError(f"name too long to encode: {name[:40]!r}...")
    return _U16.pack(len(raw)) + raw


def encode_layout(layout: SegmentLayout) -> bytes:
    """The layout's bytes (see the module docstring)."""
    flags = (_SEALED if layout.sealed else 0) | (_DELETED if layout.deleted else 0)
    parts = [_HEAD.pack(LAYOUT_VERSION, flags, layout.start_offset, layout.length),
             _name_bytes(layout.segment), _U32.pack(len(layout.chunks))]
    for chunk in layout.chunks:
        parts.append(_CHUNK_HEAD.pack(chunk.offset, chunk.length))
        parts.append(_name_bytes(chunk.name))
    return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, size: int) -> memoryview:
        if self.at + size > len(self.data):
            raise InvalidLayoutError(f"layout bytes cut short at {len(self.data)}, "
                                     f"needed {self.at + size}")
        piece = self.data[self.at:self.at + size]
        self.at += size
        return piece

    def unpack(self, shape: struct.Struct) -> tuple[int, ...]:
        return shape.unpack(self.take(shape.size))

    def name(self) -> str:
        (size,) = self.unpack(_U16)
        try:
            return str(self.take(size), "utf-8")
        except UnicodeDecodeError as e:
            raise InvalidLayoutError(f"a name that is not UTF-8: {e}") from None


def decode_layout(data: bytes) -> SegmentLayout:
    """The layout :func:`encode_layout` made; anything else (cut short,
    trailing bytes, an unknown version or flag, broken invariants) raises
    :class:`~quire.errors.InvalidLayoutError`."""
    reader = _Reader(data)
    version, flags, start_offset, length = reader.unpack(_HEAD)
    if version != LAYOUT_VERSION:
        raise InvalidLayoutError(f"layout version {version}, this build reads {LAYOUT_VERSION}")
    if flags & ~(_SEALED | _DELETED):
        raise InvalidLayoutError(f"unknown layout flags {flags:#x}")
    segment = reader.name()
    (count,) = reader.unpack(_U32)
    chunks = []
    for _ in range(count):
        offset, chunk_length = reader.unpack(_CHUNK_HEAD)
        chunks.append(ChunkRef(reader.name(), offset, chunk_length))
    if reader.at != len(reader.data):
        raise InvalidLayoutError(f"{len(reader.data) - reader.at} bytes after the layout")
    return SegmentLayout(segment, tuple(chunks), start_offset, length,
                         sealed=bool(flags & _SEALED), deleted=bool(flags & _DELETED))
