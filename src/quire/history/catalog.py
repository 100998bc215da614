"""What tier-2 alone says about a cluster's streams.

The segment store flushes every segment to tier-2, the controller's own
tables among them: ``_system/_tables/<scope>/streams`` holds each stream's
record (configuration, epochs with their segments and key ranges, the head
after truncation: :mod:`quire.controller.state`).  Every container's
storage metadata (its system journal, then its storage-metadata table:
:mod:`quire.segmentstore.tier2_reader`) leads to every segment's layout.
So :class:`Tier2Catalog` finds a stream's segments, epochs and successors,
and each segment's chunks, from tier-2 alone: no segment store, controller,
bookie or metadata store runs.

What it sees lags the cluster by one flush: a table flushes in every
storage-writer iteration (``iteration_interval_ms``, a second by default),
a stream segment once ``flush_threshold_bytes`` or ``flush_threshold_ms``
is reached, or when sealed.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.controller.model import StreamRecord, StreamState
from quire.controller.records import stream_from_json
from quire.controller.state import streams_table
from quire.errors import ScopeNotFoundError, StreamNotFoundError
from quire.segmentstore.chunk_sidecars import SidecarCache
from quire.segmentstore.tables import decode_entries
from quire.segmentstore.tier2_reader import journal_containers, read_records
from quire.streams.model import segment_name
from quire.tier2 import ChunkStorage, SegmentLayout, read_segment


@dataclass
class Tier2Catalog:
    """Every layout tier-2 records (all containers), with the chunks'
    sidecars as they are read (load one with :meth:`load`)."""

    storage: ChunkStorage
    layouts: dict[str, SegmentLayout]
    sidecars: SidecarCache

    @classmethod
    async def load(cls, storage: ChunkStorage) -> Tier2Catalog:
        layouts: dict[str, SegmentLayout] = {}
        for container_id in await journal_containers(storage):
            layouts.update((await read_records(storage, container_id)).layouts)
        return cls(storage, layouts, SidecarCache(storage))

    def layout(self, name: str) -> SegmentLayout | None:
        """Segment ``name``'s layout, None if tier-2 records none (never
        flushed) or records it deleted."""
        layout = self.layouts.get(name)
        return None if layout is None or layout.deleted else layout

    def deleted(self, name: str) -> bool:
        layout = self.layouts.get(name)
        return layout is not None and layout.deleted

    def segment_layout(self, scope: str, stream: str, segment_id: int) -> SegmentLayout | None:
        return self.layout(segment_name(scope, stream, segment_id))

    async def table(self, name: str) -> dict[bytes, bytes]:
        """Table segment ``name``'s live entries as flushed (empty if none)."""
        layout = self.layout(name)
        entries: dict[bytes, bytes] = {}
        if layout is None or layout.length <= layout.start_offset:
            return entries
        data = await read_segment(self.storage, layout, layout.start_offset,
                                  layout.length - layout.start_offset)
        for _version, key, value, _end in decode_entries(data, layout.start_offset):
            if value is None:
                entries.pop(key, None)
            else:
                entries[key] = value
        return entries

    async def streams(self, scope: str) -> dict[str, StreamRecord]:
        """Scope ``scope``'s streams (being created ones left out) by name."""
        table = streams_table(scope)
        if self.layout(table) is None:
            raise ScopeNotFoundError(f"tier-2 holds no scope {scope!r} (or none flushed yet)")
        records = {key.decode(): stream_from_json(value)
                   for key, value in (await self.table(table)).items()}
        return {name: r for name, r in sorted(records.items())
                if r.state is not StreamState.CREATING}

    async def stream(self, scope: str, stream: str) -> StreamRecord:
        """Stream ``scope/stream``'s record as last flushed."""
        record = (await self.streams(scope)).get(stream)
        if record is None:
            raise StreamNotFoundError(f"tier-2 holds no stream {scope}/{stream} (or its "
                                      "record is not flushed yet)")
        return record
