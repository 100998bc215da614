"""How a storage writer flushes one segment: its data, then ``$index``, then ``$attributes``.

:class:`SegmentFlushing` is the part of
:class:`~quire.segmentstore.storage_writer.StorageWriter` that flushes one
segment (PDP-40 requirement 9: the data first, so every offset the index
or an attribute batch records is in tier-2 already): its new bytes as new
chunks (a truncate drops chunks below the start, a merge's source chunks
join the target's layout, small trailing chunks are merged:
:func:`~quire.segmentstore.flush_plan.merge_start`; a stream segment's
chunks each get a sidecar: :mod:`~quire.segmentstore.sidecar_writer`), then its changed
index entries and attributes as batches (rewritten whole, and the segment
truncated before them, once it holds twice their whole batch).  What a
failed attempt wrote and no layout names is handed over as orphans; what
it meant to drop stays (:class:`~quire.segmentstore.recorded_layouts.RecordedLayouts`).
The flush steps name themselves in a failure (``data``, ``index``,
``attributes``: :func:`~quire.segmentstore.flush_health.mark_step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from quire.segmentstore.flush_health import mark_step
from quire.segmentstore.flush_plan import FlushPlanner, Tracked, merge_start
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX
from quire.segmentstore.quarantine import QuarantineWatch, quarantine_path
from quire.segmentstore.recorded_layouts import RecordedLayouts
from quire.segmentstore.sidecar_writer import SidecarWriter
from quire.segmentstore.storage_records import (
    REMOVED_VERSION,
    encode_attribute_batch,
    encode_index_batch,
)
from quire.segmentstore.types import SegmentType
from quire.segmentstore.writer_source import WriterSource
from quire.tier2 import ChunkNamer, ChunkStorage, SegmentLayout, concat_chunks

SNAPSHOT_MIN_BYTES = 64 << 10
"""An ``$index``/``$attributes`` segment is rewritten whole only past this."""


@contextlib.contextmanager
def step(step: str, segment: str) -> Iterator[None]:
    """Name the flush step a failure inside happens at."""
    try:
        yield
    except BaseException as e:
        mark_step(e, step, segment)
        raise


@dataclass(frozen=True)
class SegmentSnapshot:
    """One segment's committed state, taken at once (no await between)."""

    segment_id: int
    name: str
    length: int
    start_offset: int
    sealed: bool
    deleted: bool
    attributes: dict[int, int]
    index: dict[bytes, int] | None


@dataclass
class IterationReport:
    """What one iteration did (for tests and the background loop's log)."""

    buckets: list[list[str]] = field(default_factory=list)
    """The eligible segments' names per bucket, in flush order."""
    chunks_written: int = 0
    bytes_written: int = 0
    chunks_deleted: int = 0


class SegmentFlushing:
    """The per-segment steps of a storage writer (see the module docstring);
    the writer holds the state they use."""

    source: WriterSource
    storage: ChunkStorage
    max_chunk_bytes: int
    recorded: RecordedLayouts
    quarantine: QuarantineWatch
    sidecars: SidecarWriter
    _planner: FlushPlanner
    _namer: ChunkNamer
    _written: dict[str, list[str]]

    def _take_merges(self) -> None:
        self._planner.take_merges(self.source.take_merges())

    def _snapshot(self, segment_id: int) -> SegmentSnapshot:
        self._take_merges()  # every merge the snapshot's length counts
        s = self.source.segments[segment_id]
        index = None
        if s.type is SegmentType.TABLE:
            index = {k: v[0] for k, v in self.source.table_entries(segment_id).items()}
        return SegmentSnapshot(segment_id, s.name, s.length, s.start_offset, s.sealed, s.deleted,
                         dict(s.attributes), index)

    async def _flush_segment(self, segment_id: int, report: IterationReport) -> None:
        snapshot = self._snapshot(segment_id)
        try:
            with step("data", snapshot.name):
                await self._flush_data(snapshot, report)
            with step("index", snapshot.name):
                await self._flush_index(snapshot, report)
            with step("attributes", snapshot.name):
                await self._flush_attributes(snapshot, report)
        except BaseException:
            for name in (snapshot.name, snapshot.name + INDEX_SUFFIX,
                         snapshot.name + ATTRIBUTES_SUFFIX):
                self.recorded.abandon(name)  # what it meant to drop stays
                self.recorded.orphan(self._written.pop(name, []))
            raise
        self.quarantine.flushed(snapshot.name)

    def _set(self, layout: SegmentLayout, segment_id: int) -> None:
        """Record ``layout`` (its chunks written are named by it now)."""
        self.recorded.set(layout, segment_id)
        self._written.pop(layout.segment, None)

    def _chunk_segment(self, name: str) -> str:
        """What the chunks of segment ``name`` are named after: its name, or
        for a quarantined segment (and its ``$index``/``$attributes``) its
        quarantine path."""
        base = name.removesuffix(ATTRIBUTES_SUFFIX).removesuffix(INDEX_SUFFIX)
        found = self.quarantine.quarantined.get(base)
        if found is None:
            return name
        return quarantine_path(self.source.container_id, found.segment_id) + name[len(base):]

    async def _write(self, layout: SegmentLayout, data: bytes, report: IterationReport,
                     merge: bool = True, segment_id: int | None = None) -> SegmentLayout:
        """``layout`` (of data segment ``segment_id``; None: an ``$index`` or
        ``$attributes`` one) grown by ``data``, written as new chunks of at
        most ``max_chunk_bytes`` (its small trailing chunks merged if ``merge``)."""
        written = self._written.setdefault(layout.segment, [])
        for at in range(0, len(data), self.max_chunk_bytes):
            piece = data[at:at + self.max_chunk_bytes]
            name = self._namer.next_name(self._chunk_segment(layout.segment))
            written.append(name)  # an orphan if no layout is set with it
            await self.storage.write_chunk(name, piece)
            await self.sidecars.chunk_written(layout, name, piece, segment_id)
            layout = layout.with_chunk(name, len(piece))
            report.chunks_written += 1
            report.bytes_written += len(piece)
        return await self._merge_small(layout, report, segment_id) if merge else layout

    async def _merge_small(self, layout: SegmentLayout, report: IterationReport,
                           segment_id: int | None = None) -> SegmentLayout:
        """``layout`` with its trailing small chunks merged into one new chunk
        when :func:`~quire.segmentstore.flush_plan.merge_start` says so; the
        merged ones are dropped once the new layout is set."""
        first = merge_start(layout.chunks, self.max_chunk_bytes)
        if first is None:
            return layout
        chunks = layout.chunks
        name = self._namer.next_name(self._chunk_segment(layout.segment))
        self._written.setdefault(layout.segment, []).append(name)
        written = await concat_chunks(self.storage, name, [c.name for c in chunks[first:]])
        await self.sidecars.concatenated(layout, first, len(chunks) - first, name, segment_id)
        report.chunks_written += 1
        report.bytes_written += written
        layout, replaced = layout.concatenated(first, len(chunks) - first, name)
        self.recorded.drop_later(layout.segment, replaced)
        return layout

    async def _flush_data(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        name = snapshot.name
        recorded, planner = self.recorded, self._planner
        segments = self.source.segments
        if snapshot.deleted:
            if snapshot.segment_id in planner.merge_sources:
                return  # its target's flush takes its bytes over
            recorded.delete(name, snapshot.segment_id)
            self.quarantine.forget(name)
            for source_id, _offset, _length in planner.merges.pop(snapshot.segment_id, []):
                recorded.delete(segments[source_id].name, source_id)
                planner.merge_sources.discard(source_id)
            planner.tracked.pop(snapshot.segment_id, None)
            return
        layout = recorded.layout_for(name, snapshot.segment_id)
        if snapshot.start_offset > layout.start_offset:
            if snapshot.start_offset <= layout.length:
                layout, dropped = layout.truncated(snapshot.start_offset)
            else:  # truncated above what tier-2 holds: those bytes are never written
                dropped = [c.name for c in layout.chunks]
                layout = SegmentLayout(name, (), snapshot.start_offset, snapshot.start_offset)
            recorded.drop_later(name, dropped)
        merges = planner.merges.get(snapshot.segment_id, [])
        for merge in sorted(merges, key=lambda m: m[1]):
            source_id, offset, length = merge
            layout = await self._copy(snapshot.segment_id, layout, offset, report)
            source_name = segments[source_id].name
            source = recorded.current(source_name, source_id)
            if layout.length == offset and source is not None and not source.deleted \
                    and source.start_offset == 0 and source.length == length:
                # the source's chunks join the target's layout: nothing copied
                layout, gone = layout.merged(source if source.sealed else source.with_sealed())
                await self.sidecars.joined(layout, offset, length, snapshot.segment_id)
                self._set(layout, snapshot.segment_id)  # before the source's record goes
                recorded.set(gone, source_id)
            else:  # copied (through the read index, the source's layout still readable)
                layout = await self._copy(snapshot.segment_id, layout, offset + length, report)
                self._set(layout, snapshot.segment_id)
                recorded.delete(source_name, source_id)
            merges.remove(merge)  # done: a failure after this does not do it again
            planner.merge_sources.discard(source_id)
        if not merges:
            planner.merges.pop(snapshot.segment_id, None)
        layout = await self._copy(snapshot.segment_id, layout, snapshot.length, report)
        if snapshot.sealed and layout.length == snapshot.length and not layout.sealed:
            layout = layout.with_sealed()
        self._set(layout, snapshot.segment_id)
        self.source.flushed(snapshot.segment_id, layout.length)
        tracked = planner.tracked.get(snapshot.segment_id)
        if tracked is not None:
            tracked.dirty_since_ms = None

    def _data_flushed(self, snapshot: SegmentSnapshot) -> bool:
        """Whether the data segment is in tier-2 up to the snapshot's length,
        so a batch recording that length may follow (PDP-40 rule 9); when a
        truncate or delete cut the data flush short, the batch waits for the
        next iteration."""
        layout = self.recorded.current(snapshot.name, snapshot.segment_id)
        return layout is not None and layout.length >= snapshot.length

    async def _copy(self, segment_id: int, layout: SegmentLayout, up_to: int,
                    report: IterationReport) -> SegmentLayout:
        """``layout`` grown with the segment's committed bytes up to ``up_to``
        (less if it was truncated or deleted meanwhile: the next iteration
        sees that)."""
        while layout.length < up_to:
            want = min(self.max_chunk_bytes, up_to - layout.length)
            data = await self.source.read(segment_id, layout.length, want)
            if not data:
                break
            layout = await self._write(layout, data, report, segment_id=segment_id)
        return layout

    async def _append_batch(self, layout: SegmentLayout, delta: bytes,
                            whole: Callable[[], bytes], report: IterationReport
                            ) -> SegmentLayout:
        """``layout`` (an ``$index`` or ``$attributes`` segment) grown by the
        batch ``delta``; or, once it holds more than twice the batch of all
        its values (``whole()``) and :data:`SNAPSHOT_MIN_BYTES`, by that batch,
        truncated before it (readers fold batches from the start offset)."""
        if layout.length - layout.start_offset + len(delta) > SNAPSHOT_MIN_BYTES:
            full = whole()
            if layout.length - layout.start_offset > 2 * len(full):
                at = layout.length
                layout = await self._write(layout, full, report, merge=False)
                layout, dropped = layout.truncated(at)
                self.recorded.drop_later(layout.segment, dropped)
                return await self._merge_small(layout, report)
        return await self._write(layout, delta, report)

    async def _flush_index(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        if snapshot.index is None:
            return
        name = snapshot.name + INDEX_SUFFIX
        recorded = self.recorded
        if snapshot.deleted:
            recorded.delete(name, snapshot.segment_id)
            return
        tracked = self._planner.tracked.setdefault(snapshot.segment_id, Tracked())
        index = snapshot.index
        changed = {k: v for k, v in index.items() if tracked.flushed_index.get(k) != v}
        changed.update((k, REMOVED_VERSION) for k in tracked.flushed_index if k not in index)
        if not changed and recorded.current(name, snapshot.segment_id) is not None:
            return
        if not self._data_flushed(snapshot):
            return
        layout = recorded.layout_for(name, snapshot.segment_id)
        layout = await self._append_batch(
            layout, encode_index_batch(changed, snapshot.length),
            lambda: encode_index_batch(index, snapshot.length), report)
        self._set(layout, snapshot.segment_id)
        tracked.flushed_index = dict(index)

    async def _flush_attributes(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        if snapshot.deleted:
            self.recorded.delete(snapshot.name + ATTRIBUTES_SUFFIX, snapshot.segment_id)
            return
        tracked = self._planner.tracked.setdefault(snapshot.segment_id, Tracked())
        changed = {k: v for k, v in snapshot.attributes.items()
                   if tracked.flushed_attributes.get(k) != v}
        if changed:
            await self._write_attributes(snapshot, tracked, changed, report)

    async def _write_attributes(self, snapshot: SegmentSnapshot, tracked: Tracked,
                                changed: dict[int, int], report: IterationReport) -> None:
        """Append the ``changed`` attributes to the ``$attributes`` segment
        (once the data is in tier-2 up to the snapshot's length)."""
        if not self._data_flushed(snapshot):
            return
        name = snapshot.name + ATTRIBUTES_SUFFIX
        layout = self.recorded.layout_for(name, snapshot.segment_id)
        layout = await self._append_batch(
            layout, encode_attribute_batch(changed, snapshot.length),
            lambda: encode_attribute_batch(snapshot.attributes, snapshot.length), report)
        self._set(layout, snapshot.segment_id)
        tracked.flushed_attributes.update(changed)
        tracked.attributes_dirty_since_ms = None
