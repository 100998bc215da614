"""Which segments a storage writer's flush iteration takes (PDP-40's eligibility).

A user segment is *eligible* when its unflushed bytes reach
``flush_threshold_bytes``, or its oldest unflushed change is
``flush_threshold_ms`` old, or its ``$attributes`` segment is eligible by
the same rules (requirement 3: both together), or it is empty and not
recorded yet (tier-2 records even an empty segment), or it was sealed,
truncated, deleted or merged into.  Every modified system segment
(``_system/...``, requirement 1) and container-metadata segment
(requirement 2) is eligible in every iteration.

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

ATTRIBUTE_RECORD_BYTES = 24
"""What one changed attribute costs in its ``$attributes`` segment."""


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

    def take_merges(self, merges: Sequence[Merge]) -> None:
        """Remember newly committed merges until their targets are flushed."""
        for target_id, source_id, offset, length in merges:
            self.merges.setdefault(target_id, []).append((source_id, offset, length))
            self.merge_sources.add(source_id)

    def plan(self, segments: Mapping[int, SegmentMetadata], threshold_bytes: int,
             threshold_ms: int, now_ms: int) -> list[list[int]]:
        """The eligible ones of the committed ``segments``: their ids per
        bucket (user, system, metadata), in flush order (by segment id
        within a bucket)."""
        recorded = self.recorded
        cid = recorded.container_id
        tracked_segments = self.tracked
        buckets: list[list[int]] = [[], [], []]
        for sid, s in segments.items():
            bucket = bucket_of(s.name, cid)
            layout = recorded.current(s.name, sid)
            tracked = tracked_segments.get(sid)
            if s.deleted:
                if sid in self.merge_sources:
                    continue  # its target's flush takes its bytes over
                if any(recorded.live(n, sid) for n in
                       (s.name, s.name + ATTRIBUTES_SUFFIX, s.name + INDEX_SUFFIX)):
                    buckets[bucket].append(sid)
                else:
                    tracked_segments.pop(sid, None)
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
                tracked.dirty_since_ms is not None
                and now_ms - tracked.dirty_since_ms >= threshold_ms)
            attributes_eligible = pending_attributes > 0 and (
                pending_attributes * ATTRIBUTE_RECORD_BYTES >= threshold_bytes
                or (tracked.attributes_dirty_since_ms is not None
                    and now_ms - tracked.attributes_dirty_since_ms >= threshold_ms))
            if data_eligible or attributes_eligible:
                buckets[USER].append(sid)
        return buckets
