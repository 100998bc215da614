"""The read index: committed segment data kept in memory, within a byte budget.

Each segment's committed appends are chunks ``(offset, data, address)`` in
offset order; ``address`` is the tier-1 frame that holds the append.  When
the cached bytes pass ``budget_bytes`` the oldest chunks (in commit order)
drop their data but keep their place, and a read that needs one fetches it
back from tier-1 through ``fetch`` (part 2 adds tier-2).  Readers at the
tail of a segment wait on :meth:`ReadIndex.changed`, which the container
completes when the segment grows, is sealed, truncated or deleted.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
from collections.abc import Awaitable, Callable

from quire.log import Position

Fetch = Callable[[int, int, int, Position], Awaitable[bytes]]
"""``fetch(segment_id, offset, length, address)``: the ``length`` bytes of
the segment's appends from ``offset`` on in the frame at ``address``."""


class _Chunk:
    """Consecutive bytes of one segment from one tier-1 frame (the appends to
    a segment in one frame make one chunk)."""

    __slots__ = ("address", "length", "offset", "origin", "parts")

    def __init__(self, offset: int, data: bytes, address: Position) -> None:
        self.offset = offset
        self.length = len(data)
        self.parts: list[bytes] | None = [data]
        """The cached bytes (joined on first read), None once evicted."""
        self.address = address
        self.origin: tuple[int, int] | None = None
        """(segment id, offset) of the bytes in their frame, if not this
        segment's at ``offset`` (a merged segment's chunks)."""

    def cached(self) -> bytes | None:
        parts = self.parts
        if parts is None:
            return None
        if len(parts) > 1:
            parts[:] = [b"".join(parts)]
        return parts[0]


class _Segment:
    __slots__ = ("chunks", "offsets", "waiters")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.chunks: list[_Chunk] = []
        self.waiters: list[asyncio.Future[None]] = []


class ReadIndex:
    """See the module docstring."""

    def __init__(self, fetch: Fetch, budget_bytes: int = 256 << 20) -> None:
        self._fetch = fetch
        self.budget_bytes = budget_bytes
        self.cached_bytes = 0
        self._segments: dict[int, _Segment] = {}
        self._age: collections.deque[_Chunk] = collections.deque()

    def append(self, segment_id: int, offset: int, data: bytes, address: Position) -> None:
        """Committed data of one append (offsets increase per segment)."""
        segment = self._segments.get(segment_id)
        if segment is None:
            segment = self._segments[segment_id] = _Segment()
        if data:
            chunks = segment.chunks
            last = chunks[-1] if chunks else None
            if last is not None and last.parts is not None and last.origin is None \
                    and last.offset + last.length == offset \
                    and (last.address is address or last.address == address):
                last.parts.append(data)  # the same frame: one chunk
                last.length += len(data)
            else:
                chunk = _Chunk(offset, data, address)
                segment.offsets.append(offset)
                chunks.append(chunk)
                self._age.append(chunk)
            self.cached_bytes += len(data)
            if self.cached_bytes > self.budget_bytes:
                self._evict()
        if segment.waiters:
            self.notify(segment_id)

    def merge(self, target_id: int, source_id: int, target_offset: int) -> None:
        """Move the source's chunks to the end of the target (at ``target_offset``)."""
        source = self._segments.pop(source_id, None)
        target = self._segments.get(target_id)
        if target is None:
            target = self._segments[target_id] = _Segment()
        if source is not None:
            for chunk in source.chunks:
                if chunk.origin is None:
                    chunk.origin = (source_id, chunk.offset)
                chunk.offset += target_offset
                target.offsets.append(chunk.offset)
                target.chunks.append(chunk)
            for waiter in source.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self.notify(target_id)

    def _evict(self) -> None:
        while self.cached_bytes > self.budget_bytes and self._age:
            self._forget(self._age.popleft())

    def truncate(self, segment_id: int, start_offset: int) -> None:
        """Drop the chunks wholly below ``start_offset``."""
        segment = self._segments.get(segment_id)
        if segment is not None:
            keep = bisect.bisect_right(segment.offsets, start_offset) - 1
            if keep > 0:
                for chunk in segment.chunks[:keep]:
                    self._forget(chunk)
                del segment.offsets[:keep], segment.chunks[:keep]
        self.notify(segment_id)

    def delete(self, segment_id: int) -> None:
        segment = self._segments.pop(segment_id, None)
        if segment is not None:
            for chunk in segment.chunks:
                self._forget(chunk)
            for waiter in segment.waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _forget(self, chunk: _Chunk) -> None:
        if chunk.parts is not None:
            chunk.parts = None
            self.cached_bytes -= chunk.length

    def notify(self, segment_id: int) -> None:
        """Wake the readers waiting on the segment."""
        segment = self._segments.get(segment_id)
        if segment is not None and segment.waiters:
            for waiter in segment.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            segment.waiters.clear()

    def notify_all(self) -> None:
        for segment_id in list(self._segments):
            self.notify(segment_id)

    def changed(self, segment_id: int) -> asyncio.Future[None]:
        """A future completed at the segment's next change."""
        segment = self._segments.get(segment_id)
        if segment is None:
            segment = self._segments[segment_id] = _Segment()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        segment.waiters.append(waiter)
        return waiter

    async def read(self, segment_id: int, offset: int, max_length: int) -> bytes:
        """Up to ``max_length`` committed bytes from ``offset`` (the caller
        checked that they exist and are not truncated)."""
        segment = self._segments.get(segment_id)
        if segment is None or max_length <= 0:
            return b""
        i = bisect.bisect_right(segment.offsets, offset) - 1
        if i < 0:
            return b""
        parts: list[bytes] = []
        want = max_length
        position = offset
        chunks = segment.chunks
        while want > 0 and i < len(chunks):
            chunk = chunks[i]
            if chunk.offset > position:
                break  # a gap: cannot happen for committed data
            data = chunk.cached()
            if data is None:
                origin_id, origin_offset = chunk.origin or (segment_id, chunk.offset)
                data = await self._fetch(origin_id, origin_offset, chunk.length, chunk.address)
                if segment is not self._segments.get(segment_id) or i >= len(chunks) \
                        or chunks[i] is not chunk:
                    # truncated or deleted meanwhile: start again from the current index
                    return b"".join(parts) + await self.read(segment_id, position, want) \
                        if segment_id in self._segments else b"".join(parts)
            start = position - chunk.offset
            piece = data[start:start + want]
            if not piece:
                break
            parts.append(piece)
            position += len(piece)
            want -= len(piece)
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)
