"""The storage writer: one container's committed segments flushed to tier-2 (PDP-40).

One :class:`StorageWriter` per open container.  It runs *flush iterations*
(:meth:`StorageWriter.flush_once`); each one:

1. deletes the chunks that the previous iteration dropped from layouts
   (a delete, a truncate, a concatenation): their new layouts are recorded and were flushed
   last in that iteration, so tier-2's metadata never names a chunk that is
   gone (PDP-40 rule 5, delete and truncate in two iterations);
2. picks the *eligible* segments (:meth:`StorageWriter.plan`): a user
   segment when its unflushed bytes reach ``flush_threshold_bytes``, or its
   oldest unflushed change is ``flush_threshold_ms`` old, or its
   ``$attributes`` segment is eligible by the same rules (requirement 3:
   both together), or it is empty and not recorded yet (tier-2 records even
   an empty segment), or it was sealed, truncated, deleted or merged into; every modified
   system segment (``_system/...``, requirement 1) and container-metadata
   segment (requirement 2) in every iteration;
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
   of the highest epoch wins), so tier-2 alone can be read back:
   :func:`read_layout`;
6. writes a checkpoint to the container's tier-1 log and truncates the log
   below the newest checkpoint all of whose segment lengths are in tier-2
   (:meth:`~quire.segmentstore.container.SegmentContainer.truncate_log`):
   a reopen replays from there and reads older bytes from tier-2.

A layout is recorded only after the chunks it names are durable, and a
chunk is deleted only once the layout without it is flushed, so whatever
instant tier-2 is read at, every recorded offset is a guaranteed offset.

Chunk names come from a :class:`~quire.tier2.ChunkNamer` with the epoch the
container took on its tier-1 log: never reused, so a fenced old owner still
running can never overwrite a chunk the new owner wrote.

``flush_order="unordered"`` exists for tests only: it flushes the steps of
an iteration (each segment's data, index and attributes, and the metadata
bucket) in a shuffled order, and deletes dropped chunks as soon as their
layout is put in tier-1 (one iteration), which is what PDP-40 forbids.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quire.errors import (
    ChunkNotFoundError,
    ConfigError,
    SegmentStoreError,
    SegmentTruncatedError,
)
from quire.segmentstore.names import (
    ATTRIBUTES_SUFFIX,
    INDEX_SUFFIX,
    SYSTEM_SCOPE,
    base_segment_name,
)
from quire.segmentstore.storage_records import (
    REMOVED_VERSION,
    JournalSnapshot,
    decode_journal,
    decode_layout_record,
    decode_typed_layout_record,
    encode_attribute_batch,
    encode_index_batch,
    encode_journal,
    encode_layout_record,
)
from quire.segmentstore.tables import decode_entries
from quire.segmentstore.types import SegmentType
from quire.tier2 import (
    ChunkNamer,
    ChunkStorage,
    SegmentLayout,
    concat_chunks,
    parse_chunk_name,
    read_segment,
)
from quire.tier2.config import DEFAULT_MAX_CHUNK_BYTES

if TYPE_CHECKING:  # the container is the writer's input, not needed to read a layout
    from quire.segmentstore.container import SegmentContainer
    from quire.segmentstore.metadata import SegmentMetadata

USER, SYSTEM, METADATA = 0, 1, 2
"""Flush priority buckets, flushed in this order."""
BUCKET_NAMES = ("user", "system", "container metadata")
FLUSH_ORDERS = ("pdp40", "unordered")
CONCAT_RUN_CHUNKS = 8
"""A segment's trailing small chunks are joined once there are this many."""
_RECORDS_PER_PUT = 1000
"""Layouts per table_put (a put is one append: at most 16 MiB)."""
_JOURNAL_READ_ATTEMPTS = 100
_ATTRIBUTE_RECORD_BYTES = 24
THRESHOLD_POLL_MS = 50
"""Between iterations, how often the background loop looks for a segment
well past ``flush_threshold_bytes`` (to start the next iteration early)."""
"""What one changed attribute costs in its ``$attributes`` segment."""


def storage_metadata_name(container_id: int) -> str:
    """The container's storage-metadata table segment (layouts by segment name)."""
    return f"{SYSTEM_SCOPE}/containers/storage_metadata_{container_id}"


def journal_name(container_id: int) -> str:
    """The segment name the container's system-journal chunks are named after."""
    return f"{SYSTEM_SCOPE}/containers/journal_{container_id}"


def bucket_of(name: str, container_id: int) -> int:
    """The priority bucket of segment ``name`` (an ``$attributes``/``$index``
    segment and a transaction go with their base segment)."""
    base = base_segment_name(name)
    if base == storage_metadata_name(container_id):
        return METADATA
    if base.startswith(SYSTEM_SCOPE + "/"):
        return SYSTEM
    return USER


@dataclass(frozen=True)
class StorageWriterConfig:
    """Settings of a container's storage writer (units in the names)."""

    flush_threshold_bytes: int = 4 << 20
    """A user segment is eligible once this many bytes are unflushed."""
    flush_threshold_ms: int = 30_000
    """... or once its oldest unflushed change is this old."""
    iteration_interval_ms: int = 1_000
    """Time between two flush iterations of the background loop."""
    flush_order: str = "pdp40"
    """"pdp40" (PDP-40's order) or "unordered" (tests: any order, deletes at once)."""
    unordered_seed: int = 0
    """The shuffle's seed under "unordered" (runs replay)."""
    flush_concurrency: int = 16
    """Segments of one bucket flushed at once (PDP-40 orders buckets, and each
    segment's data before its index and attributes, not segments of one
    bucket among themselves): their chunk writes and fsyncs overlap."""

    def __post_init__(self) -> None:
        if self.flush_order not in FLUSH_ORDERS:
            raise ConfigError(f"flush_order is one of {FLUSH_ORDERS}, got {self.flush_order!r}")
        if self.flush_threshold_bytes <= 0 or self.flush_threshold_ms < 0 \
                or self.iteration_interval_ms <= 0 or self.flush_concurrency <= 0:
            raise ConfigError("flush_threshold_bytes, iteration_interval_ms and "
                              "flush_concurrency must be positive, flush_threshold_ms not "
                              "negative")


@dataclass
class _Tracked:
    """What the writer remembers of one segment between iterations."""

    dirty_since_ms: int | None = None
    """When the writer first saw the segment's data or state unflushed."""
    attributes_dirty_since_ms: int | None = None
    flushed_attributes: dict[int, int] = field(default_factory=dict)
    """The values in tier-2's ``$attributes`` (empty after a reopen: all are written again)."""
    flushed_index: dict[bytes, int] = field(default_factory=dict)
    """Key -> version in tier-2's ``$index``."""


@dataclass(frozen=True)
class _Snapshot:
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

    def __init__(self, container: SegmentContainer, storage: ChunkStorage,
                 config: StorageWriterConfig, max_chunk_bytes: int,
                 clock_ms: Callable[[], int]) -> None:
        self.container = container
        self.storage = storage
        self.config = config
        self.max_chunk_bytes = max_chunk_bytes
        self._clock_ms = clock_ms
        cid = container.container_id
        self.metadata_segment = storage_metadata_name(cid)
        self._namer = ChunkNamer(container.epoch)
        self._journal_namer = ChunkNamer(container.epoch)
        self.layouts: dict[str, SegmentLayout] = {}
        """The layout of every tier-2 segment of the container, as recorded."""
        self.owners: dict[str, int] = {}
        """Segment name -> the id of the segment whose layout :attr:`layouts` holds."""
        self._unrecorded: dict[str, SegmentLayout] = {}
        """Layouts changed and not yet put in the storage-metadata table."""
        self._journal_dirty = False
        self._journal_chunk: str | None = None
        self._dropped: list[str] = []
        """Chunks no recorded layout names any more; deleted next iteration."""
        self._tracked: dict[int, _Tracked] = {}
        self._merges: dict[int, list[tuple[int, int, int]]] = {}
        """Target id -> its merges not yet in tier-2: (source id, offset, length)."""
        self._merge_sources: set[int] = set()
        """Merged sources whose tier-2 bytes their target's flush takes over."""
        self.reader = Tier2Reader(storage, self.layouts, self.owners)
        """Reads through the layouts as this writer records them."""
        self.truncated_at: int | None = None
        """The sequence of the checkpoint the tier-1 log was last truncated at."""
        self._random = random.Random(config.unordered_seed)
        self._wake = asyncio.Event()
        self.failure: BaseException | None = None
        self.iterations = 0
        self.before_step: Callable[[str], Awaitable[None]] | None = None
        """Test hook: awaited before each flush step ("data:<name>",
        "index:<name>", "attributes:<name>", "metadata"); raising stops the
        iteration there, as a crash of the owner would."""

    @classmethod
    async def start(cls, container: SegmentContainer, storage: ChunkStorage,
                    config: StorageWriterConfig | None = None, *,
                    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
                    clock_ms: Callable[[], int] | None = None) -> StorageWriter:
        """A writer for ``container``: creates its storage-metadata segment if
        missing and loads the recorded layouts (tier-1's table, tier-2's journal)."""
        writer = cls(container, storage, config or StorageWriterConfig(), max_chunk_bytes,
                     clock_ms or container.clock_ms)
        if container.committed.get(writer.metadata_segment) is None:
            await container.create_segment(writer.metadata_segment, SegmentType.TABLE)
        await writer._load()
        container.tier2_read = writer.reader.read
        container.read_index.fetch_tier2 = container.fetch_tier2
        return writer

    async def _load(self) -> None:
        container = self.container
        s = container.committed.get(self.metadata_segment)
        assert s is not None
        table = container.tables_committed.get(s.segment_id)
        if table is not None:
            for key, (_version, value) in table.entries.items():
                owner, layout = decode_layout_record(value)
                self.layouts[key.decode()] = layout
                self.owners[key.decode()] = owner
        snapshot = await read_journal(self.storage, container.container_id)
        if snapshot is not None:
            for layout in snapshot.layouts:
                self.layouts[layout.segment] = layout
                self.owners[layout.segment] = s.segment_id
        for m in container.committed.segments.values():
            found = self.layouts.get(m.name)
            if found is not None and not m.deleted and self.owners[m.name] == m.segment_id:
                m.storage_length = found.length
                container.read_index.flushed(m.segment_id, found.length)

    # --- planning ---------------------------------------------------------------

    def plan(self) -> list[list[int]]:
        """The eligible segments' ids per bucket (user, system, metadata), in
        flush order (by segment id within a bucket)."""
        now = self._clock_ms()
        config = self.config
        cid = self.container.container_id
        buckets: list[list[int]] = [[], [], []]
        for sid, s in self.container.committed.segments.items():
            bucket = bucket_of(s.name, cid)
            layout = self._current(s.name, sid)
            tracked = self._tracked.get(sid)
            if s.deleted:
                if sid in self._merge_sources:
                    continue  # its target's flush takes its bytes over
                if any(self._live_layout(n, sid) for n in
                       (s.name, s.name + ATTRIBUTES_SUFFIX, s.name + INDEX_SUFFIX)):
                    buckets[bucket].append(sid)
                else:
                    self._tracked.pop(sid, None)
                continue
            flushed = layout.length if layout is not None else 0
            start = layout.start_offset if layout is not None else 0
            # an empty segment tier-2 has no record of yet is recorded (empty):
            # recovery brings back what tier-2 records, and a stream's new
            # segments or a controller's tables may stay empty a long time
            state_changed = (layout is None and s.length == 0) or s.start_offset > start \
                or (s.sealed and not (
                layout is not None and layout.sealed)) or sid in self._merges
            if tracked is None:
                tracked = self._tracked[sid] = _Tracked()
            pending_attributes = sum(1 for k, v in s.attributes.items()
                                     if tracked.flushed_attributes.get(k) != v)
            unflushed = s.length - flushed
            if not (unflushed or state_changed or pending_attributes):
                tracked.dirty_since_ms = tracked.attributes_dirty_since_ms = None
                continue
            if (unflushed or state_changed) and tracked.dirty_since_ms is None:
                tracked.dirty_since_ms = now
            if pending_attributes and tracked.attributes_dirty_since_ms is None:
                tracked.attributes_dirty_since_ms = now
            if bucket != USER:
                buckets[bucket].append(sid)
                continue
            data_eligible = unflushed >= config.flush_threshold_bytes or state_changed or (
                tracked.dirty_since_ms is not None
                and now - tracked.dirty_since_ms >= config.flush_threshold_ms)
            attributes_eligible = pending_attributes > 0 and (
                pending_attributes * _ATTRIBUTE_RECORD_BYTES >= config.flush_threshold_bytes
                or (tracked.attributes_dirty_since_ms is not None
                    and now - tracked.attributes_dirty_since_ms >= config.flush_threshold_ms))
            if data_eligible or attributes_eligible:
                buckets[USER].append(sid)
        return buckets

    def _live_layout(self, name: str, segment_id: int) -> bool:
        layout = self.layouts.get(name)
        return layout is not None and not layout.deleted and self.owners[name] == segment_id

    def _current(self, name: str, segment_id: int) -> SegmentLayout | None:
        """Segment ``segment_id``'s recorded layout under ``name`` (None if
        the recorded one is another segment's, deleted since, of that name)."""
        layout = self.layouts.get(name)
        return layout if layout is not None and self.owners[name] == segment_id else None

    def _layout_for(self, name: str, segment_id: int) -> SegmentLayout:
        """The layout to grow for segment ``segment_id``: its own, or a new one
        (the chunks of an earlier segment of that name, not yet deleted, are
        dropped: the new layout replaces its record)."""
        layout = self._current(name, segment_id)
        if layout is not None:
            return layout
        previous = self.layouts.get(name)
        if previous is not None:
            self._dropped += [c.name for c in previous.chunks]
        return SegmentLayout(name)

    # --- one iteration ------------------------------------------------------------

    async def flush_once(self) -> IterationReport:
        """Run one flush iteration (see the module docstring)."""
        report = IterationReport()
        self._take_merges()
        dropped, self._dropped = self._dropped, []
        await self._delete_chunks(dropped, report)
        plan = self.plan()
        names = self.container.committed.segments
        report.buckets = [[names[sid].name for sid in bucket] for bucket in plan]
        if self.config.flush_order == "pdp40":
            for bucket in (USER, SYSTEM):  # each bucket wholly before the next
                await self._flush_bucket(plan[bucket], report)
            await self._flush_metadata(report)
        else:
            steps: list[Callable[[], Awaitable[None]]] = []
            for sid in plan[USER] + plan[SYSTEM]:
                snapshot = self._snapshot(sid)
                steps.append(self._step(self._flush_data, snapshot, report))
                steps.append(self._step(self._flush_index, snapshot, report))
                steps.append(self._step(self._flush_attributes, snapshot, report))
            steps.append(lambda: self._flush_metadata(report))
            self._random.shuffle(steps)
            for step in steps:
                await step()
        if self.config.flush_order == "pdp40":
            await self._truncate_tier1()
        self.iterations += 1
        return report

    async def _delete_chunks(self, names: list[str], report: IterationReport) -> None:
        """Delete chunks, up to ``flush_concurrency`` at once (each is an
        unlink and a directory fsync on the file driver: one at a time,
        a concatenation's eight cost an iteration a few tens of ms)."""
        pending = iter(names)

        async def worker() -> None:
            for name in pending:
                await self.storage.delete(name)
                report.chunks_deleted += 1
        workers = min(self.config.flush_concurrency, len(names))
        results = await asyncio.gather(*(worker() for _ in range(workers)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _flush_bucket(self, segment_ids: list[int], report: IterationReport) -> None:
        """Flush the segments, up to ``flush_concurrency`` at once; returns
        when all are done (the first failure is raised after the others end)."""
        pending = iter(segment_ids)

        async def worker() -> None:
            for segment_id in pending:
                await self._flush_segment(segment_id, report)
        workers = min(self.config.flush_concurrency, len(segment_ids))
        results = await asyncio.gather(*(worker() for _ in range(workers)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _step(self, flush: Callable[[_Snapshot, IterationReport], Awaitable[None]],
              snapshot: _Snapshot, report: IterationReport) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            await flush(snapshot, report)
            if self._dropped:  # "unordered": deletes in the same iteration
                await self._record()
                dropped, self._dropped = self._dropped, []
                for name in dropped:
                    await self.storage.delete(name)
                    report.chunks_deleted += 1
        return step

    def _take_merges(self) -> None:
        merges = self.container.merges
        for target_id, source_id, offset, length in merges:
            self._merges.setdefault(target_id, []).append((source_id, offset, length))
            self._merge_sources.add(source_id)
        merges.clear()

    def _snapshot(self, segment_id: int) -> _Snapshot:
        self._take_merges()  # every merge the snapshot's length counts
        s: SegmentMetadata = self.container.committed.segments[segment_id]
        index = None
        if s.type is SegmentType.TABLE:
            table = self.container.tables_committed.get(segment_id)
            index = {} if table is None else {k: v[0] for k, v in table.entries.items()}
        return _Snapshot(segment_id, s.name, s.length, s.start_offset, s.sealed, s.deleted,
                         dict(s.attributes), index)

    async def _flush_segment(self, segment_id: int, report: IterationReport) -> None:
        snapshot = self._snapshot(segment_id)
        await self._flush_data(snapshot, report)
        await self._flush_index(snapshot, report)
        await self._flush_attributes(snapshot, report)

    def _set_layout(self, layout: SegmentLayout, segment_id: int) -> None:
        if self.layouts.get(layout.segment) == layout \
                and self.owners[layout.segment] == segment_id:
            return
        self.layouts[layout.segment] = layout
        self.owners[layout.segment] = segment_id
        if bucket_of(layout.segment, self.container.container_id) == METADATA:
            self._journal_dirty = True
        else:
            self._unrecorded[layout.segment] = layout

    async def _hook(self, step: str) -> None:
        if self.before_step is not None:
            await self.before_step(step)

    async def _write(self, layout: SegmentLayout, data: bytes,
                     report: IterationReport) -> SegmentLayout:
        """``layout`` grown by ``data``, written as new chunks of at most
        ``max_chunk_bytes``."""
        for at in range(0, len(data), self.max_chunk_bytes):
            piece = data[at:at + self.max_chunk_bytes]
            name = self._namer.next_name(layout.segment)
            await self.storage.write_chunk(name, piece)
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
        report.chunks_written += 1
        report.bytes_written += written
        layout, replaced = layout.concatenated(first, len(chunks) - first, name)
        self._dropped += replaced
        return layout

    def _delete_layout(self, name: str, segment_id: int) -> None:
        layout = self._current(name, segment_id)
        if layout is not None and not layout.deleted:
            gone, dropped = layout.with_deleted()
            self._set_layout(gone, segment_id)
            self._dropped += dropped

    async def _flush_data(self, snapshot: _Snapshot, report: IterationReport) -> None:
        await self._hook(f"data:{snapshot.name}")
        name = snapshot.name
        segments = self.container.committed.segments
        if snapshot.deleted:
            if snapshot.segment_id in self._merge_sources:
                return  # its target's flush takes its bytes over
            self._delete_layout(name, snapshot.segment_id)
            for source_id, _offset, _length in self._merges.pop(snapshot.segment_id, []):
                self._delete_layout(segments[source_id].name, source_id)
                self._merge_sources.discard(source_id)
            self._tracked.pop(snapshot.segment_id, None)
            return
        layout = self._layout_for(name, snapshot.segment_id)
        if snapshot.start_offset > layout.start_offset:
            if snapshot.start_offset <= layout.length:
                layout, dropped = layout.truncated(snapshot.start_offset)
            else:  # truncated above what tier-2 holds: those bytes are never written
                dropped = [c.name for c in layout.chunks]
                layout = SegmentLayout(name, (), snapshot.start_offset, snapshot.start_offset)
            self._dropped += dropped
        segment = segments[snapshot.segment_id]
        for source_id, offset, length in sorted(self._merges.pop(snapshot.segment_id, []),
                                                key=lambda merge: merge[1]):
            layout = await self._copy(snapshot.segment_id, layout, offset, report)
            source_name = segments[source_id].name
            source = self._current(source_name, source_id)
            if layout.length == offset and source is not None and not source.deleted \
                    and source.start_offset == 0 and source.length == length:
                # the source's chunks join the target's layout: nothing copied
                layout, gone = layout.merged(source if source.sealed else source.with_sealed())
                self._set_layout(gone, source_id)
            else:  # copied (through the read index, the source's layout still readable)
                layout = await self._copy(snapshot.segment_id, layout, offset + length, report)
                self._delete_layout(source_name, source_id)
            self._merge_sources.discard(source_id)
        layout = await self._copy(snapshot.segment_id, layout, snapshot.length, report)
        if snapshot.sealed and layout.length == snapshot.length and not layout.sealed:
            layout = layout.with_sealed()
        self._set_layout(layout, snapshot.segment_id)
        segment.storage_length = layout.length
        self.container.read_index.flushed(snapshot.segment_id, layout.length)
        tracked = self._tracked.get(snapshot.segment_id)
        if tracked is not None:
            tracked.dirty_since_ms = None

    def _data_flushed(self, snapshot: _Snapshot) -> bool:
        """Whether the data segment is in tier-2 up to the snapshot's length,
        so a batch recording that length may follow (PDP-40 rule 9); when a
        truncate or delete cut the data flush short, the batch waits for the
        next iteration.  "unordered" does not wait."""
        if self.config.flush_order != "pdp40":
            return True
        layout = self._current(snapshot.name, snapshot.segment_id)
        return layout is not None and layout.length >= snapshot.length

    async def _copy(self, segment_id: int, layout: SegmentLayout, up_to: int,
                    report: IterationReport) -> SegmentLayout:
        """``layout`` grown with the segment's committed bytes up to ``up_to``
        (less if it was truncated or deleted meanwhile: the next iteration
        sees that)."""
        while layout.length < up_to:
            want = min(self.max_chunk_bytes, up_to - layout.length)
            data = await self.container.read_index.read(segment_id, layout.length, want)
            if not data:
                break
            layout = await self._write(layout, data, report)
        return layout

    async def _flush_index(self, snapshot: _Snapshot, report: IterationReport) -> None:
        if snapshot.index is None:
            return
        await self._hook(f"index:{snapshot.name}")
        name = snapshot.name + INDEX_SUFFIX
        if snapshot.deleted:
            self._delete_layout(name, snapshot.segment_id)
            return
        tracked = self._tracked.setdefault(snapshot.segment_id, _Tracked())
        changed = {k: v for k, v in snapshot.index.items() if tracked.flushed_index.get(k) != v}
        changed.update((k, REMOVED_VERSION) for k in tracked.flushed_index
                       if k not in snapshot.index)
        if not changed and self._current(name, snapshot.segment_id) is not None:
            return
        if not self._data_flushed(snapshot):
            return
        layout = self._layout_for(name, snapshot.segment_id)
        data = encode_index_batch(changed, snapshot.length)
        self._set_layout(await self._write(layout, data, report), snapshot.segment_id)
        tracked.flushed_index = dict(snapshot.index)

    async def _flush_attributes(self, snapshot: _Snapshot, report: IterationReport) -> None:
        name = snapshot.name + ATTRIBUTES_SUFFIX
        if snapshot.deleted:
            self._delete_layout(name, snapshot.segment_id)
            return
        tracked = self._tracked.setdefault(snapshot.segment_id, _Tracked())
        changed = {k: v for k, v in snapshot.attributes.items()
                   if tracked.flushed_attributes.get(k) != v}
        if not changed:
            return
        await self._hook(f"attributes:{snapshot.name}")
        if not self._data_flushed(snapshot):
            return
        layout = self._layout_for(name, snapshot.segment_id)
        data = encode_attribute_batch(changed, snapshot.length)
        self._set_layout(await self._write(layout, data, report), snapshot.segment_id)
        tracked.flushed_attributes.update(changed)
        tracked.attributes_dirty_since_ms = None

    async def _record(self) -> None:
        """Put the changed layouts in the storage-metadata table (tier-1)."""
        if not self._unrecorded:
            return
        segments = self.container.committed.segments
        entries = []
        for name, layout in self._unrecorded.items():
            owner = segments.get(self.owners[name])
            entries.append((name.encode(), encode_layout_record(
                self.owners[name], layout, 0 if owner is None else int(owner.type)), None))
        self._unrecorded = {}
        puts = [self.container.table_put(self.metadata_segment,
                                         entries[at:at + _RECORDS_PER_PUT])
                for at in range(0, len(entries), _RECORDS_PER_PUT)]
        await asyncio.gather(*puts)

    async def _flush_metadata(self, report: IterationReport) -> None:
        """The container-metadata bucket, last: record, flush, journal."""
        await self._hook("metadata")
        await self._record()
        s = self.container.committed.get(self.metadata_segment)
        if s is None:
            raise SegmentStoreError(f"{self.metadata_segment} is gone")
        recorded = self._current(s.name, s.segment_id)
        if (recorded is None or recorded.length < s.length) \
                and s.name not in report.buckets[METADATA]:
            report.buckets[METADATA].append(s.name)  # modified by this iteration's records
        await self._flush_segment(s.segment_id, report)
        if self._journal_dirty:
            cid = self.container.container_id
            layouts = tuple(layout for name, layout in sorted(self.layouts.items())
                            if bucket_of(name, cid) == METADATA)
            data = encode_journal(JournalSnapshot(cid, self.container.epoch, layouts))
            chunk = self._journal_namer.next_name(journal_name(cid))
            await self.storage.write_chunk(chunk, data)
            report.chunks_written += 1
            report.bytes_written += len(data)
            previous, self._journal_chunk = self._journal_chunk, chunk
            self._journal_dirty = False
            if previous is None:  # this owner's first: older owners' snapshots are stale
                stale = [info.name for info in await self.storage.list_chunks(
                    journal_name(cid) + ".E") if info.name != chunk
                    and parse_chunk_name(info.name)[1] < self.container.epoch]
            else:
                stale = [previous]
            for name in stale:
                await self.storage.delete(name)
                report.chunks_deleted += 1

    async def _truncate_tier1(self) -> None:
        """Checkpoint, and cut tier-1 below the newest checkpoint whose bytes
        are all in tier-2 (every layout here is recorded and flushed now)."""
        added = self.container.add_checkpoint()
        if added is not None:
            await added
        segments = self.container.committed.segments

        def in_tier2(segment_id: int, length: int) -> bool:
            s = segments.get(segment_id)
            if s is None or s.deleted:
                return False  # a later checkpoint no longer counts it
            if length <= s.start_offset:
                return True
            layout = self._current(s.name, segment_id)
            return layout is not None and layout.length >= length
        sequence = await self.container.truncate_log(in_tier2)
        if sequence is not None:
            self.truncated_at = sequence

    # --- backlog and the background loop ---------------------------------------------

    def backlog_bytes(self) -> int:
        """Committed bytes of live segments not yet in tier-2."""
        total = 0
        for s in self.container.committed.segments.values():
            if not s.deleted:
                layout = self._current(s.name, s.segment_id)
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
        cid = self.container.container_id
        for s in self.container.committed.segments.values():
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


# --- reading tier-2 alone ---------------------------------------------------------------


class Tier2Reader:
    """Reads segments' bytes out of tier-2 by the layouts it is given
    (the writer's live ones, or :meth:`load`'s from tier-2 alone)."""

    def __init__(self, storage: ChunkStorage, layouts: dict[str, SegmentLayout],
                 owners: dict[str, int]) -> None:
        self.storage = storage
        self.layouts = layouts
        self.owners = owners

    @classmethod
    async def load(cls, storage: ChunkStorage, container_id: int) -> Tier2Reader:
        """A reader over what tier-2 records for container ``container_id``."""
        layouts, owners = await _read_records(storage, container_id)
        return cls(storage, layouts, owners)

    async def read(self, segment_id: int, name: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of segment ``segment_id`` (called ``name``)
        from ``offset``; b"" if tier-2 holds none there."""
        layout = self.layouts.get(name)
        if layout is None or self.owners.get(name, segment_id) != segment_id \
                or not layout.start_offset <= offset < layout.length:
            return b""
        return await read_segment(self.storage, layout, offset,
                                  min(length, layout.length - offset))



async def read_journal(storage: ChunkStorage, container_id: int) -> JournalSnapshot | None:
    """The latest journal snapshot of container ``container_id`` (highest
    epoch, then highest counter), or None if it has none.  A snapshot that
    vanishes under the reader (its writer deleted it after writing a newer
    one) is looked for again."""
    prefix = journal_name(container_id) + ".E"
    for _attempt in range(_JOURNAL_READ_ATTEMPTS):
        best: tuple[int, int, str] | None = None
        for info in await storage.list_chunks(prefix):
            segment, epoch, counter = parse_chunk_name(info.name)
            if segment == journal_name(container_id) and (best is None
                                                          or (epoch, counter) > best[:2]):
                best = (epoch, counter, info.name)
        if best is None:
            return None
        try:
            name = best[2]
            return decode_journal(await storage.read(name, 0, await storage.length(name)))
        except ChunkNotFoundError:
            continue
    raise SegmentStoreError(f"container {container_id}: its journal snapshots kept vanishing "
                            f"({_JOURNAL_READ_ATTEMPTS} attempts)")


async def journal_containers(storage: ChunkStorage) -> list[int]:
    """The ids of the containers with a system journal in ``storage``."""
    prefix = f"{SYSTEM_SCOPE}/containers/journal_"
    found = set()
    for info in await storage.list_chunks(prefix):
        segment, _epoch, _counter = parse_chunk_name(info.name)
        found.add(int(segment[len(prefix):]))
    return sorted(found)


@dataclass(frozen=True)
class StorageRecords:
    """What tier-2 alone records for one container (:func:`read_records`)."""

    layouts: dict[str, SegmentLayout]
    """Every recorded layout by segment name: the journal's (the
    container-metadata segments) and the flushed storage-metadata table's."""
    owners: dict[str, int]
    """For the table's layouts: the id of the segment each belongs to (an
    ``$attributes``/``$index`` layout: its data segment's)."""
    types: dict[str, int]
    """For the table's layouts: that segment's ``SegmentType`` (0: not known)."""


async def read_records(storage: ChunkStorage, container_id: int) -> StorageRecords:
    """The records tier-2 holds for container ``container_id``.  If a chunk
    vanishes under the reader (a running writer replaced it and recorded
    that), the journal is read again."""
    for _attempt in range(_JOURNAL_READ_ATTEMPTS):
        try:
            return await _read_records_once(storage, container_id)
        except SegmentTruncatedError:
            continue
    raise SegmentStoreError(f"container {container_id}: its storage metadata kept vanishing "
                            f"({_JOURNAL_READ_ATTEMPTS} attempts)")


async def _read_records(storage: ChunkStorage, container_id: int
                        ) -> tuple[dict[str, SegmentLayout], dict[str, int]]:
    records = await read_records(storage, container_id)
    return records.layouts, records.owners


async def _read_records_once(storage: ChunkStorage, container_id: int) -> StorageRecords:
    snapshot = await read_journal(storage, container_id)
    if snapshot is None:
        return StorageRecords({}, {}, {})
    layouts = {layout.segment: layout for layout in snapshot.layouts}
    table = layouts.get(storage_metadata_name(container_id))
    found: dict[str, SegmentLayout] = {}
    owners: dict[str, int] = {}
    types: dict[str, int] = {}
    if table is not None and table.length > table.start_offset:
        data = await read_segment(storage, table, table.start_offset,
                                  table.length - table.start_offset)
        for _version, key, value, _end in decode_entries(data, table.start_offset):
            name = key.decode()
            if value is None:
                found.pop(name, None)
                owners.pop(name, None)
                types.pop(name, None)
            else:
                owners[name], types[name], found[name] = decode_typed_layout_record(value)
    found.update(layouts)
    return StorageRecords(found, owners, types)


async def read_storage_metadata(storage: ChunkStorage, container_id: int
                                ) -> dict[str, SegmentLayout]:
    """Every layout tier-2 holds for container ``container_id``: its journal's
    (the metadata segments) and its flushed storage-metadata table's."""
    return (await _read_records(storage, container_id))[0]


async def read_layout(storage: ChunkStorage, segment: str,
                      container_id: int | None = None) -> SegmentLayout | None:
    """Segment ``segment``'s layout as tier-2 alone records it (None if no
    container records it).  Reads every container's journal unless
    ``container_id`` is given.  A chunk of it that has vanished since (a
    later truncate or delete) reads as truncation: ``read_segment`` raises
    :class:`~quire.errors.SegmentTruncatedError`, never wrong bytes."""
    ids = [container_id] if container_id is not None else await journal_containers(storage)
    for cid in ids:
        layout = (await read_storage_metadata(storage, cid)).get(segment)
        if layout is not None:
            return layout
    return None
