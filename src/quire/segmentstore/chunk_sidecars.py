"""Chunk sidecars: where events start in a tier-2 chunk, and when its bytes were appended.

Beside every chunk of a stream segment (a segment of type STREAM named
``scope/stream/<n>.#epoch.<e>``) the storage writer writes one small
object, the chunk's *sidecar* ``<chunk name>$sidecar``, so tier-2 alone can
be read as events with their times, and split between readers at event
boundaries, with no segment store running
(:mod:`quire.history`).  Written under PDP-40's order rules like the chunk:
after the chunk and before any layout naming the chunk is recorded, deleted
with the chunk once no recorded layout names it; ``quire tier2 check``
checks that every chunk of a stream segment's recorded layout has a sidecar
that fits it (:func:`sidecar_problem`).

Byte layout (big-endian; offsets relative to the chunk's first byte)::

    sidecar := magic "QSC1" | chunk_length u64 | first_event i64 | next_event i64
               | min_time i64 | max_time i64 | count u32 | zlib(deltas)
    deltas  := count x i64 (offset deltas) | count x i64 (time deltas)

* ``first_event``: where the first event header at or after the chunk's
  first byte starts (``>= chunk_length``: no event starts in the chunk);
  ``-1``: not known (the bytes are not events, or were not walked);
* ``next_event``: where the first event header at or after the chunk's end
  starts, as the writer knew it after the chunk (below ``chunk_length``: a
  header the chunk's end cuts starts there); ``-1``: not known;
* the entries ``(offset, time_ms)``: bytes from ``offset`` up to the next
  entry were appended at ``time_ms`` (the container's clock; ``-1``: not
  known).  The first entry is at offset 0 (the time in effect at the chunk's
  start); offsets increase, times do not decrease.  Every other entry's
  offset is the start of an append, so an event boundary;
* ``min_time``, ``max_time``: the least and greatest known time (``-1``
  when none is known).  A chunk whose bytes came into its segment by a
  merge (a committed transaction's) carries the merge's time.
"""

from __future__ import annotations

import bisect
import itertools
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from quire.errors import ChunkNotFoundError, CorruptRecordError, InvalidChunkNameError
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX, base_segment_name
from quire.segmentstore.types import SegmentType
from quire.tier2 import ChunkStorage, SegmentLayout, parse_chunk_name

SIDECAR_SUFFIX = "$sidecar"
_MAGIC = b"QSC1"
_HEAD = struct.Struct(">4sQqqqqI")
UNKNOWN = -1
_STREAM_SEGMENT = re.compile(r"[^/]+/[^/]+/[0-9]+\.#epoch\.[0-9]+")


def sidecar_name(chunk: str) -> str:
    """The name of chunk ``chunk``'s sidecar."""
    return chunk + SIDECAR_SUFFIX


def may_have_sidecar(chunk: str) -> bool:
    """Whether chunk ``chunk`` (by its name alone) may have a sidecar: one
    written for a stream segment, or a transaction's joined into one."""
    try:
        segment = parse_chunk_name(chunk)[0]
    except InvalidChunkNameError:
        return False
    return not segment.endswith((ATTRIBUTES_SUFFIX, INDEX_SUFFIX)) \
        and _STREAM_SEGMENT.fullmatch(base_segment_name(segment)) is not None


def has_sidecars(name: str, segment_type: SegmentType | int) -> bool:
    """Whether the chunks of segment ``name`` (of ``segment_type``) get
    sidecars: a stream's segments (not transactions, tables, system ones)."""
    return int(segment_type) == SegmentType.STREAM and not name.startswith("_system/") \
        and _STREAM_SEGMENT.fullmatch(name) is not None


@dataclass(frozen=True)
class Sidecar:
    """One chunk's sidecar (see the module docstring)."""

    chunk_length: int
    first_event: int = UNKNOWN
    next_event: int = UNKNOWN
    offsets: tuple[int, ...] = (0,)
    times: tuple[int, ...] = (UNKNOWN,)

    @property
    def known_times(self) -> list[int]:
        return [t for t in self.times if t != UNKNOWN]

    @property
    def min_time(self) -> int:
        known = self.known_times
        return min(known) if known else UNKNOWN

    @property
    def max_time(self) -> int:
        known = self.known_times
        return max(known) if known else UNKNOWN

    def time_at(self, offset: int) -> int:
        """The append time of the chunk's byte at ``offset``."""
        return self.times[bisect.bisect_right(self.offsets, offset) - 1]

    def encode(self) -> bytes:
        count = len(self.offsets)
        deltas = array("q", [0]) * (2 * count)
        previous = 0
        for i, offset in enumerate(self.offsets):
            deltas[i], previous = offset - previous, offset
        previous = 0
        for i, time_ms in enumerate(self.times):
            deltas[count + i], previous = time_ms - previous, time_ms
        if sys.byteorder == "little":
            deltas.byteswap()
        return _HEAD.pack(_MAGIC, self.chunk_length, self.first_event, self.next_event,
                          self.min_time, self.max_time, count) + zlib.compress(deltas.tobytes())

    @classmethod
    def decode(cls, data: bytes) -> Sidecar:
        """The sidecar :meth:`encode` made (CorruptRecordError otherwise)."""
        try:
            magic, length, first, following, _low, _high, count = _HEAD.unpack_from(data)
            raw = array("q")
            raw.frombytes(zlib.decompress(data[_HEAD.size:]))
        except (struct.error, zlib.error, ValueError) as e:
            raise CorruptRecordError(f"not a chunk sidecar: {e}") from None
        if magic != _MAGIC or len(raw) != 2 * count or count == 0:
            raise CorruptRecordError("not a chunk sidecar (magic or entry count)")
        if sys.byteorder == "little":
            raw.byteswap()
        offsets, times = [], []
        offset = time_ms = 0
        for i in range(count):
            offset += raw[i]
            time_ms += raw[count + i]
            offsets.append(offset)
            times.append(time_ms)
        return cls(length, first, following, tuple(offsets), tuple(times))

    def problem(self) -> str:
        """What is wrong with it on its own ("" if nothing)."""
        if self.offsets[0] != 0:
            return "its first entry is not at offset 0"
        if any(b <= a for a, b in itertools.pairwise(self.offsets)):
            return "entry offsets do not increase"
        if self.offsets[-1] >= max(self.chunk_length, 1):
            return "an entry past the chunk's end"
        known = self.known_times
        if any(b < a for a, b in itertools.pairwise(known)):
            return "append times go back"
        return ""


def entries_for(chunk_length: int, entries: Sequence[tuple[int, int]], start: int,
                first_event: int, next_event: int) -> Sidecar:
    """The sidecar of a chunk of ``chunk_length`` bytes at segment offset
    ``start``, from the segment's time entries for its bytes (absolute
    offsets; the first in effect at ``start``, or none: not known)."""
    offsets: list[int] = [0]
    times: list[int] = [UNKNOWN]
    for offset, time_ms in entries:
        rel = max(0, offset - start)
        if rel >= chunk_length:
            break
        if rel == offsets[-1]:
            times[-1] = time_ms
        elif time_ms != times[-1]:
            offsets.append(rel)
            times.append(time_ms)
    return Sidecar(chunk_length, first_event, next_event, tuple(offsets), tuple(times))


async def read_sidecar(storage: ChunkStorage, chunk: str) -> Sidecar | None:
    """Chunk ``chunk``'s sidecar, None if it has none (or it vanished)."""
    name = sidecar_name(chunk)
    try:
        return Sidecar.decode(await storage.read(name, 0, await storage.length(name)))
    except ChunkNotFoundError:
        return None


def sidecar_problem(layout: SegmentLayout, sidecars: Sequence[Sidecar | None]) -> str:
    """What is wrong with a layout's sidecars (one per chunk, None: missing),
    "" if they fit it: each one's length, its own rules, and the event
    boundaries of neighbours agreeing."""
    previous: tuple[int, Sidecar] | None = None
    for chunk, sidecar in zip(layout.chunks, sidecars, strict=True):
        if sidecar is None:
            return f"chunk {chunk.name} has no sidecar"
        if sidecar.chunk_length != chunk.length:
            return (f"chunk {chunk.name}: its sidecar is of {sidecar.chunk_length} bytes, the "
                    f"chunk of {chunk.length}")
        own = sidecar.problem()
        if own:
            return f"chunk {chunk.name}: sidecar: {own}"
        if previous is not None:
            at, before = previous
            if before.next_event != UNKNOWN and sidecar.first_event != UNKNOWN \
                    and before.next_event >= before.chunk_length \
                    and at + before.next_event != chunk.offset + sidecar.first_event:
                return (f"chunk {chunk.name}: its first event at {chunk.offset} + "
                        f"{sidecar.first_event}, the chunk before says {at} + "
                        f"{before.next_event}")
            if before.max_time != UNKNOWN and sidecar.min_time != UNKNOWN \
                    and sidecar.min_time < before.max_time:
                return f"chunk {chunk.name}: append times go back from the chunk before"
        previous = (chunk.offset, sidecar)
    return ""


class SidecarCache:
    """Decoded sidecars by chunk name (chunks never change, so neither do
    their sidecars), at most ``capacity`` of them."""

    def __init__(self, storage: ChunkStorage, capacity: int = 4096) -> None:
        self.storage = storage
        self.capacity = capacity
        self._found: dict[str, Sidecar | None] = {}

    async def get(self, chunk: str) -> Sidecar | None:
        if chunk in self._found:
            return self._found[chunk]
        found = await read_sidecar(self.storage, chunk)
        if len(self._found) >= self.capacity:
            self._found.clear()
        self._found[chunk] = found
        return found

    async def times(self, layout: SegmentLayout, start: int, end: int
                    ) -> list[tuple[int, int]]:
        """The time entries of the layout's bytes ``start .. end`` (absolute;
        the first at ``start``); a chunk without a sidecar reads as not known."""
        found: list[tuple[int, int]] = []
        for chunk, _at, _count in layout.pieces(start, end - start):
            sidecar = await self.get(chunk.name)
            if sidecar is None:
                pieces = [(chunk.offset, UNKNOWN)]
            else:
                pieces = [(chunk.offset + o, t)
                          for o, t in zip(sidecar.offsets, sidecar.times, strict=True)]
            for offset, time_ms in pieces:
                offset = max(offset, start)
                if offset >= end:
                    break
                if found and found[-1][0] == offset:
                    found[-1] = (offset, time_ms)
                elif not found or found[-1][1] != time_ms:
                    found.append((offset, time_ms))
        return found

    async def locate(self, layout: SegmentLayout, time_ms: int) -> int | None:
        """The offset of the first append at or after ``time_ms`` among the
        layout's bytes (a binary search over its chunks' sidecars), None if
        all are older (or not known)."""
        chunks = layout.chunks
        low, high = 0, len(chunks)
        while low < high:  # the first chunk whose newest time is at or after time_ms
            middle = (low + high) // 2
            sidecar = await self.get(chunks[middle].name)
            if sidecar is not None and sidecar.max_time >= time_ms:
                high = middle
            else:
                low = middle + 1
        if low == len(chunks):
            return None
        chunk = chunks[low]
        sidecar = await self.get(chunk.name)
        assert sidecar is not None
        for offset, entry_time in zip(sidecar.offsets, sidecar.times, strict=True):
            if entry_time >= time_ms:
                return max(layout.start_offset, chunk.offset + offset)
        return None
