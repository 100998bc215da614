"""Which bytes of a stream's flushed history to read, and in which pieces.

:func:`plan_history` walks a stream's segments from a start cut the way a
reader does, following the controller's epochs (successors of a sealed
segment join once all their predecessors are read to their end), up to an
end cut, within what tier-2 holds:

* a segment is read from its cut offset (raised to its tier-2 start: bytes
  truncated since are gone) to its end cut offset, or else to the length
  tier-2 holds;
* its successors are read only once it is *flushed whole*: sealed in
  tier-2 (its layout records it sealed, every byte flushed), so a routing
  key's events before a scale are all read before any after it;
* a segment tier-2 records deleted was truncated away: it is skipped.

Bounds are stream cuts (segment id -> offset), or times (ms since the
epoch, or a :class:`datetime.datetime`): :func:`time_cut` finds the cut
where appends at or after a time start, with a binary search over each
segment's chunk sidecars (no event bytes are read).  A window ``[start,
end)`` of times reads exactly the events appended in it.

Each segment's range is cut into :class:`HistorySplit` pieces of about
``split_bytes`` at event boundaries the chunks' sidecars record, so readers
(Spark tasks, dataset fragments) share a segment.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from quire.controller.model import StreamRecord
from quire.history.catalog import Tier2Catalog
from quire.segmentstore.chunk_sidecars import UNKNOWN
from quire.streams.model import segment_name
from quire.tier2 import ChunkRef, SegmentLayout

Bound = Mapping[int, int] | int | datetime.datetime | None
"""A start or end: a stream cut, a time (ms since the epoch, or a datetime), or none."""
DEFAULT_SPLIT_BYTES = 64 << 20


def time_ms(when: int | datetime.datetime) -> int:
    """A time as ms since the epoch (a naive datetime is taken as UTC)."""
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return int(when.timestamp() * 1000)
    return int(when)


@dataclass(frozen=True)
class HistorySplit:
    """Bytes ``first .. last`` of one segment (both event boundaries), read
    from the chunks its layout names: plain data (a Spark input partition
    carries one)."""

    uri: str
    scope: str
    stream: str
    segment_id: int
    first: int
    last: int
    chunks: tuple[tuple[str, int, int], ...]
    """(chunk name, segment offset of its first byte, bytes) of the chunks holding them."""
    segment: str

    def layout(self) -> SegmentLayout:
        chunks = tuple(ChunkRef(*c) for c in self.chunks)
        start = chunks[0].offset if chunks else self.first
        return SegmentLayout(self.segment, chunks, start, chunks[-1].end if chunks else start)

    @property
    def bytes(self) -> int:
        return self.last - self.first


async def time_cut(catalog: Tier2Catalog, scope: str, stream: str, record: StreamRecord,
                   when: int) -> dict[int, int]:
    """The stream cut where appends at or after ``when`` (ms) start, from
    the stream's head: each segment at its first append at or after it
    (from its chunks' sidecars), or at its tier-2 length if none; a segment
    flushed whole before it gives way to its successors."""
    cut: dict[int, int] = {}
    ended: set[int] = set()
    queue = sorted(record.head_cut())
    seen = set(queue)
    while queue:
        sid = queue.pop(0)
        layout = catalog.segment_layout(scope, stream, sid)
        gone = layout is None and catalog.deleted(segment_name(scope, stream, sid))
        offset = None if layout is None else await catalog.sidecars.locate(layout, when)
        if offset is None and (gone or (layout is not None and layout.sealed)) \
                and record.successors(sid):
            ended.add(sid)
            for successor, predecessors in record.successors(sid):
                if successor.id not in seen and all(p in ended for p in predecessors):
                    seen.add(successor.id)
                    queue.append(successor.id)
            continue
        found = offset if offset is not None else (0 if layout is None else layout.length)
        cut[sid] = max(found, record.head_cut().get(sid, 0))
    return cut


async def resolve(catalog: Tier2Catalog, scope: str, stream: str, record: StreamRecord,
                  bound: Bound) -> dict[int, int] | None:
    """A bound as a stream cut (None: unbounded)."""
    if bound is None:
        return None
    if isinstance(bound, Mapping):
        return {int(k): int(v) for k, v in bound.items()}
    return await time_cut(catalog, scope, stream, record, time_ms(bound))


@dataclass(frozen=True)
class Span:
    """Bytes ``first .. last`` of one segment, both event boundaries."""

    segment_id: int
    first: int
    last: int
    layout: SegmentLayout


def plan_spans(catalog: Tier2Catalog, scope: str, stream: str, record: StreamRecord,
               start: Mapping[int, int], end: Mapping[int, int] | None) -> list[Span]:
    """The ranges to read from ``start`` up to ``end`` (None: everything
    flushed), in reading order: predecessors before successors."""
    spans: list[Span] = []
    ended: set[int] = set()
    positions = dict(start)
    queue = sorted(positions)
    while queue:
        sid = queue.pop(0)
        layout = catalog.segment_layout(scope, stream, sid)
        stop = None if end is None else end.get(sid)
        bounded = stop is not None
        if layout is None:
            if not catalog.deleted(segment_name(scope, stream, sid)):
                continue  # not flushed yet: nothing of it (nor after it) is in tier-2
            whole = True  # truncated away: go on with its successors
        else:
            first = max(positions[sid], layout.start_offset)
            last = layout.length if stop is None else min(layout.length, stop)
            if last > first:
                spans.append(Span(sid, first, last, layout))
            whole = layout.sealed and not bounded
        if not whole or bounded:
            continue
        ended.add(sid)
        for successor, predecessors in record.successors(sid):
            if successor.id not in positions and all(p in ended for p in predecessors):
                positions[successor.id] = 0
                queue.append(successor.id)
    return spans


async def split_spans(catalog: Tier2Catalog, uri: str, scope: str, stream: str,
                      spans: list[Span], split_bytes: int) -> list[HistorySplit]:
    """Each span cut at event boundaries (from the sidecars of the chunks
    near every ``split_bytes``-th byte) into splits of about that size."""
    splits: list[HistorySplit] = []
    for span in spans:
        cuts = [span.first]
        target = span.first + split_bytes
        for chunk in span.layout.chunks:
            if chunk.end <= target or chunk.offset >= span.last:
                continue
            sidecar = await catalog.sidecars.get(chunk.name)
            if sidecar is None or sidecar.first_event == UNKNOWN:
                continue
            boundary = chunk.offset + sidecar.first_event
            if cuts[-1] + split_bytes // 2 <= boundary < span.last \
                    and boundary < chunk.end:
                cuts.append(boundary)
                target = boundary + split_bytes
        cuts.append(span.last)
        for first, last in itertools.pairwise(cuts):
            held = tuple((c.name, c.offset, c.length) for c in span.layout.chunks
                         if c.end > first and c.offset < last)
            splits.append(HistorySplit(uri, scope, stream, span.segment_id, first, last, held,
                                       span.layout.segment))
    return splits


async def plan_history(catalog: Tier2Catalog, uri: str, scope: str, stream: str,
                       start: Bound = None, end: Bound = None,
                       split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[HistorySplit]:
    """The splits reading stream ``scope/stream`` from ``start`` (None: its
    head) up to ``end`` (None: all that is flushed) out of tier-2."""
    record = await catalog.stream(scope, stream)
    start_cut = await resolve(catalog, scope, stream, record, start)
    end_cut = await resolve(catalog, scope, stream, record, end)
    spans = plan_spans(catalog, scope, stream, record,
                       record.head_cut() if start_cut is None else start_cut, end_cut)
    return await split_spans(catalog, uri, scope, stream, spans, split_bytes)
