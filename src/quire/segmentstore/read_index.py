"""The read index: committed segment data kept in memory, within a byte budget.

Each segment's committed appends are chunks ``(offset, data, address)`` in
offset order (a segment's appends in one frame make one chunk); ``address``
is the tier-1 frame that holds them.  When the cached bytes pass
``budget_bytes`` the oldest chunks (in commit order) drop their data but
keep their place, and a read that needs one fetches it back from tier-1
through ``fetch_tier2`` if tier-2 has them, else ``fetch`` from their
tier-1 frame.  Bytes the index has no chunk for (below a segment's
first chunk, or in a gap: data committed before the container's tier-1 log
was truncated, now only in tier-2) come from ``fetch_tier2``.  Readers at the
tail of a segment wait on :meth:`ReadIndex.changed`, which the container
completes when the segment grows, is sealed, truncated or deleted.

Evicted chunks that tier-2 holds (below the length the storage writer
reported through :meth:`ReadIndex.flushed`) are dropped from the lists in
batches: without that, a long-lived container's index would keep a few
dozen bytes for every append it ever took.
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

DROP_BATCH_CHUNKS = 64
"""Evicted chunks that tier-2 holds are dropped from a segment's lists at
least this many at a time (``ReadIndex.drop_batch_chunks``; tests use 1)."""

FetchTier2 = Callable[[int, int, int], Awaitable[bytes]]
"""``fetch_tier2(segment_id, offset, length)``: up to ``length`` bytes of the
segment from ``offset`` out of tier-2 (fewer or none where tier-2 ends)."""


class _Segment:
    """One segment's chunks, as parallel lists in offset order.

    No object per chunk: with many segments each append is a chunk of its
    own, and a budget of 256 MiB of 100 B appends would be millions of
    objects for the garbage collector to walk (a full collection of 150 ms
    with 1,000 segments and 60,000 chunks in the object-per-chunk design).
    Lists of ints, bytes and shared frame positions are a handful of
    tracked objects per segment whatever the chunk count."""

    __slots__ = ("addresses", "data", "evict_at", "flushed", "lengths", "offsets", "origins",
                 "stale", "tier2_origins", "waiters")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.data: list[bytes | list[bytes] | None] = []
        """The cached bytes (a list while a frame's appends are still being
        added, joined on first read), None once evicted."""
        self.addresses: list[Position] = []
        """The tier-1 frame holding each chunk."""
        self.origins: dict[int, tuple[int, int]] = {}
        """Chunk offset -> (segment id, offset) of its bytes in their frame,
        for the chunks that are not this segment's own (a merged source's)."""
        self.waiters: list[asyncio.Future[None]] = []
        self.tier2_origins: list[tuple[int, int, int]] = []
        """(offset, length, source segment id) of merged ranges: where tier-2
        may hold their bytes under the source (from its offset 0), or under a
        source it had merged in itself, until the target's own flush."""
        self.evict_at = 0
        """Every chunk below this index is evicted (the next eviction of this
        segment looks from here)."""
        self.stale = 0
        """How many of this segment's next entries in the eviction order are
        for chunks since taken out of the lists (skipped, evicting nothing)."""
        self.flushed = 0
        """How many of the segment's bytes tier-2 holds (its evicted chunks
        below this may be dropped)."""

    def clear(self) -> None:
        """Drop every chunk (the segment was deleted, or merged away): its
        entries left in the eviction order then find nothing to evict."""
        self.offsets.clear()
        self.lengths.clear()
        self.data.clear()
        self.addresses.clear()
        self.origins.clear()
        self.evict_at = self.stale = 0

    def cached(self, i: int) -> bytes | None:
        data = self.data[i]
        if type(data) is list:
            data = self.data[i] = b"".join(data)
        return data  # type: ignore[return-value]


class ReadIndex:
    """See the module docstring."""

    def __init__(self, fetch: Fetch, budget_bytes: int = 256 << 20,
                 fetch_tier2: FetchTier2 | None = None) -> None:
        self._fetch = fetch
        self.fetch_tier2 = fetch_tier2
        """Where bytes without a chunk here come from (None: nowhere, read as
        missing; set by the container when it has tier-2)."""
        self.budget_bytes = budget_bytes
        self.cached_bytes = 0
        self.drop_batch_chunks = DROP_BATCH_CHUNKS
        self._segments: dict[int, _Segment] = {}
        self._age: collections.deque[_Segment] = collections.deque()
        """The segment of each cached chunk, in commit order: the eviction
        order.  A segment's entries here are, in order, its ``stale`` ones,
        then one per cached chunk in its lists' order, so an entry evicts the
        segment's first cached chunk (from ``evict_at``): no offset to look
        up, and no object per chunk (a pair per chunk would be a
        garbage-collected object per append with many segments, and its
        collections the appends' p99).  A deleted or merged-away segment's
        entries find its lists empty."""

    def append(self, segment_id: int, offset: int, data: bytes, address: Position) -> None:
        """Committed data of one append (offsets increase per segment)."""
        segment = self._segments.get(segment_id)
        if segment is None:
            segment = self._segments[segment_id] = _Segment()
        size = len(data)
        if size:
            offsets = segment.offsets
            addresses = segment.addresses
            # one frame's appends share one address object (the log's answer,
            # or replay's record): identity says "the same frame" cheaply
            if addresses and addresses[-1] is address \
                    and offsets[-1] + segment.lengths[-1] == offset \
                    and segment.data[-1] is not None \
                    and (not segment.origins or offsets[-1] not in segment.origins):
                last = segment.data[-1]  # the same frame: one chunk
                if type(last) is list:
                    last.append(data)
                else:
                    segment.data[-1] = [last, data]  # type: ignore[list-item]
                segment.lengths[-1] += size
            else:
                offsets.append(offset)
                segment.lengths.append(size)
                segment.data.append(data)
                addresses.append(address)
                self._age.append(segment)
            self.cached_bytes += size
            if self.cached_bytes > self.budget_bytes:
                self._evict()
        if segment.waiters:
            self.notify(segment_id)

    def merge(self, target_id: int, source_id: int, target_offset: int, length: int) -> None:
        """Move the source's ``length`` bytes to the end of the target (at
        ``target_offset``): its chunks, and the range as a tier-2 origin (the
        bytes may be only in tier-2, under the source's name)."""
        source = self._segments.pop(source_id, None)
        target = self._segments.get(target_id)
        if target is None:
            target = self._segments[target_id] = _Segment()
        if length > 0:
            target.tier2_origins.append((target_offset, length, source_id))
        if source is not None:  # ranges the source had merged in itself
            target.tier2_origins += [(target_offset + start, size, origin_id)
                                     for start, size, origin_id in source.tier2_origins]
        if source is not None:
            for offset, length, data, address in zip(source.offsets, source.lengths,
                                                     source.data, source.addresses,
                                                     strict=True):
                moved = offset + target_offset
                target.origins[moved] = source.origins.get(offset, (source_id, offset))
                target.offsets.append(moved)
                target.lengths.append(length)
                target.data.append(data)
                target.addresses.append(address)
                if data is not None:
                    self._age.append(target)
            source.clear()  # its bytes are the target's now
            for waiter in source.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self.notify(target_id)

    def _evict(self) -> None:
        age = self._age
        while self.cached_bytes > self.budget_bytes and age:
            segment = age.popleft()
            if segment.stale:
                segment.stale -= 1
                continue
            data = segment.data
            i, end = segment.evict_at, len(data)
            while i < end and data[i] is None:
                i += 1  # (a merged-in chunk already evicted has no entry)
            if i == end:
                continue  # deleted or merged away
            data[i] = None
            self.cached_bytes -= segment.lengths[i]
            segment.evict_at = i + 1
            # every chunk up to this one is evicted now; if tier-2 holds this
            # one, it holds them all (what it holds above it waits for the
            # next flushed())
            flushed = segment.flushed
            if flushed and self._worth_dropping(i + 1, end) \
                    and segment.offsets[i] + segment.lengths[i] <= flushed:
                self._remove_prefix(segment, i + 1)

    def flushed(self, segment_id: int, length: int) -> None:
        """Tier-2 holds the segment's bytes below ``length``: its evicted
        chunks below that no longer need their place here."""
        segment = self._segments.get(segment_id)
        if segment is not None and length > segment.flushed:
            segment.flushed = length
            self._drop_flushed(segment)

    def _worth_dropping(self, count: int, chunks: int) -> bool:
        """Whether to drop ``count`` leading chunks of a segment's
        ``chunks``: at least ``drop_batch_chunks`` of them and a quarter of
        the segment's chunks (so the lists' shift costs a few moves a chunk)."""
        return count >= self.drop_batch_chunks and count * 4 >= chunks

    def _drop_flushed(self, segment: _Segment) -> None:
        """Drop the leading evicted chunks wholly in tier-2, when worth it."""
        offsets, lengths = segment.offsets, segment.lengths
        drop = bisect.bisect_right(offsets, segment.flushed) - 1
        if drop >= 0 and offsets[drop] + lengths[drop] <= segment.flushed:
            drop += 1
        drop = min(drop, segment.evict_at)
        if self._worth_dropping(drop, len(offsets)):
            self._remove_prefix(segment, drop)

    def _remove_prefix(self, segment: _Segment, count: int) -> None:
        """Take the first ``count`` chunks out of the segment's lists; each
        cached one among them leaves a stale entry in the eviction order."""
        data = segment.data
        for i in range(segment.evict_at, count):
            if data[i] is not None:
                data[i] = None
                self.cached_bytes -= segment.lengths[i]
                segment.stale += 1
        if segment.origins:
            for offset in segment.offsets[:count]:
                segment.origins.pop(offset, None)
        del segment.offsets[:count], segment.lengths[:count], data[:count], \
            segment.addresses[:count]
        segment.evict_at = max(0, segment.evict_at - count)

    def truncate(self, segment_id: int, start_offset: int) -> None:
        """Drop the chunks wholly below ``start_offset``."""
        segment = self._segments.get(segment_id)
        if segment is not None:
            keep = bisect.bisect_right(segment.offsets, start_offset) - 1
            if keep > 0:
                self._remove_prefix(segment, keep)
        self.notify(segment_id)

    def delete(self, segment_id: int) -> None:
        segment = self._segments.pop(segment_id, None)
        if segment is not None:
            self._remove_prefix(segment, len(segment.offsets))
            for waiter in segment.waiters:
                if not waiter.done():
                    waiter.set_result(None)

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

    def chunk_count(self, segment_id: int) -> int:
        """How many chunks the segment has (cached or evicted)."""
        segment = self._segments.get(segment_id)
        return 0 if segment is None else len(segment.offsets)

    def changed(self, segment_id: int) -> asyncio.Future[None]:
        """A future completed at the segment's next change."""
        segment = self._segments.get(segment_id)
        if segment is None:
            segment = self._segments[segment_id] = _Segment()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if segment.waiters:  # drop those whose readers gave up (a tail read's timeout)
            segment.waiters = [w for w in segment.waiters if not w.done()]
        segment.waiters.append(waiter)
        return waiter

    async def read(self, segment_id: int, offset: int, max_length: int) -> bytes:
        """Up to ``max_length`` committed bytes from ``offset`` (the caller
        checked that they exist and are not truncated), across runs of
        chunks here and ranges only in tier-2."""
        first = await self._read_run(segment_id, offset, max_length)
        if len(first) == max_length or not first:
            return first
        parts = [first]
        position, want = offset + len(first), max_length - len(first)
        while want > 0:
            piece = await self._read_run(segment_id, position, want)
            if not piece:
                break
            parts.append(piece)
            position += len(piece)
            want -= len(piece)
        return b"".join(parts)

    async def _read_run(self, segment_id: int, offset: int, max_length: int) -> bytes:
        """Bytes from ``offset``: from tier-2 up to the next chunk if no chunk
        holds ``offset``, else from the chunks up to a gap."""
        segment = self._segments.get(segment_id)
        if max_length <= 0:
            return b""
        if segment is None:
            return await self._below(segment_id, offset, max_length)
        offsets = segment.offsets
        i = bisect.bisect_right(offsets, offset) - 1
        if i < 0 or offsets[i] + segment.lengths[i] <= offset:
            # no chunk holds ``offset``: only tier-2 has it (up to the next chunk)
            following = offsets[i + 1] if i + 1 < len(offsets) else None
            return await self._below(segment_id, offset, max_length if following is None
                                     else min(max_length, following - offset))
        parts: list[bytes] = []
        want = max_length
        position = offset
        while want > 0 and i < len(offsets):
            chunk_offset = offsets[i]
            if chunk_offset > position:
                break  # a gap (bytes only in tier-2): the caller reads on from here
            data = segment.cached(i)
            base = chunk_offset
            if data is None:
                origin_id, origin_offset = segment.origins.get(chunk_offset,
                                                               (segment_id, chunk_offset))
                skip = position - chunk_offset
                need = segment.lengths[i] - skip
                # tier-2 first, from where the read starts (the chunk's head may
                # be truncated away there, and its frame gone from tier-1)
                data = b"" if self.fetch_tier2 is None else \
                    await self.fetch_tier2(segment_id, position, need)
                if len(data) != need and origin_id != segment_id and self.fetch_tier2:
                    data = await self._from_sources(segment, position, need)
                if len(data) == need:
                    base = position
                else:
                    data = await self._fetch(origin_id, origin_offset, segment.lengths[i],
                                             segment.addresses[i])
                if segment is not self._segments.get(segment_id) or i >= len(offsets) \
                        or offsets[i] != chunk_offset:
                    # truncated or deleted meanwhile: start again from the current index
                    return b"".join(parts) + await self._read_run(segment_id, position, want) \
                        if segment_id in self._segments else b"".join(parts)
            start = position - base
            piece = data[start:start + want]
            if not piece:
                break
            parts.append(piece)
            position += len(piece)
            want -= len(piece)
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _below(self, segment_id: int, offset: int, length: int) -> bytes:
        """Bytes without a chunk here: the segment's own in tier-2, or a merged
        source's there."""
        if self.fetch_tier2 is None or length <= 0:
            return b""
        found = await self.fetch_tier2(segment_id, offset, length)
        segment = self._segments.get(segment_id)
        if found or segment is None:
            return found
        return await self._from_sources(segment, offset, length)

    async def _from_sources(self, segment: _Segment, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` of a range merged into
        ``segment``, from tier-2 under one of the segments they came from."""
        assert self.fetch_tier2 is not None
        for start, size, source_id in reversed(segment.tier2_origins):
            if start <= offset < start + size:
                found = await self.fetch_tier2(source_id, offset - start,
                                               min(length, start + size - offset))
                if found:
                    return found
        return b""
