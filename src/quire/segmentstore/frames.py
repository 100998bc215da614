"""Data frames: many serialized operations in one tier-1 record (sans-IO).

A container appends one *frame* per log record, so a hundred small appends
cost one ledger entry, not a hundred.  Byte layout (big-endian)::

    frame := magic "QSF1" | count:u32 | (length:u32 | operation) * count

An operation is never split across frames: a frame holds whole operations,
and is written (and so lost or kept) whole.  :class:`FrameBuilder` fills a
frame up to ``max_bytes`` (an operation larger than that gets a frame of its
own); :func:`unpack` gives a frame's operations back.
"""

from __future__ import annotations

import struct

MAGIC = b"QSF1"
_HEAD = struct.Struct(">4sI")
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
    """The serialized operations of one frame, in order (ValueError if malformed)."""
    view = memoryview(frame)
    if len(view) < _HEAD.size:
        raise ValueError("frame shorter than its header")
    magic, count = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise ValueError(f"not a data frame (magic {bytes(magic)!r})")
    pos = _HEAD.size
    out = []
    for _ in range(count):
        if pos + _LEN.size > len(view):
            raise ValueError("frame cut short in an operation's length")
        (n,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        if pos + n > len(view):
            raise ValueError("frame cut short in an operation")
        out.append(view[pos:pos + n])
        pos += n
    if pos != len(view):
        raise ValueError(f"{len(view) - pos} trailing bytes after the frame's operations")
    return out
