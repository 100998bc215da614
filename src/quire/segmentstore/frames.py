"""Data frames: many serialized operations in one tier-1 record (sans-IO).

A container appends one *frame* per log record, so a hundred small appends
cost one ledger entry, not a hundred.  Byte layout (big-endian)::

    frame      := magic "QSF1" | count:u32 | (length:u32 | operation) * count
    part frame := magic "QSP1" | operation_length:u32 | part_offset:u32 | bytes

A data frame holds whole operations and is written (and so lost or kept)
whole.  :class:`FrameBuilder` fills one up to ``max_bytes``;
:func:`unpack` gives its operations back.  An operation too large for one
frame (an append of several MiB: a ledger entry is at most 5 MiB, and
frames are kept near 1 MiB) is written as *part frames* (:func:`split`):
consecutive records holding its bytes in order, nothing else between them,
each carrying the whole operation's length and the part's offset in it.
The operation counts only once its last part is durable (it is
acknowledged then); replay reassembles the parts (:class:`PartAssembler`)
and drops an operation whose parts stop short, which was never
acknowledged.
"""

from __future__ import annotations

import struct
from typing import Generic, TypeVar

from quire.errors import CorruptRecordError

T = TypeVar("T")

MAGIC = b"QSF1"
PART_MAGIC = b"QSP1"
_HEAD = struct.Struct(">4sI")
_PART_HEAD = struct.Struct(">4sII")
PART_OVERHEAD = _PART_HEAD.size
_LEN = struct.Struct(">I")
DEFAULT_MAX_FRAME_BYTES = 1 << 20
FRAME_OVERHEAD = _HEAD.size
OPERATION_OVERHEAD = _LEN.size


class FrameBuilder:
    """Collects serialized operations for one frame of at most ``max_bytes``
    (unless a single operation is bigger)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_bytes <= FRAME_OVERHEAD + OPERATION_OVERHEAD:
            raise ValueError(f"max_bytes {max_bytes} leaves no room for an operation")
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._count = 0
        self._size = FRAME_OVERHEAD

    def __len__(self) -> int:
        """The number of operations added."""
        return self._count

    @property
    def size(self) -> int:
        """The frame's size in bytes if built now."""
        return self._size

    def fits(self, operation_size: int) -> bool:
        """Whether an operation of this size may join (always, if the frame is empty)."""
        return (self._count == 0
                or self._size + OPERATION_OVERHEAD + operation_size <= self.max_bytes)

    def add(self, operation: bytes) -> bool:
        """Add one serialized operation; False (and nothing added) if it does not fit."""
        if not self.fits(len(operation)):
            return False
        self._parts.append(_LEN.pack(len(operation)))
        self._parts.append(operation)
        self._count += 1
        self._size += OPERATION_OVERHEAD + len(operation)
        return True

    def build(self) -> bytes:
        """The frame's bytes; the builder is empty again afterwards."""
        frame = b"".join((_HEAD.pack(MAGIC, self._count), *self._parts))
        self._parts = []
        self._count = 0
        self._size = FRAME_OVERHEAD
        return frame


def framed(operation: bytes) -> bytes:
    """One serialized operation with its length in front, as it sits in a frame."""
    return _LEN.pack(len(operation)) + operation


def join(count: int, framed_operations: list[bytes]) -> bytes:
    """A frame of ``count`` operations already :func:`framed` (no size check:
    the caller keeps to its limit)."""
    framed_operations.insert(0, _HEAD.pack(MAGIC, count))
    return b"".join(framed_operations)


def unpack(frame: bytes | memoryview) -> list[memoryview]:
    """The serialized operations of one frame, in order (CorruptRecordError
    if malformed)."""
    view = memoryview(frame)
    if len(view) < _HEAD.size:
        raise CorruptRecordError("frame shorter than its header")
    magic, count = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptRecordError(f"not a data frame (magic {bytes(magic)!r})")
    pos = _HEAD.size
    out = []
    for _ in range(count):
        if pos + _LEN.size > len(view):
            raise CorruptRecordError("frame cut short in an operation's length")
        (n,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        if pos + n > len(view):
            raise CorruptRecordError("frame cut short in an operation")
        out.append(view[pos:pos + n])
        pos += n
    if pos != len(view):
        raise CorruptRecordError(
            f"{len(view) - pos} trailing bytes after the frame's operations")
    return out


def is_part(frame: bytes | memoryview) -> bool:
    """Whether ``frame`` is a part frame (see the module docstring)."""
    return bytes(frame[:4]) == PART_MAGIC


def split(operation: bytes | memoryview, max_frame_bytes: int) -> list[bytes]:
    """The part frames of one serialized operation (without its length
    prefix), each at most ``max_frame_bytes``."""
    room = max_frame_bytes - PART_OVERHEAD
    if room <= 0:
        raise ValueError(f"max_frame_bytes {max_frame_bytes} leaves no room for a part")
    view = memoryview(operation)
    total = len(view)
    return [_PART_HEAD.pack(PART_MAGIC, total, at) + view[at:at + room]
            for at in range(0, max(total, 1), room)]


class PartAssembler(Generic[T]):
    """Reassembles operations written as part frames, in log order.

    :meth:`add` takes each part frame with a tag (its log address, say);
    once the last part arrives it returns the operation's bytes with the
    tag of its *first* part (CorruptRecordError for a frame that is not a
    part frame, or overruns its operation).  A part that does not continue
    the operation in hand (a new first part, a gap) drops what was gathered: that
    operation's remaining parts were never written, so it was never
    acknowledged.  :meth:`abandon` does the same when an ordinary frame
    comes between parts."""

    def __init__(self) -> None:
        self._parts: list[memoryview] = []
        self._have = 0
        self._total = -1
        self._tag: T | None = None

    @property
    def pending(self) -> bool:
        """Whether an operation is part way gathered."""
        return self._total >= 0

    def abandon(self) -> None:
        self._parts, self._have, self._total, self._tag = [], 0, -1, None

    def add(self, frame: bytes | memoryview, tag: T) -> tuple[bytes, T] | None:
        view = memoryview(frame)
        if len(view) < PART_OVERHEAD:
            raise CorruptRecordError("part frame shorter than its header")
        magic, total, at = _PART_HEAD.unpack_from(view, 0)
        if magic != PART_MAGIC:
            raise CorruptRecordError(f"not a part frame (magic {bytes(magic)!r})")
        body = view[PART_OVERHEAD:]
        if at == 0:
            self.abandon()
            self._total, self._tag = total, tag
        elif total != self._total or at != self._have:
            self.abandon()  # not the continuation of the operation in hand
            return None
        if self._have + len(body) > total:
            raise CorruptRecordError(f"part frame overruns its operation ({total} bytes)")
        self._parts.append(body)
        self._have += len(body)
        if self._have < total:
            return None
        operation, first = b"".join(self._parts), self._tag
        self.abandon()
        return operation, first  # type: ignore[return-value]
