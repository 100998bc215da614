"""The operations of a segment container's tier-1 log, and their codec (sans-IO).

Every change to a container is one operation, serialized in the order the
container accepted it and replayed in that order when the container opens.
An operation carries its *outcome*, not its request: conditions were checked
and attribute updates resolved (REPLACE_IF_EQUALS, ACCUMULATE, ...) before it
was logged, so replaying it is a plain assignment.

Byte layout (big-endian, no padding)::

    operation   := kind:u8 | sequence:u64 | timestamp_ms:u64 | body
    SEGMENT_MAP := segment_id:u64 | segment_type:u8 | name_len:u16 | name:utf-8
                   | attributes                                     (kind 1)
    APPEND      := segment_id:u64 | offset:u64 | attributes | data_len:u32 | data
                                                                     (kind 2)
    SEAL        := segment_id:u64                                    (kind 3)
    TRUNCATE    := segment_id:u64 | start_offset:u64                 (kind 4)
    DELETE      := segment_id:u64                                    (kind 5)
    ATTRIBUTES  := segment_id:u64 | attributes                       (kind 6)
    CHECKPOINT  := length:u32 | checkpoint (quire.segmentstore.metadata)
                                                                     (kind 7)
    MERGE       := target_id:u64 | source_id:u64 | target_offset:u64 | length:u64
                                                                     (kind 8)
    PROBE       := (nothing)                                         (kind 9)
    attributes  := count:u32 | (key:u128 | value:i64) * count

``sequence`` numbers a container's operations 1, 2, 3, ... in log order;
``timestamp_ms`` is when the container accepted it (a segment's
``last_modified_ms``).  Attribute values are final values.  Decoding
raises :class:`~quire.errors.CorruptRecordError` on anything malformed
(short, trailing bytes, an unknown kind or segment type, a name that is
not UTF-8).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from quire.errors import CorruptRecordError
from quire.segmentstore.types import SegmentType

_HEADER = struct.Struct(">BQQ")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TWO_U64 = struct.Struct(">QQ")
_ATTRIBUTE = struct.Struct(">QQq")  # key high, key low, value
_PLAIN_APPEND = struct.Struct(">BQQQQII")  # an APPEND without attributes, up to its data
PLAIN_APPEND_HEAD = struct.Struct(">IBQQQQII")
"""An APPEND without attributes up to its data, as it sits in a data frame
(its length first): (length of the operation, APPEND, sequence, timestamp_ms,
segment_id, offset, 0, data length); its data follows."""

WRITER_APPEND_HEAD = struct.Struct(">IBQQQQIQQqI")
"""An APPEND with exactly one attribute (a writer's event number) up to its
data, as it sits in a data frame: (length of the operation, APPEND,
sequence, timestamp_ms, segment_id, offset, 1, key high, key low, value,
data length); its data follows.  The same bytes :func:`encode` gives."""

SEGMENT_MAP, APPEND, SEAL, TRUNCATE, DELETE, ATTRIBUTES, CHECKPOINT, MERGE, PROBE = range(1, 10)
_MERGE = struct.Struct(">QQQQ")

Attributes = tuple[tuple[int, int], ...]
"""Final attribute values, (key, value) pairs in the order they were set."""


@dataclass(frozen=True, slots=True)
class SegmentMapOp:
    """A segment created (mapped to ``segment_id``) with its initial attributes."""

    sequence: int
    timestamp_ms: int
    segment_id: int
    name: str
    segment_type: SegmentType
    attributes: Attributes = ()


@dataclass(slots=True, unsafe_hash=True)
class AppendOp:
    """``data`` appended at ``offset`` (the segment's length then), with attributes set.

    Not frozen only for speed (a frozen dataclass costs about 2 us more to
    build, one per append): never changed once built, like the others."""

    sequence: int
    timestamp_ms: int
    segment_id: int
    offset: int
    data: bytes
    attributes: Attributes = ()


@dataclass(frozen=True, slots=True)
class SealOp:
    sequence: int
    timestamp_ms: int
    segment_id: int


@dataclass(frozen=True, slots=True)
class TruncateOp:
    """The segment now starts at ``start_offset``."""

    sequence: int
    timestamp_ms: int
    segment_id: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class DeleteOp:
    sequence: int
    timestamp_ms: int
    segment_id: int


@dataclass(frozen=True, slots=True)
class AttributesOp:
    """Attributes set without data."""

    sequence: int
    timestamp_ms: int
    segment_id: int
    attributes: Attributes


@dataclass(frozen=True, slots=True)
class CheckpointOp:
    """The whole container metadata as of this point of the log."""

    sequence: int
    timestamp_ms: int
    checkpoint: bytes


@dataclass(frozen=True, slots=True)
class MergeOp:
    """The sealed ``source_id`` (all ``length`` bytes of it, from offset 0)
    appended to ``target_id`` at ``target_offset``; the source is gone."""

    sequence: int
    timestamp_ms: int
    target_id: int
    source_id: int
    target_offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ProbeOp:
    """Nothing changed: written only to prove the container still owns its
    log (a write to a log another owner took fails; see
    :meth:`~quire.segmentstore.container.SegmentContainer.confirm_ownership`)."""

    sequence: int
    timestamp_ms: int


Operation = (SegmentMapOp | AppendOp | SealOp | TruncateOp | DeleteOp | AttributesOp
             | CheckpointOp | MergeOp | ProbeOp)

PackedAppend = tuple[int, int, bytes, int, int, Attributes]
"""An append as a container's hot path queues it: ``(segment_id, offset,
data, sequence, timestamp_ms, attributes)``, the fields of an
:class:`AppendOp` without building one (a tuple costs a tenth of the
object, and an append is queued, committed and forgotten without anyone
asking for it).  :func:`as_operation` gives the object."""

Queued = Operation | PackedAppend
"""What an operation log queues: an operation, or an append packed as a tuple."""


def as_operation(queued: Queued) -> Operation:
    """The operation ``queued`` stands for (an :class:`AppendOp` for a packed one)."""
    if isinstance(queued, tuple):
        segment_id, offset, data, sequence, timestamp_ms, attributes = queued
        return AppendOp(sequence, timestamp_ms, segment_id, offset, data, attributes)
    return queued


def _attributes(attributes: Attributes) -> bytes:
    parts = [_U32.pack(len(attributes))]
    for key, value in attributes:
        parts.append(_ATTRIBUTE.pack(key >> 64, key & 0xFFFF_FFFF_FFFF_FFFF, value))
    return b"".join(parts)


def encode(op: Operation) -> bytes:
    """The bytes of one operation (see the module docstring)."""
    if isinstance(op, AppendOp):
        if not op.attributes:  # the hot path: one pack
            return _PLAIN_APPEND.pack(APPEND, op.sequence, op.timestamp_ms, op.segment_id,
                                      op.offset, 0, len(op.data)) + op.data
        return b"".join((_HEADER.pack(APPEND, op.sequence, op.timestamp_ms),
                         _TWO_U64.pack(op.segment_id, op.offset), _attributes(op.attributes),
                         _U32.pack(len(op.data)), op.data))
    if isinstance(op, SegmentMapOp):
        name = op.name.encode()
        return b"".join((_HEADER.pack(SEGMENT_MAP, op.sequence, op.timestamp_ms),
                         _U64.pack(op.segment_id), _U8.pack(op.segment_type),
                         _U16.pack(len(name)), name, _attributes(op.attributes)))
    if isinstance(op, SealOp):
        return _HEADER.pack(SEAL, op.sequence, op.timestamp_ms) + _U64.pack(op.segment_id)
    if isinstance(op, TruncateOp):
        return (_HEADER.pack(TRUNCATE, op.sequence, op.timestamp_ms)
                + _TWO_U64.pack(op.segment_id, op.start_offset))
    if isinstance(op, DeleteOp):
        return _HEADER.pack(DELETE, op.sequence, op.timestamp_ms) + _U64.pack(op.segment_id)
    if isinstance(op, AttributesOp):
        return (_HEADER.pack(ATTRIBUTES, op.sequence, op.timestamp_ms)
                + _U64.pack(op.segment_id) + _attributes(op.attributes))
    if isinstance(op, MergeOp):
        return (_HEADER.pack(MERGE, op.sequence, op.timestamp_ms)
                + _MERGE.pack(op.target_id, op.source_id, op.target_offset, op.length))
    if isinstance(op, ProbeOp):
        return _HEADER.pack(PROBE, op.sequence, op.timestamp_ms)
    return (_HEADER.pack(CHECKPOINT, op.sequence, op.timestamp_ms)
            + _U32.pack(len(op.checkpoint)) + op.checkpoint)


class _Cursor:
    """Reads fields off a buffer, refusing to run past its end."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, s: struct.Struct) -> tuple[int, ...]:
        end = self.pos + s.size
        if end > len(self.buf):
            raise CorruptRecordError("operation is cut short")
        values = s.unpack_from(self.buf, self.pos)
        self.pos = end
        return values

    def one(self, s: struct.Struct) -> int:
        return self.take(s)[0]

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise CorruptRecordError("operation is cut short")
        data = bytes(self.buf[self.pos:end])
        self.pos = end
        return data

    def attributes(self) -> Attributes:
        count = self.one(_U32)
        if count * _ATTRIBUTE.size > len(self.buf) - self.pos:
            raise CorruptRecordError("attribute count runs past the operation")
        out = []
        for _ in range(count):
            high, low, value = self.take(_ATTRIBUTE)
            out.append(((high << 64) | low, value))
        return tuple(out)


def decode(buf: bytes | memoryview) -> Operation:
    """The operation in ``buf`` (all of it; CorruptRecordError if malformed)."""
    c = _Cursor(buf)
    kind, sequence, ts = c.take(_HEADER)
    op: Operation
    if kind == APPEND:
        segment_id, offset = c.take(_TWO_U64)
        attributes = c.attributes()
        data = c.raw(c.one(_U32))
        op = AppendOp(sequence, ts, segment_id, offset, data, attributes)
    elif kind == SEGMENT_MAP:
        segment_id = c.one(_U64)
        try:
            segment_type = SegmentType(c.one(_U8))
        except ValueError as e:
            raise CorruptRecordError(f"unknown segment type: {e}") from None
        try:
            name = c.raw(c.one(_U16)).decode()
        except UnicodeDecodeError as e:
            raise CorruptRecordError(f"a segment name that is not UTF-8: {e}") from None
        op = SegmentMapOp(sequence, ts, segment_id, name, segment_type, c.attributes())
    elif kind == SEAL:
        op = SealOp(sequence, ts, c.one(_U64))
    elif kind == TRUNCATE:
        segment_id, start = c.take(_TWO_U64)
        op = TruncateOp(sequence, ts, segment_id, start)
    elif kind == DELETE:
        op = DeleteOp(sequence, ts, c.one(_U64))
    elif kind == ATTRIBUTES:
        segment_id = c.one(_U64)
        op = AttributesOp(sequence, ts, segment_id, c.attributes())
    elif kind == MERGE:
        target_id, source_id, target_offset, length = c.take(_MERGE)
        op = MergeOp(sequence, ts, target_id, source_id, target_offset, length)
    elif kind == CHECKPOINT:
        op = CheckpointOp(sequence, ts, c.raw(c.one(_U32)))
    elif kind == PROBE:
        op = ProbeOp(sequence, ts)
    else:
        raise CorruptRecordError(f"unknown operation kind {kind}")
    if c.pos != len(c.buf):
        raise CorruptRecordError(f"{len(c.buf) - c.pos} trailing bytes after the operation")
    return op
