"""What a Spark task does to read one segment range of a stream: bytes from
tier-2 (the flushed part, :mod:`quire.spark.tier2_reads`) and then from the
segment store (the unflushed tail), split into events, handed to Spark as
Arrow record batches.

The input partition, :class:`SegmentRange`, holds plain data only (it
travels from the driver to the executors).  Its ``first`` and ``last`` are
event boundaries; the flushed length in between is not, so one
:class:`EventSplitter` sees the bytes of both sources in order.  The next
read is on the wire while the current bytes are split and handed over.

Events are split with numpy where a run of events has one size (the usual
case for fixed-size records: their headers checked in windows that double,
their payloads copied once as one strided copy), one header at a time
otherwise (a short run costs one window, so mixed sizes stay linear).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import InputPartition

from quire.errors import ProtocolError, SegmentNotFoundError, SegmentTruncatedError
from quire.security import Credentials
from quire.spark._runtime import runtime
from quire.spark.stream_plan import StreamDataLossError
from quire.spark.tier2_reads import Tier2Layout, reread_layout, tier2_storage
from quire.streams.controller import ControllerClient
from quire.streams.credentials import StreamAccess
from quire.streams.model import EVENT_HEADER, EVENT_TYPE, segment_name
from quire.streams.segments import RemoteSegmentStore, SegmentClientConfig
from quire.tier2 import read_segment

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

log = logging.getLogger("quire.spark")

_clients: dict[tuple[int, StreamAccess], tuple[ControllerClient, RemoteSegmentStore]] = {}
"""(process id, access) -> its clients (touched on the runtime loop only)."""


async def stream_clients(access: StreamAccess, read_bytes: int = 1 << 20
                         ) -> tuple[ControllerClient, RemoteSegmentStore]:
    """This process's controller client and segment store client for
    ``access`` (call on the runtime loop; kept for the process)."""
    key = (os.getpid(), access)
    found = _clients.get(key)
    if found is None:
        found = _clients[key] = access.clients(
            config=SegmentClientConfig(read_length_bytes=read_bytes))
    return found


@dataclass
class SegmentRange(InputPartition):
    """One input partition: bytes ``[first, last)`` of one segment."""

    controller: str
    scope: str
    stream: str
    segment_id: int
    first: int
    last: int
    tier2: Tier2Layout | None = None
    """The segment's tier-2 layout at planning (None: no tier-2 reads)."""
    fail_on_data_loss: bool = True
    read_bytes: int = 1 << 20
    batch_rows: int = 8192
    tls_ca: str | None = None
    credentials: Credentials | None = None

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials)

    @property
    def name(self) -> str:
        return segment_name(self.scope, self.stream, self.segment_id)


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


class _RangeBytes:
    """The range's bytes in order, one read at a time (run on the loop):
    tier-2 below the planned flushed length, the segment store above it."""

    def __init__(self, part: SegmentRange) -> None:
        self.part = part
        self.pos = part.first
        self.layout = part.tier2
        self._tier2_end = self._flushed_end()
        self._used_store = False

    def _flushed_end(self) -> int:
        layout = self.layout
        if layout is None or layout.start_offset > self.pos:
            return self.pos  # nothing of it from tier-2
        return min(self.part.last, layout.length)

    def _lost(self, what: str, resume_at: int) -> None:
        part = self.part
        if part.fail_on_data_loss:
            raise StreamDataLossError(
                f"stream {part.scope}/{part.stream} segment {part.segment_id}: {what} since "
                "the read was planned; set fail_on_data_loss=false to skip what was lost",
                resume_at)
        log.warning("stream %s/%s segment %d: %s since the read was planned; skipping to "
                    "offset %d (fail_on_data_loss=false)", part.scope, part.stream,
                    part.segment_id, what, resume_at)

    async def next(self) -> tuple[int, bytes, bool] | None:
        """``(offset, bytes, restarted)`` of the next piece, None at the
        end; ``restarted``: bytes before ``offset`` were lost (skipped)."""
        part = self.part
        restarted = False
        while self.pos < part.last:
            at = self.pos
            if at < self._tier2_end:
                assert self.layout is not None
                count = min(part.read_bytes, self._tier2_end - at)
                try:
                    data = await read_segment(await tier2_storage(self.layout.uri),
                                              self.layout.layout(), at, count)
                except SegmentTruncatedError:
                    planned = self.layout
                    self.layout = await reread_layout(planned.uri, planned.segment)
                    if self.layout is not None and self.layout.start_offset <= at:
                        # replaced (a concatenation), not lost: read by the new layout
                        if self.layout == planned:
                            raise ProtocolError(
                                f"segment {part.name}: a tier-2 chunk holding offset {at} is "
                                "missing, yet the layout still records it") from None
                        self._tier2_end = self._flushed_end()
                        continue
                    start = part.last if self.layout is None else self.layout.start_offset
                    self._lost(f"tier-2 chunks at offset {at} vanished (the segment was "
                               f"{'deleted' if self.layout is None else 'truncated'})", start)
                    self.pos = max(at, start)
                    self._tier2_end = self._flushed_end()
                    restarted = True
                    continue
            else:
                _controller, segments = await stream_clients(part.access, part.read_bytes)
                self._used_store = True
                try:
                    r = await segments.read(part.name, at, min(part.read_bytes, part.last - at))
                except SegmentTruncatedError as e:
                    self._lost(f"offsets {at}..{e.start_offset} were truncated", e.start_offset)
                    self.pos = max(at, e.start_offset)
                    restarted = True
                    continue
                except SegmentNotFoundError:
                    self._lost("the segment was deleted (truncated away)", part.last)
                    self.pos = part.last
                    restarted = True
                    continue
                data = r.data
                if not data:
                    raise ProtocolError(f"segment {part.name}: no bytes at {at}, below the "
                                        f"planned end {part.last}")
            self.pos = at + len(data)
            return at, data, restarted
        if restarted:
            return self.pos, b"", True
        return None

    async def close(self) -> None:
        if self._used_store:
            _controller, segments = await stream_clients(self.part.access,
                                                         self.part.read_bytes)
            segments.done_reading(self.part.name)


def read_segment_range(part: SegmentRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range's events as record batches of ``schema`` (event, scope,
    stream, segment_id, offset), in segment order, up to ``batch_rows`` each."""
    import numpy as np
    import pyarrow as pa

    rt = runtime()
    source = _RangeBytes(part)
    splitter = EventSplitter(part.first)
    scope = pa.scalar(part.scope, pa.string())
    stream = pa.scalar(part.stream, pa.string())
    try:
        pending: concurrent.futures.Future[tuple[int, bytes, bool] | None] | None = \
            rt.submit(source.next())
        while pending is not None:
            piece = pending.result()
            if piece is None:
                break
            pending = rt.submit(source.next())
            at, data, restarted = piece
            if restarted:
                splitter.restart(at)
            offsets, payloads = splitter.feed(data)
            count = len(offsets)
            for low in range(0, count, part.batch_rows):
                high = min(count, low + part.batch_rows)
                n = high - low
                yield pa.RecordBatch.from_arrays([
                    payloads.slice(low, n),
                    pa.repeat(scope, n),
                    pa.repeat(stream, n),
                    pa.array(np.full(n, part.segment_id, dtype=np.int64)),
                    pa.array(offsets[low:high]),
                ], schema=schema)
        if splitter.partial_bytes:
            raise ProtocolError(f"segment {part.name}: {splitter.partial_bytes} bytes of an "
                                f"event cross the planned end {part.last}")
    finally:
        rt.run(source.close())
