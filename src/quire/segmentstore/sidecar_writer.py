"""The storage writer's side of chunk sidecars (:mod:`~quire.segmentstore.chunk_sidecars`).

:class:`SidecarWriter` is what a :class:`~quire.segmentstore.storage_writer.StorageWriter`
calls at the four places a stream segment's layout gains or loses chunks:

* :meth:`~SidecarWriter.chunk_written`: a new chunk of the segment's bytes
  (its sidecar written next, before any layout naming the chunk is
  recorded);
* :meth:`~SidecarWriter.concatenated`: a run of small chunks joined into one
  (the new chunk's sidecar joins theirs);
* :meth:`~SidecarWriter.joined`: a flushed transaction's chunks joining its
  stream segment's layout at a merge (each gets a sidecar with the merge's
  time: a transaction's chunks get none of their own);
* :meth:`~SidecarWriter.delete_chunk`: a dropped chunk deleted, its sidecar
  with it.

Event boundaries come from walking the events' 8-byte headers in the bytes
flushed (:class:`EventWalk`, one per segment, resumed after a restart from
the last chunk's sidecar); append times from the container's append-time
index (:meth:`~quire.segmentstore.writer_source.WriterSource.append_times`).
"""

from __future__ import annotations

import contextlib

from quire.errors import ChunkExistsError
from quire.pravega_wire import EVENT_HEADER, EVENT_TYPE
from quire.segmentstore.chunk_sidecars import (
    UNKNOWN,
    Sidecar,
    entries_for,
    has_sidecars,
    may_have_sidecar,
    read_sidecar,
    sidecar_name,
)
from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.writer_source import WriterSource
from quire.tier2 import ChunkStorage, SegmentLayout

_HEADER = EVENT_HEADER.size
_unpack_header = EVENT_HEADER.unpack_from


class EventWalk:
    """Where a segment's events start, from its bytes fed in order:
    ``next`` is the offset of the next event header (None: not known), and
    ``carry`` the bytes from there up to ``end`` when that header is cut."""

    __slots__ = ("carry", "end", "next")

    def __init__(self, next_header: int | None, end: int, carry: bytes = b"") -> None:
        self.next = next_header
        self.end = end
        self.carry = carry

    def feed(self, at: int, data: bytes) -> int | None:
        """Walk ``data`` (the segment's bytes from ``at``, which must be
        :attr:`end`); the offset of the first event header at or after
        ``at`` (possibly past the data), None if not known."""
        end = at + len(data)
        n = self.next
        self.end = end
        if n is None:
            return None
        if n < at:  # a header cut by the end of the bytes before
            head = self.carry + data[:_HEADER - len(self.carry)]
            if len(head) < _HEADER:
                self.carry = head
                return None
            kind, length = _unpack_header(head)
            if kind != EVENT_TYPE or length < 0:
                self._lost()
                return None
            n += _HEADER + length
        first = n
        while n + _HEADER <= end:
            kind, length = _unpack_header(data, n - at)
            if kind != EVENT_TYPE or length < 0:  # not events
                self._lost()
                return first
            n += _HEADER + length
        self.next = n
        self.carry = data[n - at:] if n < end else b""
        return first

    def _lost(self) -> None:
        self.next = None
        self.carry = b""


class SidecarWriter:
    """Writes, merges and deletes the sidecars of one container's stream
    segments (module docstring)."""

    def __init__(self, storage: ChunkStorage, source: WriterSource) -> None:
        self.storage = storage
        self.source = source
        self._walks: dict[tuple[str, int], EventWalk] = {}

    def _segment(self, name: str, segment_id: int | None = None) -> SegmentMetadata | None:
        """Segment ``segment_id`` (deleted ones too: one deleted while its
        bytes are being flushed keeps its layout, chunks and all, until its
        deletion is flushed, and each of those chunks needs its sidecar),
        else the live one called ``name``; None if its chunks get none."""
        s = self.source.segment(name) if segment_id is None \
            else self.source.segments.get(segment_id)
        return s if s is not None and has_sidecars(name, s.type) else None

    async def _walk(self, s: SegmentMetadata, layout: SegmentLayout) -> EventWalk:
        """The segment's walk, at the end of ``layout`` (resumed from tier-2
        when this writer has none there)."""
        key = (s.name, s.segment_id)
        walk = self._walks.get(key)
        if walk is not None and walk.end == layout.length:
            return walk
        walk = self._walks[key] = EventWalk(None, layout.length)
        if not layout.chunks:  # nothing flushed, or truncated to its end: a boundary
            walk.next = layout.length
            return walk
        last = layout.chunks[-1]
        sidecar = await read_sidecar(self.storage, last.name)
        if sidecar is None or sidecar.next_event == UNKNOWN:
            return walk
        walk.next = last.offset + sidecar.next_event
        if walk.next < last.end:
            walk.carry = await self.storage.read(last.name, sidecar.next_event,
                                                 last.end - walk.next)
        return walk

    async def chunk_written(self, layout: SegmentLayout, chunk: str, data: bytes,
                            segment_id: int | None = None) -> None:
        """Chunk ``chunk`` holding ``data`` was written as the next chunk of
        ``layout`` (not yet in it; of segment ``segment_id`` if known): write
        its sidecar."""
        s = self._segment(layout.segment, segment_id)
        if s is None:
            return
        walk = await self._walk(s, layout)
        at = layout.length
        first = walk.feed(at, data)
        following = walk.next
        sidecar = entries_for(len(data), self.source.append_times(s.segment_id, at,
                                                                  at + len(data)), at,
                              UNKNOWN if first is None else first - at,
                              UNKNOWN if following is None else following - at)
        await self.storage.write_chunk(sidecar_name(chunk), sidecar.encode())

    async def concatenated(self, layout: SegmentLayout, first: int, count: int,
                           chunk: str, segment_id: int | None = None) -> None:
        """Chunks ``first .. first+count-1`` of ``layout`` (of segment
        ``segment_id`` if known) were joined into the new chunk ``chunk``:
        write its sidecar, theirs joined."""
        if self._segment(layout.segment, segment_id) is None:
            return
        replaced = layout.chunks[first:first + count]
        start = replaced[0].offset
        offsets: list[int] = []
        times: list[int] = []
        head = tail = None
        for ref in replaced:
            sidecar = await read_sidecar(self.storage, ref.name) or Sidecar(ref.length)
            if ref is replaced[0]:
                head = sidecar
            tail = (ref.offset, sidecar)
            for offset, time_ms in zip(sidecar.offsets, sidecar.times, strict=True):
                if not times or time_ms != times[-1]:
                    offsets.append(ref.offset - start + offset)
                    times.append(time_ms)
        assert head is not None and tail is not None
        end_at, last = tail
        following = UNKNOWN if last.next_event == UNKNOWN \
            else end_at - start + last.next_event
        joined = Sidecar(replaced[-1].end - start, head.first_event, following,
                         tuple(offsets), tuple(times))
        await self.storage.write_chunk(sidecar_name(chunk), joined.encode())

    async def joined(self, layout: SegmentLayout, offset: int, length: int,
                     segment_id: int | None = None) -> None:
        """A transaction's chunks joined ``layout`` (of segment ``segment_id``
        if known; after the merge) at ``offset``, ``length`` bytes: give each
        its sidecar."""
        s = self._segment(layout.segment, segment_id)
        if s is None:
            return
        end = offset + length
        for ref in layout.chunks:
            if ref.offset < offset or ref.end > end:
                continue
            sidecar = entries_for(ref.length, self.source.append_times(
                s.segment_id, ref.offset, ref.end), ref.offset,
                0 if ref.offset == offset else UNKNOWN,  # a transaction holds whole events
                end - ref.offset if ref.end == end else UNKNOWN)
            # ChunkExistsError: an earlier owner's flush of the same merge wrote it
            with contextlib.suppress(ChunkExistsError):
                await self.storage.write_chunk(sidecar_name(ref.name), sidecar.encode())
        self._walks[(s.name, s.segment_id)] = EventWalk(end, end)

    async def delete_chunk(self, chunk: str) -> None:
        """Delete a dropped chunk, then its sidecar (if it has one)."""
        await self.storage.delete(chunk)
        if may_have_sidecar(chunk):
            await self.storage.delete(sidecar_name(chunk))
