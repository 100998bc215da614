"""Events out of a stream segment's bytes, as Arrow record batches.

A segment holds events framed ``i32 type 0 | i32 length | bytes``
(:data:`~quire.pravega_wire.EVENT_HEADER`).  :class:`EventSplitter` turns
the bytes of a range, fed in order whatever the pieces' boundaries, into
the events' header offsets and payloads; :func:`event_batch` makes the rows
(``event, scope, stream, segment_id, offset, timestamp``) with each event's
append time, looked up in the segment's time entries (``(offset,
time_ms)`` steps: :mod:`quire.segmentstore.append_times`).  Spark's stream
reads (:mod:`quire.spark.stream_read`) and the tier-2 history reader
(:mod:`quire.history.reader`) both build their rows here.

Events are split with numpy where a run of events has one size (the usual
case for fixed-size records: their headers checked in windows that double,
their payloads copied once as one strided copy), one header at a time
otherwise (a short run costs one window, so mixed sizes stay linear).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from quire.errors import ProtocolError
from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

NO_TIME = -1
"""An entry's time when the append time is not known (a null timestamp)."""


def arrow_schema(timestamp_unit: str = "ms") -> pa.Schema:
    """The rows of a stream: ``event binary, scope string, stream string,
    segment_id int64, offset int64, timestamp timestamp[unit, UTC]`` (null:
    append time not known)."""
    import pyarrow as pa

    return pa.schema([
        pa.field("event", pa.binary(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("segment_id", pa.int64(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp(timestamp_unit, tz="UTC")),
    ])


class EventSplitter:
    """Events out of a segment's bytes fed in order, whatever the pieces'
    boundaries: :meth:`feed` returns the header offsets and payloads of the
    events completed so far (a partial one waits for the next piece)."""

    def __init__(self, offset: int) -> None:
        self._rest = b""
        self._rest_at = offset

    @property
    def partial_bytes(self) -> int:
        return len(self._rest)

    def restart(self, offset: int) -> None:
        """Forget a partial event and expect the bytes at ``offset`` next."""
        self._rest = b""
        self._rest_at = offset

    def feed(self, data: bytes) -> tuple[np.ndarray, pa.Array]:
        """(header offsets int64, payloads as an Arrow binary array).

        The payloads are copied once, straight into the Arrow values
        buffer: a run of equal-size events as one strided numpy copy, other
        events as slices of the buffer."""
        import numpy as np
        import pyarrow as pa

        buf = self._rest + data if self._rest else data
        base = self._rest_at
        raw = np.frombuffer(buf, dtype=np.uint8)
        size = len(buf)
        pieces: list[tuple[int, int, int]] = []
        """In order: (header position, count, payload length) of a run of
        equal-size events, or (position, 0, index in ``singles``) of a group
        of events not in a run."""
        singles: list[tuple[list[int], list[int]]] = []
        """Each group's header positions and payload lengths."""
        unpack = EVENT_HEADER.unpack_from
        header = EVENT_HEADER.size
        pos = 0
        while size - pos >= header:
            kind, length = unpack(buf, pos)
            if kind != EVENT_TYPE or length < 0:
                raise ProtocolError(f"no event header at segment offset {base + pos} "
                                    f"(type {kind}, length {length})")
            stride = header + length
            if pos + stride > size:
                break
            run = (size - pos) // stride
            if run >= 16 and unpack(buf, pos + stride) == (kind, length):
                # a run of equal-size events: check their headers at once, in
                # windows that double (so a short run costs little)
                count, window = 0, 16
                while count < run:
                    w = min(window, run - count)
                    at = pos + stride * count
                    heads = raw[at:at + stride * w].reshape(w, stride)[:, :header] \
                        .copy().view(">i4")
                    same = (heads[:, 0] == EVENT_TYPE) & (heads[:, 1] == length)
                    if not bool(same.all()):
                        count += int(np.argmin(same))
                        break
                    count += w
                    window *= 2
                pieces.append((pos, count, length))
                pos += stride * count
                continue
            if not pieces or pieces[-1][1]:
                pieces.append((pos, 0, len(singles)))
                singles.append(([], []))
            singles[-1][0].append(pos)
            singles[-1][1].append(length)
            pos += stride
        self._rest = buf[pos:]
        self._rest_at = base + pos
        count = sum(n or len(singles[group][0]) for _, n, group in pieces)
        head_at = np.empty(count, dtype=np.int64)
        sizes = np.empty(count, dtype=np.int64)
        total = sum(n * size_or_group if n else sum(singles[size_or_group][1])
                    for _, n, size_or_group in pieces)
        values = np.empty(total, dtype=np.uint8)
        view = memoryview(buf)
        row = at = 0
        for first, n, size_or_group in pieces:
            if n:
                length = size_or_group
                stride = header + length
                head_at[row:row + n] = np.arange(first, first + stride * n, stride)
                sizes[row:row + n] = length
                values[at:at + n * length].reshape(n, length)[:] = \
                    raw[first:first + stride * n].reshape(n, stride)[:, header:]
                row += n
                at += n * length
                continue
            starts, lengths = singles[size_or_group]
            n = len(starts)
            head_at[row:row + n] = starts
            sizes[row:row + n] = lengths
            joined = b"".join([view[p + header:p + header + k]
                               for p, k in zip(starts, lengths, strict=True)])
            values[at:at + len(joined)] = np.frombuffer(joined, dtype=np.uint8)
            row += n
            at += len(joined)
        value_offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(sizes, out=value_offsets[1:])
        payloads = pa.Array.from_buffers(pa.binary(), count, [
            None, pa.py_buffer(value_offsets), pa.py_buffer(values)])
        return head_at + base, payloads


def event_times(offsets: np.ndarray, entries: Sequence[tuple[int, int]]) -> np.ndarray:
    """Each event's append time (ms; :data:`NO_TIME` where not known), for
    events whose headers start at ``offsets``, from the segment's time
    entries (sorted by offset)."""
    import numpy as np

    if not entries:
        return np.full(len(offsets), NO_TIME, dtype=np.int64)
    steps = np.fromiter((o for o, _ in entries), dtype=np.int64, count=len(entries))
    times = np.fromiter((t for _, t in entries), dtype=np.int64, count=len(entries))
    at = np.searchsorted(steps, offsets, side="right") - 1
    found = times[np.maximum(at, 0)]
    found[at < 0] = NO_TIME
    return found


def event_batch(schema: pa.Schema, payloads: pa.Array, scope: pa.Scalar, stream: pa.Scalar,
                segment_id: int, offsets: np.ndarray, times_ms: np.ndarray
                ) -> pa.RecordBatch:
    """One record batch of ``schema`` (:func:`arrow_schema`'s columns, its
    timestamp in any unit): the events' payloads, offsets and times."""
    import numpy as np
    import pyarrow as pa

    count = len(offsets)
    kind = schema.field("timestamp").type
    scale = {"s": 0.001, "ms": 1, "us": 1000, "ns": 1_000_000}[kind.unit]
    unknown = times_ms == NO_TIME
    values = (times_ms * scale).astype(np.int64) if scale != 1 else times_ms
    stamps = pa.array(values, type=kind, mask=unknown if unknown.any() else None)
    return pa.RecordBatch.from_arrays([
        payloads, pa.repeat(scope, count), pa.repeat(stream, count),
        pa.array(np.full(count, segment_id, dtype=np.int64)), pa.array(offsets), stamps,
    ], schema=schema)
