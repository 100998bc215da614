"""The storage writer: one container's committed segments flushed to tier-2 (PDP-40).

One :class:`StorageWriter` per open container; all it sees of the container
is a :class:`~quire.segmentstore.writer_source.WriterSource`.  It runs
*flush iterations* (:meth:`StorageWriter.flush_once`); each one:

1. deletes the chunks that the previous iteration dropped from layouts
   (a delete, a truncate, a concatenation): their new layouts are recorded and were flushed
   last in that iteration, so tier-2's metadata never names a chunk that is
   gone (PDP-40 rule 5, delete and truncate in two iterations);
2. picks the *eligible* segments (:meth:`StorageWriter.plan`,
   :mod:`~quire.segmentstore.flush_plan`): a user segment past a size or
   age threshold, every modified system and container-metadata segment;
3. flushes them bucket by bucket: user, then system (requirements 4-7;
   up to ``flush_concurrency`` segments of a bucket at once), each
   segment's data first (new chunks; a flushed merge source's chunks join
   its target's layout; a trailing run of small chunks is concatenated),
   then its ``$index`` (tables), then its ``$attributes`` (requirement 9),
   so each recorded offset that the index or attribute segment holds
   points into bytes already in tier-2;
4. records the new layouts of the user and system segments (and their
   ``$attributes``/``$index``) in the container's storage-metadata table
   segment ``_system/containers/storage_metadata_<id>`` (key: segment name,
   value: the segment's id and :func:`~quire.tier2.encode_layout`) through
   the container's own ``table_put``, so they are in tier-1 too;
5. flushes the container-metadata bucket last (requirement 8): the
   storage-metadata segment's new bytes and its ``$index``, and then one
   snapshot chunk of the container's *system journal* holding their layouts
   (``_system/containers/journal_<id>.E<epoch>.<n>``, the latest snapshot
   of the highest epoch wins), so tier-2 alone can be read back
   (:mod:`~quire.segmentstore.tier2_reader`);
6. writes a checkpoint to the container's tier-1 log and truncates the log
   below the newest checkpoint all of whose segment lengths are in tier-2
   (:meth:`~quire.segmentstore.writer_source.WriterSource.truncate_log`):
   a reopen replays from there and reads older bytes from tier-2.

A layout is recorded only after the chunks it names are durable, and a
chunk is deleted only once the layout without it is flushed, so whatever
instant tier-2 is read at, every recorded offset is a guaranteed offset.

Chunk names come from a :class:`~quire.tier2.ChunkNamer` with the epoch the
container took on its tier-1 log: never reused, so a fenced old owner still
running can never overwrite a chunk the new owner wrote.

A writer that breaks PDP-40's order on purpose, to show that ``quire tier2
check`` catches it, is a test's:
:class:`quire.testing.chaos_writer.ChaosStorageWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Self, TypeVar

from quire.errors import ConfigError, SegmentStoreError
from quire.segmentstore.flush_plan import FlushPlanner, Tracked
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX
from quire.segmentstore.recorded_layouts import (
    METADATA,
    SYSTEM,
    USER,
    RecordedLayouts,
    SystemJournal,
    bucket_of,
)
from quire.segmentstore.sidecar_writer import SidecarWriter
from quire.segmentstore.storage_records import (
    REMOVED_VERSION,
    encode_attribute_batch,
    encode_index_batch,
)
from quire.segmentstore.tier2_reader import Tier2Reader, read_journal, storage_metadata_name
from quire.segmentstore.types import SegmentType
from quire.segmentstore.writer_source import WriterSource
from quire.tier2 import ChunkNamer, ChunkStorage, SegmentLayout, concat_chunks
from quire.tier2.config import DEFAULT_MAX_CHUNK_BYTES

T = TypeVar("T")
CONCAT_RUN_CHUNKS = 8
"""A segment's trailing small chunks are joined once there are this many."""
_RECORDS_PER_PUT = 1000
"""Layouts per table_put (a put is one append: at most 16 MiB)."""
THRESHOLD_POLL_MS = 50
"""Between iterations, how often the background loop looks for a segment
well past ``flush_threshold_bytes`` (to start the next iteration early)."""


@dataclass(frozen=True)
class StorageWriterConfig:
    """Settings of a container's storage writer (units in the names)."""

    flush_threshold_bytes: int = 4 << 20
    """A user segment is eligible once this many bytes are unflushed."""
    flush_threshold_ms: int = 30_000
    """... or once its oldest unflushed change is this old."""
    iteration_interval_ms: int = 1_000
    """Time between two flush iterations of the background loop."""
    flush_concurrency: int = 16
    """Segments of one bucket flushed at once (PDP-40 orders buckets, and each
    segment's data before its index and attributes, not segments of one
    bucket among themselves): their chunk writes and fsyncs overlap."""

    def __post_init__(self) -> None:
        if self.flush_threshold_bytes <= 0 or self.flush_threshold_ms < 0 \
                or self.iteration_interval_ms <= 0 or self.flush_concurrency <= 0:
            raise ConfigError("flush_threshold_bytes, iteration_interval_ms and "
                              "flush_concurrency must be positive, flush_threshold_ms not "
                              "negative")


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


class StorageWriter:
    """Flushes one container to tier-2 (see the module docstring).  Get one
    with :meth:`start`; run :meth:`flush_once` or :meth:`run`."""

    def __init__(self, source: WriterSource, storage: ChunkStorage,
                 config: StorageWriterConfig, max_chunk_bytes: int) -> None:
        self.source = source
        self.storage = storage
        self.config = config
        self.max_chunk_bytes = max_chunk_bytes
        cid = source.container_id
        self.metadata_segment = storage_metadata_name(cid)
        self._namer = ChunkNamer(source.epoch)
        self._journal = SystemJournal(storage, cid, source.epoch)
        self.recorded = RecordedLayouts(cid)
        self.layouts = self.recorded.layouts
        """The layout of every tier-2 segment of the container, as recorded."""
        self.owners = self.recorded.owners
        """Segment name -> the id of the segment whose layout :attr:`layouts` holds."""
        self._planner = FlushPlanner(self.recorded)
        self.reader = Tier2Reader(storage, self.layouts, self.owners)
        """Reads through the layouts as this writer records them."""
        self.sidecars = SidecarWriter(storage, source)
        """Writes the sidecars of stream segments' chunks (chunk_sidecars)."""
        self.truncated_at: int | None = None
        """The sequence of the checkpoint the tier-1 log was last truncated at."""
        self._wake = asyncio.Event()
        self.failure: BaseException | None = None
        self.iterations = 0

    @classmethod
    async def start(cls, source: WriterSource, storage: ChunkStorage,
                    config: StorageWriterConfig | None = None, *,
                    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> Self:
        """A writer for ``source``'s container: creates its storage-metadata
        segment if missing, loads the recorded layouts (tier-1's table,
        tier-2's journal) and has the container read tier-2 through them."""
        writer = cls(source, storage, config or StorageWriterConfig(), max_chunk_bytes)
        if source.segment(writer.metadata_segment) is None:
            await source.create_segment(writer.metadata_segment, SegmentType.TABLE)
        await writer._load()
        source.read_from_tier2(writer.reader.read)
        source.times_from_tier2(writer.reader)
        return writer

    async def _load(self) -> None:
        source = self.source
        s = source.segment(self.metadata_segment)
        assert s is not None
        self.recorded.load(source.table_entries(s.segment_id),
                           await read_journal(self.storage, source.container_id), s.segment_id)
        for m in source.segments.values():
            found = self.layouts.get(m.name)
            if found is not None and not m.deleted and self.owners[m.name] == m.segment_id:
                source.flushed(m.segment_id, found.length)

    def plan(self) -> list[list[int]]:
        """The eligible segments' ids per bucket (user, system, metadata), in
        flush order (by segment id within a bucket)."""
        config = self.config
        return self._planner.plan(self.source.segments, config.flush_threshold_bytes,
                                  config.flush_threshold_ms, self.source.now_ms())

    # --- one iteration ------------------------------------------------------------

    async def flush_once(self) -> IterationReport:
        """Run one flush iteration (see the module docstring)."""
        report = IterationReport()
        self._take_merges()
        dropped = self.recorded.take_dropped()
        await self._concurrently(dropped, self.sidecars.delete_chunk)
        report.chunks_deleted += len(dropped)
        plan = self.plan()
        segments = self.source.segments
        report.buckets = [[segments[sid].name for sid in bucket] for bucket in plan]
        await self._flush_planned(plan, report)
        self.iterations += 1
        return report

    async def _flush_planned(self, plan: list[list[int]], report: IterationReport) -> None:
        """Flush the planned segments in PDP-40's order (steps 3-6)."""
        for bucket in (USER, SYSTEM):  # each bucket wholly before the next
            await self._concurrently(plan[bucket],
                                     functools.partial(self._flush_segment, report=report))
        await self._flush_metadata(report)
        await self._truncate_tier1()

    async def _concurrently(self, items: list[T], run: Callable[[T], Awaitable[None]]) -> None:
        """``run`` each of ``items``, up to ``flush_concurrency`` at once (a
        chunk delete is an unlink and a directory fsync on the file driver:
        one at a time, a concatenation's eight cost an iteration a few tens
        of ms); returns when all are done (the first failure is raised
        after the others end)."""
        pending = iter(items)

        async def worker() -> None:
            for item in pending:
                await run(item)
        workers = min(self.config.flush_concurrency, len(items))
        results = await asyncio.gather(*(worker() for _ in range(workers)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

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
        await self._flush_data(snapshot, report)
        await self._flush_index(snapshot, report)
        await self._flush_attributes(snapshot, report)

    async def _write(self, layout: SegmentLayout, data: bytes,
                     report: IterationReport) -> SegmentLayout:
        """``layout`` grown by ``data``, written as new chunks of at most
        ``max_chunk_bytes``."""
        for at in range(0, len(data), self.max_chunk_bytes):
            piece = data[at:at + self.max_chunk_bytes]
            name = self._namer.next_name(layout.segment)
            await self.storage.write_chunk(name, piece)
            await self.sidecars.chunk_written(layout, name, piece)
            layout = layout.with_chunk(name, len(piece))
            report.chunks_written += 1
            report.bytes_written += len(piece)
        return await self._concatenate(layout, report)

    async def _concatenate(self, layout: SegmentLayout, report: IterationReport
                           ) -> SegmentLayout:
        """``layout`` with its trailing run of small chunks joined into one
        new chunk once the run is :data:`CONCAT_RUN_CHUNKS` long and fits in
        ``max_chunk_bytes``, so the chunk count stays bounded although system
        and metadata segments flush a little every iteration.  The replaced
        chunks are deleted an iteration after the new layout is recorded."""
        chunks = layout.chunks
        first = len(chunks)
        total = 0
        while first > 0 and total + chunks[first - 1].length <= self.max_chunk_bytes:
            first -= 1
            total += chunks[first].length
        if len(chunks) - first < CONCAT_RUN_CHUNKS:
            return layout
        name = self._namer.next_name(layout.segment)
        written = await concat_chunks(self.storage, name, [c.name for c in chunks[first:]])
        await self.sidecars.concatenated(layout, first, len(chunks) - first, name)
        report.chunks_written += 1
        report.bytes_written += written
        layout, replaced = layout.concatenated(first, len(chunks) - first, name)
        self.recorded.dropped += replaced
        return layout

    async def _flush_data(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        name = snapshot.name
        recorded, planner = self.recorded, self._planner
        segments = self.source.segments
        if snapshot.deleted:
            if snapshot.segment_id in planner.merge_sources:
                return  # its target's flush takes its bytes over
            recorded.delete(name, snapshot.segment_id)
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
            recorded.dropped += dropped
        for source_id, offset, length in sorted(planner.merges.pop(snapshot.segment_id, []),
                                                key=lambda merge: merge[1]):
            layout = await self._copy(snapshot.segment_id, layout, offset, report)
            source_name = segments[source_id].name
            source = recorded.current(source_name, source_id)
            if layout.length == offset and source is not None and not source.deleted \
                    and source.start_offset == 0 and source.length == length:
                # the source's chunks join the target's layout: nothing copied
                layout, gone = layout.merged(source if source.sealed else source.with_sealed())
                await self.sidecars.joined(layout, offset, length)
                recorded.set(gone, source_id)
            else:  # copied (through the read index, the source's layout still readable)
                layout = await self._copy(snapshot.segment_id, layout, offset + length, report)
                recorded.delete(source_name, source_id)
            planner.merge_sources.discard(source_id)
        layout = await self._copy(snapshot.segment_id, layout, snapshot.length, report)
        if snapshot.sealed and layout.length == snapshot.length and not layout.sealed:
            layout = layout.with_sealed()
        recorded.set(layout, snapshot.segment_id)
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
            layout = await self._write(layout, data, report)
        return layout

    async def _flush_index(self, snapshot: SegmentSnapshot, report: IterationReport) -> None:
        if snapshot.index is None:
            return
        name = snapshot.name + INDEX_SUFFIX
        recorded = self.recorded
        if snapshot.deleted:
            recorded.delete(name, snapshot.segment_id)
            return
        tracked = self._planner.tracked.setdefault(snapshot.segment_id, Tracked())
        changed = {k: v for k, v in snapshot.index.items() if tracked.flushed_index.get(k) != v}
        changed.update((k, REMOVED_VERSION) for k in tracked.flushed_index
                       if k not in snapshot.index)
        if not changed and recorded.current(name, snapshot.segment_id) is not None:
            return
        if not self._data_flushed(snapshot):
            return
        layout = recorded.layout_for(name, snapshot.segment_id)
        data = encode_index_batch(changed, snapshot.length)
        recorded.set(await self._write(layout, data, report), snapshot.segment_id)
        tracked.flushed_index = dict(snapshot.index)

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
        data = encode_attribute_batch(changed, snapshot.length)
        self.recorded.set(await self._write(layout, data, report), snapshot.segment_id)
        tracked.flushed_attributes.update(changed)
        tracked.attributes_dirty_since_ms = None

    async def _record(self) -> None:
        """Put the changed layouts in the storage-metadata table (tier-1)."""
        if not self.recorded.unrecorded:
            return
        entries = self.recorded.take_unrecorded(self.source.segments)
        puts = [self.source.table_put(self.metadata_segment,
                                      entries[at:at + _RECORDS_PER_PUT])
                for at in range(0, len(entries), _RECORDS_PER_PUT)]
        await asyncio.gather(*puts)

    async def _flush_metadata(self, report: IterationReport) -> None:
        """The container-metadata bucket, last: record, flush, journal."""
        await self._record()
        s = self.source.segment(self.metadata_segment)
        if s is None:
            raise SegmentStoreError(f"{self.metadata_segment} is gone")
        recorded = self.recorded.current(s.name, s.segment_id)
        if (recorded is None or recorded.length < s.length) \
                and s.name not in report.buckets[METADATA]:
            report.buckets[METADATA].append(s.name)  # modified by this iteration's records
        await self._flush_segment(s.segment_id, report)
        if self.recorded.journal_dirty:
            report.bytes_written += await self._journal.write(self.recorded.metadata_layouts())
            report.chunks_written += 1
            self.recorded.journal_dirty = False
            report.chunks_deleted += await self._journal.delete_stale()

    async def _truncate_tier1(self) -> None:
        """Checkpoint, and cut tier-1 below the newest checkpoint whose bytes
        are all in tier-2 (every layout here is recorded and flushed now)."""
        added = self.source.add_checkpoint()
        if added is not None:
            await added
        segments = self.source.segments
        current = self.recorded.current

        def in_tier2(segment_id: int, length: int) -> bool:
            s = segments.get(segment_id)
            if s is None or s.deleted:
                return False  # a later checkpoint no longer counts it
            if length <= s.start_offset:
                return True
            layout = current(s.name, segment_id)
            return layout is not None and layout.length >= length
        sequence = await self.source.truncate_log(in_tier2)
        if sequence is not None:
            self.truncated_at = sequence

    # --- backlog and the background loop ---------------------------------------------

    def backlog_bytes(self) -> int:
        """Committed bytes of live segments not yet in tier-2."""
        total = 0
        current = self.recorded.current
        for s in self.source.segments.values():
            if not s.deleted:
                layout = current(s.name, s.segment_id)
                total += s.length - max(s.start_offset,
                                        layout.length if layout is not None else 0)
        return total

    def wake(self) -> None:
        """Start the next iteration of :meth:`run` now."""
        self._wake.set()

    def threshold_overrun(self) -> bool:
        """Whether a live user segment has half as much again as
        ``flush_threshold_bytes`` unflushed (a scan of the committed
        segments: about 0.1 us each)."""
        threshold = self.config.flush_threshold_bytes * 3 // 2
        cid = self.source.container_id
        for s in self.source.segments.values():
            if s.length - max(s.storage_length, s.start_offset) >= threshold \
                    and not s.deleted and bucket_of(s.name, cid) == USER:
                return True
        return False

    async def _until_next_iteration(self) -> None:
        """Up to ``iteration_interval_ms``, but no longer than
        :data:`THRESHOLD_POLL_MS` after a segment passes 1.5 x the size
        threshold (or at once on :meth:`wake`): a segment written faster
        than ``flush_threshold_bytes`` per interval would otherwise pile up
        a backlog of its rate x the interval, past the 2 x threshold per
        segment that ``benchmarks/tier2_backlog.py`` holds it to.  Not at
        1 x: segments written evenly reach it together, and waking for the
        first would run an iteration (with its fixed metadata, journal and
        checkpoint writes) for each of them in turn."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.iteration_interval_ms / 1000
        while (remaining := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       min(remaining, THRESHOLD_POLL_MS / 1000))
            if self._wake.is_set() or self.threshold_overrun():
                break
        self._wake.clear()

    async def run(self) -> None:
        """Flush iterations every ``iteration_interval_ms``, or sooner once a
        segment is well past the size threshold, until cancelled or a failure
        (kept in :attr:`failure`: the container was fenced or failed, or
        tier-2 refused)."""
        try:
            while True:
                await self.flush_once()
                await self._until_next_iteration()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # kept for the owner to see
            self.failure = e
