"""Which segments a storage writer's flush iteration takes (PDP-40's eligibility).

A user segment is *eligible* when its unflushed bytes reach
``flush_threshold_bytes``, or its oldest unflushed change is
``flush_threshold_ms`` old, or its ``$attributes`` segment is eligible by
the same rules (requirement 3: both together), or it is empty and not
recorded yet (tier-2 records even an empty segment), or it was sealed,
truncated, deleted or merged into.  Every modified system segment
(``_system/...``, requirement 1) and container-metadata segment
(requirement 2) is eligible in every iteration.  Under *pressure* (the
container's tier-1 log near its ceiling) every user segment with
unflushed bytes is eligible, whatever its thresholds, so tier-1 can be
truncated.  A deleted segment none of whose layouts tier-2 still records
is *forgettable*: its container may drop it from its metadata.

**Merging small chunks** (:func:`merge_start`): a segment flushed a little
at a time gets a chunk per flush, and its layout (a table value) would
grow with every iteration.  Once a segment ends in :data:`MERGE_FANOUT`
*small* chunks (below :func:`small_chunk_bytes`), its longest trailing run
whose largest chunk is at most half of the run's bytes (and whose bytes
fit a chunk) is merged into one chunk.  A byte is copied only while its
chunk is small, and each copy at least doubles the chunk holding it, so a
segment flushed in pieces of ``small_chunk_bytes`` or more is never
copied (``benchmarks``' 256 KiB pieces: 1.0x), and one flushed in pieces
of ``f`` bytes is copied at most ``log2(small / f)`` times; a segment ends
in at most ``MERGE_FANOUT + log2(small)`` small chunks.  (The merge it
replaces joined every trailing run of 8 into one growing chunk, copying
it again and again up to ``max_chunk_bytes``: about 4x.)

:class:`FlushPlanner` keeps what that needs between iterations: when each
segment's changes were first seen unflushed, the values its ``$attributes``
and ``$index`` hold in tier-2, and the committed merges not yet in tier-2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.names import ATTRIBUTES_SUFFIX, INDEX_SUFFIX
from quire.segmentstore.recorded_layouts import USER, RecordedLayouts, bucket_of
from quire.segmentstore.writer_source import Merge
from quire.tier2 import ChunkRef

ATTRIBUTE_RECORD_BYTES = 24
"""What one changed attribute costs in its ``$attributes`` segment."""
MERGE_FANOUT = 8
"""Trailing small chunks a segment may end in before they are merged."""


def small_chunk_bytes(max_chunk_bytes: int) -> int:
    """Chunks below this are *small*: 1/64 of ``max_chunk_bytes`` (256 KiB of
    the default 16 MiB), and at least half a chunk or 4 KiB (tiny test
    chunks)."""
    return max(max_chunk_bytes // 64, min(max_chunk_bytes // 2, 4096))


def merge_start(chunks: Sequence[ChunkRef], max_chunk_bytes: int) -> int | None:
    """The index of the first of the trailing chunks to merge into one, or
    None (see the module docstring)."""
    small = small_chunk_bytes(max_chunk_bytes)
    first = len(chunks)
    while first > 0 and chunks[first - 1].length < small:
        first -= 1
    if len(chunks) - first < MERGE_FANOUT:
        return None
    total = largest = 0
    best = None
    for i in range(len(chunks) - 1, first - 1, -1):  # suffixes, shortest first
        total += chunks[i].length
        largest = max(largest, chunks[i].length)
        if total > max_chunk_bytes:
            break
        if i < len(chunks) - 1 and 2 * largest <= total:
            best = i
    return best


@dataclass
class Tracked:
    """What the writer remembers of one segment between iterations."""

    dirty_since_ms: int | None = None
    """When the writer first saw the segment's data or state unflushed."""
    attributes_dirty_since_ms: int | None = None
    flushed_attributes: dict[int, int] = field(default_factory=dict)
    """The values in tier-2's ``$attributes`` (empty after a reopen: all are written again)."""
    flushed_index: dict[bytes, int] = field(default_factory=dict)
    """Key -> version in tier-2's ``$index``."""


class FlushPlanner:
    """Plans a writer's iterations over the layouts ``recorded`` holds (see
    the module docstring)."""

    def __init__(self, recorded: RecordedLayouts) -> None:
        self.recorded = recorded
        self.tracked: dict[int, Tracked] = {}
        self.merges: dict[int, list[tuple[int, int, int]]] = {}
        """Target id -> its merges not yet in tier-2: (source id, offset, length)."""
        self.merge_sources: set[int] = set()
        """Merged sources whose tier-2 bytes their target's flush takes over."""
        self.forgettable: list[int] = []
        """Deleted segments the last plan found tier-2 records nothing of."""

    def take_merges(self, merges: Sequence[Merge]) -> None:
        """Remember newly committed merges until their targets are flushed."""
        for target_id, source_id, offset, length in merges:
            self.merges.setdefault(target_id, []).append((source_id, offset, length))
            self.merge_sources.add(source_id)

    def plan(self, segments: Mapping[int, SegmentMetadata], threshold_bytes: int,
             threshold_ms: int, now_ms: int, pressure: bool = False) -> list[list[int]]:
        """The eligible ones of the committed ``segments``: their ids per
        bucket (user, system, metadata), in flush order (by segment id
        within a bucket); ``pressure``: every user segment with unflushed
        bytes too.  :attr:`forgettable` is set too."""
        recorded = self.recorded
        cid = recorded.container_id
        tracked_segments = self.tracked
        buckets: list[list[int]] = [[], [], []]
        self.forgettable = []
        for sid, s in segments.items():
            bucket = bucket_of(s.name, cid)
            layout = recorded.current(s.name, sid)
            tracked = tracked_segments.get(sid)
            if s.deleted:
                if sid in self.merge_sources:
                    continue  # its target's flush takes its bytes over
                names = (s.name, s.name + ATTRIBUTES_SUFFIX, s.name + INDEX_SUFFIX)
                if any(recorded.live(n, sid) for n in names):
                    buckets[bucket].append(sid)
                else:
                    tracked_segments.pop(sid, None)
                    if sid not in self.merges and \
                            all(recorded.owners.get(n) != sid for n in names):
                        self.forgettable.append(sid)
                continue
            flushed = layout.length if layout is not None else 0
            start = layout.start_offset if layout is not None else 0
            # an empty segment tier-2 has no record of yet is recorded (empty):
            # recovery brings back what tier-2 records, and a stream's new
            # segments or a controller's tables may stay empty a long time
            state_changed = (layout is None and s.length == 0) or s.start_offset > start \
                or (s.sealed and not (
                layout is not None and layout.sealed)) or sid in self.merges
            if tracked is None:
                tracked = tracked_segments[sid] = Tracked()
            pending_attributes = sum(1 for k, v in s.attributes.items()
                                     if tracked.flushed_attributes.get(k) != v)
            unflushed = s.length - flushed
            if not (unflushed or state_changed or pending_attributes):
                tracked.dirty_since_ms = tracked.attributes_dirty_since_ms = None
                continue
            if (unflushed or state_changed) and tracked.dirty_since_ms is None:
                tracked.dirty_since_ms = now_ms
            if pending_attributes and tracked.attributes_dirty_since_ms is None:
                tracked.attributes_dirty_since_ms = now_ms
            if bucket != USER:
                buckets[bucket].append(sid)
                continue
            data_eligible = unflushed >= threshold_bytes or state_changed or (
                pressure and unflushed > 0) or (
                tracked.dirty_since_ms is not None
                and now_ms - tracked.dirty_since_ms >= threshold_ms)
            attributes_eligible = pending_attributes > 0 and (
                pending_attributes * ATTRIBUTE_RECORD_BYTES >= threshold_bytes
                or (tracked.attributes_dirty_since_ms is not None
                    and now_ms - tracked.attributes_dirty_since_ms >= threshold_ms))
            if data_eligible or attributes_eligible:
                buckets[USER].append(sid)
        return buckets
