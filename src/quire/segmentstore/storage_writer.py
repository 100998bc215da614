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

**Failures.**  :meth:`StorageWriter.run` never gives up while the
container is owned: a failed iteration is tried again after a capped
exponential backoff, each failure logged once per cause and counted
(:mod:`~quire.segmentstore.flush_health`); what a failed attempt wrote
and no recorded layout names is deleted later, and what it meant to drop
stays until a layout without it is recorded.  A user segment tier-2 keeps
refusing is quarantined (:mod:`~quire.segmentstore.quarantine`).  Under
the container's tier-1 pressure every unflushed byte is flushed at once.

**Bounded records.**  An ``$index`` or ``$attributes`` segment grown past
twice a whole batch of its values (and :data:`SNAPSHOT_MIN_BYTES`) gets a
whole batch and is truncated before it; a deleted segment's records leave
the storage-metadata table once tier-2 holds the deletion, and then the
container forgets the segment; small trailing chunks are merged
(:func:`~quire.segmentstore.flush_plan.merge_start`).

A writer that breaks PDP-40's order on purpose, to show that ``quire tier2
check`` catches it, is a test's:
:class:`quire.testing.chaos_writer.ChaosStorageWriter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Self, TypeVar

from quire.errors import ConfigError, ContainerFencedError, SegmentStoreError, Tier2RefusedError
from quire.segmentstore.flush_health import FlushHealth, step_of
from quire.segmentstore.flush_plan import FlushPlanner
from quire.segmentstore.quarantine import Quarantined, QuarantineWatch, quarantine_path
from quire.segmentstore.recorded_layouts import (
    METADATA,
    SYSTEM,
    USER,
    RecordedLayouts,
    SystemJournal,
    bucket_of,
)
from quire.segmentstore.segment_flush import (
    SNAPSHOT_MIN_BYTES,
    IterationReport,
    SegmentFlushing,
    SegmentSnapshot,
    step,
)
from quire.segmentstore.sidecar_writer import SidecarWriter
from quire.segmentstore.tier2_reader import Tier2Reader, read_journal, storage_metadata_name
from quire.segmentstore.types import QUARANTINED_ATTRIBUTE, SegmentType
from quire.segmentstore.writer_source import WriterSource
from quire.tier2 import ChunkNamer, ChunkStorage
from quire.tier2.config import DEFAULT_MAX_CHUNK_BYTES

T = TypeVar("T")
_RECORDS_PER_PUT = 1000
"""Layouts per table_put (a put is one append: at most 16 MiB)."""
THRESHOLD_POLL_MS = 50
"""Between iterations, how often the background loop looks for a segment
well past ``flush_threshold_bytes`` (to start the next iteration early)."""
__all__ = ["SNAPSHOT_MIN_BYTES", "IterationReport", "SegmentSnapshot", "StorageWriter",
           "StorageWriterConfig"]
_SEGMENT_STEPS = ("data", "index", "attributes")


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
    retry_initial_ms: int = 100
    """After a failed iteration, the pause before the next attempt; doubling..."""
    retry_max_ms: int = 10_000
    """... up to this."""
    quarantine_after_refusals: int = 3
    """A user segment tier-2 refuses this many times in a row is quarantined."""

    def __post_init__(self) -> None:
        if self.flush_threshold_bytes <= 0 or self.flush_threshold_ms < 0 \
                or self.iteration_interval_ms <= 0 or self.flush_concurrency <= 0 \
                or self.retry_initial_ms <= 0 or self.retry_max_ms < self.retry_initial_ms \
                or self.quarantine_after_refusals <= 0:
            raise ConfigError("flush_threshold_bytes, iteration_interval_ms, "
                              "flush_concurrency, retry_initial_ms and "
                              "quarantine_after_refusals must be positive, flush_threshold_ms "
                              "not negative, retry_max_ms at least retry_initial_ms")


class StorageWriter(SegmentFlushing):
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
        self._stopping = False
        self.failure: BaseException | None = None
        """Why :meth:`run` stopped: the container stopped serving."""
        self.iterations = 0
        self.health = FlushHealth(cid, source.now_ms, config.retry_initial_ms,
                                  config.retry_max_ms)
        self.quarantine = QuarantineWatch(config.quarantine_after_refusals)
        self._written: dict[str, list[str]] = {}
        """Chunks written for a layout not set yet, by the layout's name."""

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
        journal = await read_journal(self.storage, source.container_id)
        if journal is not None and journal.epoch > source.epoch:
            # a newer owner took the container over while this one opened: its
            # layouts are not this writer's to replace (it would delete the
            # chunks they name), and nothing of tier-1 would stop it
            raise ContainerFencedError(
                f"container {source.container_id}: tier-2's journal is owner epoch "
                f"{journal.epoch}'s, newer than this owner's {source.epoch}")
        self.recorded.load(source.table_entries(s.segment_id), journal, s.segment_id)
        for m in source.segments.values():
            found = self.layouts.get(m.name)
            if found is not None and not m.deleted and self.owners[m.name] == m.segment_id:
                source.flushed(m.segment_id, found.length)
            since = m.attributes.get(QUARANTINED_ATTRIBUTE)
            if since is not None and not m.deleted:
                self.quarantine.add(Quarantined(m.name, m.segment_id, since,
                                                "quarantined by an earlier owner"), quiet=True)

    def plan(self) -> list[list[int]]:
        """The eligible segments' ids per bucket (user, system, metadata), in
        flush order (by segment id within a bucket)."""
        # every merge committed until now first: a merge source deleted by a
        # merge the planner does not know yet would be forgettable, and its
        # container could purge it before the target's flush needs its name
        self._take_merges()
        config = self.config
        return self._planner.plan(self.source.segments, config.flush_threshold_bytes,
                                  config.flush_threshold_ms, self.source.now_ms(),
                                  self.source.tier1_pressure())

    # --- one iteration ------------------------------------------------------------

    async def flush_once(self) -> IterationReport:
        """Run one flush iteration (see the module docstring)."""
        report = IterationReport()
        deletable = self.recorded.take_deletable()
        try:
            with step("delete", ""):
                await self._concurrently(deletable, self.sidecars.delete_chunk)
        except BaseException:
            self.recorded.orphan(deletable)  # deleted again (a delete is idempotent)
            raise
        report.chunks_deleted += len(deletable)
        plan = self.plan()
        if self._planner.forgettable:
            self.source.forget(self._planner.forgettable)
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
        with step("tier-1 truncation", ""):
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

    async def _record(self) -> None:
        """Put the changed layouts in the storage-metadata table (tier-1), and
        remove the keys of deleted ones tier-2 holds as deleted."""
        recorded = self.recorded
        entries, put = recorded.unrecorded_entries(self.source.segments)
        if entries:
            puts = [self.source.table_put(self.metadata_segment,
                                          entries[at:at + _RECORDS_PER_PUT])
                    for at in range(0, len(entries), _RECORDS_PER_PUT)]
            for result in await asyncio.gather(*puts, return_exceptions=True):
                if isinstance(result, BaseException):
                    raise result
            recorded.recorded(put)
        gone = [name for name in recorded.removable() if name not in put]
        if gone:
            await self.source.table_remove(self.metadata_segment,
                                           [(name.encode(), None) for name in gone])
            recorded.removed(gone)

    async def _flush_metadata(self, report: IterationReport) -> None:
        """The container-metadata bucket, last: record, flush, journal; then
        what the iteration dropped may go."""
        with step("record", self.metadata_segment):
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
            with step("journal", self.metadata_segment):
                report.bytes_written += await self._journal.write(
                    self.recorded.metadata_layouts())
            report.chunks_written += 1
            self.recorded.journal_dirty = False
            with step("journal", self.metadata_segment):
                report.chunks_deleted += await self._journal.delete_stale()
        self.recorded.release()

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

    def stop(self) -> None:
        """End :meth:`run` within :data:`THRESHOLD_POLL_MS` of its next wait,
        even if the cancellation that goes with this is lost (Python 3.11's
        ``asyncio.wait_for`` returns its inner result when the two race: the
        wake-up of :meth:`_until_next_iteration` and the container's stop)."""
        self._stopping = True

    def threshold_overrun(self) -> bool:
        """Whether a live user segment has half as much again as
        ``flush_threshold_bytes`` unflushed (a scan of the committed
        segments: about 0.1 us each), or tier-1 is under pressure."""
        threshold = self.config.flush_threshold_bytes * 3 // 2
        cid = self.source.container_id
        for s in self.source.segments.values():
            if s.length - max(s.storage_length, s.start_offset) >= threshold \
                    and not s.deleted and bucket_of(s.name, cid) == USER:
                return True
        return self.source.tier1_pressure() and self.backlog_bytes() > 0

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
        while not self._stopping and (remaining := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(),
                                       min(remaining, THRESHOLD_POLL_MS / 1000))
            if self._wake.is_set() or self.threshold_overrun():
                break
        self._wake.clear()

    async def run(self) -> None:
        """Flush iterations every ``iteration_interval_ms``, or sooner once a
        segment is well past the size threshold, until cancelled or the
        container stops serving (:attr:`failure`).  A failed iteration is
        tried again after a backoff (see the module docstring)."""
        while not self._stopping:
            try:
                await self.flush_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                gone = self.source.failure
                if gone is not None:  # not ours any more: the owner's business
                    self.failure = gone
                    return
                pause_s = self.health.failed(e)
                await self._consider_quarantine(e)
                await asyncio.sleep(pause_s)  # the backoff before trying again
                continue
            self.health.recovered()
            await self._until_next_iteration()

    async def _consider_quarantine(self, error: Exception) -> None:
        """Quarantine the user segment ``error`` refused, once it is due and a
        probe chunk under its quarantine path is accepted."""
        step, name = step_of(error)
        if not isinstance(error, Tier2RefusedError) or step not in _SEGMENT_STEPS \
                or bucket_of(name, self.source.container_id) != USER:
            return
        s = self.source.segment(name)
        if s is None or not self.quarantine.refused(name):
            return
        probe = self._namer.next_name(quarantine_path(self.source.container_id,
                                                      s.segment_id) + "$probe")
        self.recorded.orphan([probe])  # deleted after the next recorded iteration
        try:
            await self.storage.write_chunk(probe, b"quarantine probe")
        except Exception as e:
            step_error = type(e).__name__
            self.quarantine.probe_failed(name, step_error)
            return
        await self.source.quarantine(name)
        self.quarantine.add(Quarantined(name, s.segment_id, self.source.now_ms(),
                                        f"{type(error).__name__}: {str(error)[:300]}"))
