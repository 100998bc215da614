"""What a Spark task does to read one segment range of a stream: bytes from
tier-2 (the flushed part, :mod:`quire.spark.tier2_reads`) and then from the
segment store (the unflushed tail), split into events, handed to Spark as
Arrow record batches (:mod:`quire.history.events`).

The input partition, :class:`SegmentRange`, holds plain data only (it
travels from the driver to the executors).  Its ``first`` and ``last`` are
event boundaries; the flushed length in between is not, so one
:class:`~quire.history.events.EventSplitter` sees the bytes of both sources
in order.  The next read is on the wire while the current bytes are split
and handed over.

Each event's ``timestamp`` is its append time: for the flushed part from
the tier-2 chunks' sidecars, for the rest from the segment store (Quire's
own ``ReadAppendTimes`` request, :mod:`quire.streams.append_times`), asked
once per partition while the first bytes are read.
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
from quire.history.events import EventSplitter, event_batch, event_times
from quire.security import Credentials
from quire.spark._runtime import runtime
from quire.spark.stream_plan import StreamDataLossError
from quire.spark.tier2_reads import Tier2Layout, reread_layout, tier2_sidecars, tier2_storage
from quire.streams.append_times import append_times
from quire.streams.controller import ControllerClient
from quire.streams.credentials import StreamAccess
from quire.streams.model import segment_name
from quire.streams.segments import RemoteSegmentStore, SegmentClientConfig
from quire.tier2 import read_segment

if TYPE_CHECKING:
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
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials, self.tls_cert,
                            self.tls_key)

    @property
    def name(self) -> str:
        return segment_name(self.scope, self.stream, self.segment_id)


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

    async def times(self) -> list[tuple[int, int]]:
        """When the range's bytes were appended: ``(offset, time_ms)`` entries
        (from tier-2's sidecars below the planned flushed length, from the
        segment store above it)."""
        part, layout = self.part, self.layout
        entries: list[tuple[int, int]] = []
        try:
            if layout is not None and self._tier2_end > part.first:
                sidecars = await tier2_sidecars(layout.uri)
                entries = await sidecars.times(layout.layout(), part.first, self._tier2_end)
            if self._tier2_end < part.last:
                _controller, segments = await stream_clients(part.access, part.read_bytes)
                _stored, more = await append_times(segments, part.name,
                                                   max(part.first, self._tier2_end), part.last)
                entries += more
        except (SegmentTruncatedError, SegmentNotFoundError):
            pass  # gone since planning: the bytes' reads say so (or skip them)
        return entries

    async def close(self) -> None:
        if self._used_store:
            _controller, segments = await stream_clients(self.part.access,
                                                         self.part.read_bytes)
            segments.done_reading(self.part.name)


def read_segment_range(part: SegmentRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range's events as record batches of ``schema`` (event, scope,
    stream, segment_id, offset, timestamp), in segment order, up to
    ``batch_rows`` each."""
    import pyarrow as pa

    rt = runtime()
    source = _RangeBytes(part)
    splitter = EventSplitter(part.first)
    scope = pa.scalar(part.scope, pa.string())
    stream = pa.scalar(part.stream, pa.string())
    asked = rt.submit(source.times())
    entries: list[tuple[int, int]] | None = None
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
            if entries is None:
                entries = asked.result()
            times = event_times(offsets, entries)
            count = len(offsets)
            for low in range(0, count, part.batch_rows):
                high = min(count, low + part.batch_rows)
                yield event_batch(schema, payloads.slice(low, high - low), scope, stream,
                                  part.segment_id, offsets[low:high], times[low:high])
        if splitter.partial_bytes:
            raise ProtocolError(f"segment {part.name}: {splitter.partial_bytes} bytes of an "
                                f"event cross the planned end {part.last}")
    finally:
        if not asked.done():
            asked.cancel()
        rt.run(source.close())
