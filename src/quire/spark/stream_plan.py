"""Planning stream reads between stream cuts (on the Spark driver).

A *stream cut* maps segment ids to offsets; the segments of a cut cover the
stream's key space once, each at an event boundary.  :func:`plan_between`
turns a start cut and an end cut into the byte ranges to read (one per
segment, ``[first, last)``, both event boundaries) and the cut where that
reading ends, following the stream's scaling the way a reader does:

* a segment of the end cut is read up to its offset there, and never past
  it (nothing after the end cut is read);
* any other segment is read to its length; once it is sealed and read to
  its end it is *ended*, and each successor whose predecessors have all
  ended joins at offset 0 (so a routing key's events before a scale are read
  before its events after it);
* an ended segment leaves the resulting cut once all its successors are in
  it; until then (a successor waiting for another predecessor, or a sealed
  stream with none) it stays in it at its end.

With a :class:`Budget` (a micro-batch's ``max_rows_per_trigger`` /
``max_bytes_per_trigger``) the planner moves the segments forward in rounds,
each active segment getting an equal share of what is left; the event
boundaries it stops at are found by reading the events' 8-byte headers
through the segment store (only for limited micro-batches: without a limit
segment lengths are boundaries already).  At least one event is taken when
any is available, so a query always makes progress.

Offsets below a segment's start (truncated away before they were read) and
segments deleted by truncation are *data loss*: :class:`StreamDataLossError`
when ``fail_on_data_loss``, else a warning and reading goes on from where
the segment starts now.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from quire.errors import ProtocolError, SegmentNotFoundError, SegmentTruncatedError
from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE
from quire.streams.controller import ControllerClient
from quire.streams.model import segment_name
from quire.streams.segments import RemoteSegmentStore

log = logging.getLogger("quire.spark")

Cut = dict[int, int]


class StreamDataLossError(SegmentTruncatedError):
    """Stream data was truncated away before the query read it (set
    ``fail_on_data_loss`` to false to skip it with a warning)."""


@dataclass
class Budget:
    """What one micro-batch may still take (None: no limit on that)."""

    rows: int | None = None
    bytes: int | None = None
    taken_rows: int = 0
    taken_bytes: int = 0

    @property
    def exhausted(self) -> bool:
        return (self.rows is not None and self.taken_rows >= self.rows) or \
            (self.bytes is not None and self.taken_bytes >= self.bytes)

    def share(self, ways: int) -> tuple[int | None, int | None]:
        """An equal share of what is left, for one of ``ways`` segments."""
        rows = None if self.rows is None else max(1, (self.rows - self.taken_rows) // ways)
        size = None if self.bytes is None else max(1, (self.bytes - self.taken_bytes) // ways)
        return rows, size


@dataclass(frozen=True)
class SegmentSpan:
    """Bytes ``[first, last)`` of one segment, both event boundaries."""

    segment_id: int
    first: int
    last: int


@dataclass
class _Segment:
    first: int
    pos: int
    stop: int = 0
    bounded: bool = False
    sealed: bool = False
    known: bool = False
    ended: bool = False
    successors: list[int] = field(default_factory=list)


class CutPlanner:
    """Plans reads of ``scope/stream`` (module docstring)."""

    def __init__(self, controller: ControllerClient, segments: RemoteSegmentStore, scope: str,
                 stream: str, fail_on_data_loss: bool = True, read_bytes: int = 1 << 20) -> None:
        self.controller = controller
        self.segments = segments
        self.scope = scope
        self.stream = stream
        self.fail_on_data_loss = fail_on_data_loss
        self.read_bytes = read_bytes

    def name(self, sid: int) -> str:
        return segment_name(self.scope, self.stream, sid)

    def data_loss(self, what: str, start_offset: int = 0) -> None:
        """Raise StreamDataLossError, or warn (``fail_on_data_loss`` false)."""
        if self.fail_on_data_loss:
            raise StreamDataLossError(
                f"stream {self.scope}/{self.stream}: {what}; set fail_on_data_loss=false to "
                "skip what was lost", start_offset)
        log.warning("stream %s/%s: %s; skipping it (fail_on_data_loss=false)", self.scope,
                    self.stream, what)

    async def head_cut(self) -> Cut:
        return await self.controller.head_cut(self.scope, self.stream)

    async def tail_cut(self) -> Cut:
        """Each current segment at its length now."""
        current = await self.controller.current_segments(self.scope, self.stream)
        infos = await asyncio.gather(*(self.segments.get_info(s.name) for s in current))
        return {s.id: info.length for s, info in zip(current, infos, strict=True)}

    async def _learn(self, sid: int, seg: _Segment, end: Cut) -> None:
        try:
            info = await self.segments.get_info(self.name(sid))
        except SegmentNotFoundError:
            self.data_loss(f"segment {sid} was deleted (truncated away) before offset "
                           f"{seg.pos} was read")
            seg.known = seg.sealed = True
            seg.stop = seg.pos  # nothing to read: go on with its successors
            return
        if seg.pos < info.start_offset:
            self.data_loss(f"segment {sid}: offsets {seg.pos}..{info.start_offset} were "
                           "truncated before they were read", info.start_offset)
            seg.first = seg.pos = info.start_offset
        seg.bounded = sid in end
        seg.stop = max(seg.pos, min(end[sid], info.length) if seg.bounded else info.length)
        seg.sealed = info.sealed
        seg.known = True

    async def plan_between(self, start: Cut, end: Cut, budget: Budget | None = None
                           ) -> tuple[list[SegmentSpan], Cut]:
        """The spans to read from ``start`` up to ``end`` (within ``budget``)
        and the cut where they end (module docstring)."""
        state = {sid: _Segment(first=offset, pos=offset) for sid, offset in start.items()}
        while True:
            await asyncio.gather(*(self._learn(sid, seg, end) for sid, seg in state.items()
                                   if not seg.known))
            if await self._follow_successors(state):
                continue  # learn the segments that joined
            active = sorted(sid for sid, seg in state.items() if seg.pos < seg.stop)
            if not active:
                break
            if budget is None:
                for sid in active:
                    state[sid].pos = state[sid].stop
                continue
            if budget.exhausted:
                break
            moved = False
            for sid in active:
                if budget.exhausted:
                    break
                rows, size = budget.share(len(active))
                seg = state[sid]
                new_pos, got_rows, got_bytes = await self._scan(
                    sid, seg.pos, seg.stop, rows, size,
                    force_one=budget.taken_rows == 0 and budget.taken_bytes == 0)
                moved = moved or new_pos > seg.pos
                seg.pos = new_pos
                budget.taken_rows += got_rows
                budget.taken_bytes += got_bytes
            if not moved:
                break
        spans = [SegmentSpan(sid, seg.first, seg.pos) for sid, seg in sorted(state.items())
                 if seg.pos > seg.first]
        cut = {sid: seg.pos for sid, seg in state.items()
               if not (seg.ended and seg.successors
                       and all(s in state for s in seg.successors))}
        return spans, cut

    async def _follow_successors(self, state: dict[int, _Segment]) -> bool:
        """Mark segments read to their sealed end as ended and add the
        successors all of whose predecessors ended; True if any joined."""
        joined = False
        newly = [sid for sid, seg in sorted(state.items())
                 if not seg.ended and not seg.bounded and seg.sealed and seg.pos >= seg.stop]
        for sid in newly:
            state[sid].ended = True
        found = await asyncio.gather(*(self.controller.successors(self.scope, self.stream, sid)
                                       for sid in newly))
        for sid, successors in zip(newly, found, strict=True):
            state[sid].successors = [s.id for s, _ in successors]
        for successors in found:
            for successor, predecessors in successors:
                if successor.id not in state and all(
                        p in state and state[p].ended for p in predecessors):
                    state[successor.id] = _Segment(first=0, pos=0)
                    joined = True
        return joined

    async def _scan(self, sid: int, pos: int, stop: int, rows: int | None, size: int | None,
                    force_one: bool) -> tuple[int, int, int]:
        """Walk event headers from ``pos`` (before ``stop``) while the events
        fit ``rows`` and ``size`` (at least one with ``force_one``): the
        boundary reached, events and bytes taken."""
        name = self.name(sid)
        taken = used = 0
        at = pos
        buffer = b""
        buffer_at = pos
        try:
            while at < stop:
                if rows is not None and taken >= rows:
                    break
                if len(buffer) - (at - buffer_at) < EVENT_HEADER.size:
                    buffer, buffer_at = buffer[at - buffer_at:], at
                while len(buffer) < EVENT_HEADER.size:
                    buffer = await self._more(name, buffer, buffer_at, stop)
                kind, length = EVENT_HEADER.unpack_from(buffer, at - buffer_at)
                if kind != EVENT_TYPE or length < 0:
                    raise ProtocolError(f"segment {name}: no event header at offset {at}")
                event = EVENT_HEADER.size + length
                if size is not None and used + event > size and not (force_one and taken == 0):
                    break
                at += event
                taken += 1
                used += event
                if at - buffer_at >= len(buffer):
                    buffer, buffer_at = b"", at  # skip payloads without reading them twice
        finally:
            self.segments.done_reading(name)
        return at, taken, used

    async def _more(self, name: str, buffer: bytes, buffer_at: int, stop: int) -> bytes:
        end = buffer_at + len(buffer)
        if end >= stop:
            raise ProtocolError(f"segment {name}: an event header crosses offset {stop}, "
                                "which should be an event boundary")
        r = await self.segments.read(name, end, min(self.read_bytes, stop - end))
        if not r.data:
            raise ProtocolError(f"segment {name}: no bytes at {end}, below its length {stop}")
        return buffer + r.data
