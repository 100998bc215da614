"""Reading a stream segment's flushed history straight from tier-2.

The segment store's storage writer flushes each segment's bytes into
tier-2 chunks and records the segment's :class:`~quire.tier2.SegmentLayout`
(which chunks hold which bytes) in tier-2 itself, so tier-2 alone can be
read back (:func:`quire.segmentstore.tier2_reader.read_layout`).  The
planner (on the driver) reads each planned segment's layout once and ships
it inside the input partition (:class:`Tier2Layout`, plain data); the
executor reads the chunks it names directly (``file://`` on a path every
executor mounts, or ``s3://``), never asking the segment store.  The
layout's ``length`` is the flushed length: bytes below it come from tier-2,
bytes above it (the unflushed tail) from the segment store, in the same task
(the flushed length is not an event boundary, so one parser sees both).

A chunk that vanished since planning (a later truncate, delete or
concatenation) reads as :class:`~quire.errors.SegmentTruncatedError`
(:func:`quire.tier2.read_segment` never returns wrong bytes); the reader
then reads the layout again to learn where the segment starts now.

One :class:`~quire.tier2.ChunkStorage` per URI per process, opened on the
process's Spark runtime loop and kept (Python workers are reused).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass

from quire.segmentstore.chunk_sidecars import SidecarCache
from quire.segmentstore.tier2_reader import read_layout
from quire.tier2 import ChunkRef, ChunkStorage, SegmentLayout, open_chunk_storage

_storages: dict[tuple[int, str], ChunkStorage] = {}
"""(process id, tier-2 URI) -> the open storage (touched on the runtime loop only)."""
_sidecars: dict[tuple[int, str], SidecarCache] = {}


async def tier2_storage(uri: str) -> ChunkStorage:
    """This process's open storage for ``uri`` (call on the runtime loop)."""
    key = (os.getpid(), uri)
    storage = _storages.get(key)
    if storage is None:
        storage = _storages[key] = await open_chunk_storage(uri)
    return storage


async def tier2_sidecars(uri: str) -> SidecarCache:
    """This process's cache of the chunk sidecars in ``uri`` (call on the
    runtime loop)."""
    key = (os.getpid(), uri)
    cache = _sidecars.get(key)
    if cache is None:
        cache = _sidecars[key] = SidecarCache(await tier2_storage(uri))
    return cache


@dataclass(frozen=True)
class Tier2Layout:
    """A segment's layout as planned, in plain data (picklable)."""

    uri: str
    segment: str
    chunks: tuple[tuple[str, int, int], ...]
    """(chunk name, segment offset of its first byte, bytes)."""
    start_offset: int
    length: int
    """The flushed length: bytes ``start_offset .. length`` are in tier-2."""

    @classmethod
    def of(cls, uri: str, layout: SegmentLayout) -> Tier2Layout:
        return cls(uri, layout.segment, tuple((c.name, c.offset, c.length)
                                              for c in layout.chunks),
                   layout.start_offset, layout.length)

    def layout(self) -> SegmentLayout:
        return SegmentLayout(self.segment, tuple(ChunkRef(*c) for c in self.chunks),
                             self.start_offset, self.length)


async def plan_layouts(uri: str, segments: Sequence[str]) -> dict[str, Tier2Layout]:
    """The tier-2 layouts of ``segments`` that hold any bytes (planning,
    on the driver): segments tier-2 does not know, or knows as deleted, are
    left out (read wholly through the segment store)."""
    storage = await tier2_storage(uri)
    layouts = await asyncio.gather(*(read_layout(storage, name) for name in segments))
    return {name: Tier2Layout.of(uri, layout) for name, layout in zip(segments, layouts,
                                                                        strict=True)
            if layout is not None and not layout.deleted and layout.length > layout.start_offset}


async def reread_layout(uri: str, segment: str) -> Tier2Layout | None:
    """The segment's layout now (after a chunk vanished), None if tier-2 no
    longer holds the segment."""
    layout = await read_layout(await tier2_storage(uri), segment)
    if layout is None or layout.deleted:
        return None
    return Tier2Layout.of(uri, layout)
