"""When each byte of a segment was appended: a container's append-time index.

Every append is stamped with the container's clock (``AppendOp.timestamp_ms``,
the segment's ``last_modified_ms``); :class:`AppendTimes` keeps, per segment,
the step function *offset -> append time* those stamps draw: entries
``(offset, time_ms)`` sorted by offset, each saying "the bytes from here on,
up to the next entry, were appended at ``time_ms``".  An entry is added only
when the time changes, so appends that share a millisecond share an entry
(an append is a block of whole events, so every entry's offset is an event
boundary of an event stream), and times never go back: a clock that steps
back repeats the last time.  The container stamps its operations so, across
owners too (``ContainerUpkeep._stamp``), so an index rebuilt from any part of
the log agrees with the one kept as it was written.  A merge's bytes are
stamped with the merge's time (a transaction's events were appended to the
stream when it committed).

The committed side keeps one (:attr:`CommittedSide.append_times`) in step
with the committed state:

* the append hot path (``commit_frame``) calls :meth:`note` only when an
  append's time differs from its segment's ``last_modified_ms``: one
  comparison per append, no allocation (the entries are ``array('q')``);
* every other operation goes through :meth:`apply`, which notes its time at
  the segment's length, so the newest entry's time is always the segment's
  ``last_modified_ms`` (what makes the hot path's comparison exact);
* :meth:`flushed` forgets the entries below what tier-2 holds (the storage
  writer wrote them into the chunks' sidecars first:
  :mod:`~quire.segmentstore.chunk_sidecars`), keeping the one in effect
  there; truncation and deletion forget theirs.

Table segments are not indexed (their appends are table updates, not events).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Mapping
from typing import Protocol

from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.operations import (
    AppendOp,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    ProbeOp,
    SealOp,
    SegmentMapOp,
    TruncateOp,
)
from quire.segmentstore.types import SegmentType

TimeEntries = list[tuple[int, int]]
"""``(offset, time_ms)`` pairs, offsets increasing, times not decreasing."""
NO_TIME = -1
"""The time of bytes whose append time is not known (the wire's ``NO_APPEND_TIME``)."""


class _Steps:
    """One segment's entries."""

    __slots__ = ("offsets", "times")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.times = array("q")


class AppendTimes:
    """Per segment, when its bytes were appended (see the module docstring)."""

    def __init__(self) -> None:
        self._segments: dict[int, _Steps] = {}

    def note(self, segment_id: int, offset: int, time_ms: int) -> None:
        """Bytes of segment ``segment_id`` from ``offset`` on were appended at
        ``time_ms`` (a time at or below the newest entry's adds nothing)."""
        steps = self._segments.get(segment_id)
        if steps is None:
            steps = self._segments[segment_id] = _Steps()
        times = steps.times
        if times:
            if time_ms <= times[-1]:
                return
            if steps.offsets[-1] == offset:  # nothing was appended at the older time
                times[-1] = time_ms
                return
        steps.offsets.append(offset)
        times.append(time_ms)

    def apply(self, op: Operation, segments: Mapping[int, SegmentMetadata]) -> None:
        """Follow a committed operation other than a packed append
        (``segments``: the committed ones, after it)."""
        if isinstance(op, CheckpointOp | SealOp | ProbeOp):
            return
        s = segments.get(op.target_id if isinstance(op, MergeOp) else op.segment_id)
        if s is None or s.type is SegmentType.TABLE:
            return
        if type(op) is AppendOp:
            self.note(op.segment_id, op.offset, op.timestamp_ms)
        elif isinstance(op, MergeOp):
            self.note(op.target_id, op.target_offset, op.timestamp_ms)
            self._segments.pop(op.source_id, None)
        elif isinstance(op, DeleteOp):
            self._segments.pop(op.segment_id, None)
        elif isinstance(op, TruncateOp):
            self.note(op.segment_id, s.length, op.timestamp_ms)
            self.forget_below(op.segment_id, op.start_offset)
        elif isinstance(op, SegmentMapOp | AttributesOp):
            self.note(s.segment_id, s.length, op.timestamp_ms)

    def seed(self, segments: Iterable[SegmentMetadata]) -> None:
        """After a replay: each live segment with no entry gets one at its
        length and ``last_modified_ms`` (a restored segment no replayed
        operation touched)."""
        for s in segments:
            if not s.deleted and s.type is not SegmentType.TABLE \
                    and s.segment_id not in self._segments:
                self.note(s.segment_id, s.length, s.last_modified_ms)

    def forget_below(self, segment_id: int, offset: int) -> None:
        """Forget the entries below ``offset`` but the one in effect there."""
        steps = self._segments.get(segment_id)
        if steps is None:
            return
        keep = bisect.bisect_right(steps.offsets, offset) - 1
        if keep > 0:
            del steps.offsets[:keep]
            del steps.times[:keep]

    flushed = forget_below
    """Tier-2 holds the segment below ``offset`` (its sidecars hold those times)."""

    def between(self, segment_id: int, start: int, end: int) -> TimeEntries:
        """The entries for bytes ``start .. end``: the one in effect at
        ``start`` (its offset raised to ``start``; left out if no entry is
        at or below ``start``: those times are in tier-2) and those after."""
        steps = self._segments.get(segment_id)
        if steps is None or start >= end:
            return []
        offsets, times = steps.offsets, steps.times
        first = bisect.bisect_right(offsets, start) - 1
        found: TimeEntries = []
        if first >= 0:
            found.append((start, times[first]))
        stop = bisect.bisect_left(offsets, end)
        found += zip(offsets[first + 1:stop], times[first + 1:stop], strict=True)
        return found

    def first(self, segment_id: int) -> tuple[int, int] | None:
        """The oldest entry kept, or None."""
        steps = self._segments.get(segment_id)
        if steps is None or not steps.offsets:
            return None
        return steps.offsets[0], steps.times[0]

    def locate(self, segment_id: int, time_ms: int) -> int | None:
        """The offset of the first entry at or after ``time_ms`` (None if
        every entry kept is older)."""
        steps = self._segments.get(segment_id)
        if steps is None:
            return None
        at = bisect.bisect_left(steps.times, time_ms)
        return steps.offsets[at] if at < len(steps.offsets) else None

    def entry_count(self) -> int:
        """Entries kept, over all segments (for tests and metrics)."""
        return sum(len(s.offsets) for s in self._segments.values())


class Tier2Times(Protocol):
    """Append times of bytes tier-2 holds (read from their chunks' sidecars:
    :class:`~quire.segmentstore.tier2_reader.Tier2Reader` is one)."""

    async def times(self, segment_id: int, name: str, start: int, end: int) -> TimeEntries:
        """The entries of the segment's bytes ``start .. end`` that tier-2
        holds (the first at ``start``); empty if it holds none of them."""
        ...

    async def locate(self, segment_id: int, name: str, time_ms: int) -> int | None:
        """The first append at or after ``time_ms`` among the bytes tier-2
        holds, None if none is (or they are not known)."""
        ...


async def segment_times(index: AppendTimes, tier2: Tier2Times | None, s: SegmentMetadata,
                        start: int, end: int) -> TimeEntries:
    """When segment ``s``'s bytes ``start .. end`` were appended: the
    entries the index keeps, those below them from tier-2 (``-1``: not known).
    The first entry is at ``start``."""
    start = max(start, s.start_offset)
    end = min(end, s.length)
    if start >= end:
        return []
    kept = index.first(s.segment_id)
    entries = index.between(s.segment_id, start, end)
    older_end = end if kept is None else min(end, kept[0])
    if start >= older_end:
        return entries
    older: TimeEntries = []
    if tier2 is not None:
        older = [(o, t) for o, t in await tier2.times(s.segment_id, s.name, start, older_end)
                 if o < older_end]
    if not older or older[0][0] != start:
        older.insert(0, (start, NO_TIME))
    return older + [(o, t) for o, t in entries if o >= older_end]


async def locate_time(index: AppendTimes, tier2: Tier2Times | None, s: SegmentMetadata,
                      time_ms: int) -> int:
    """Where segment ``s``'s first append at or after ``time_ms`` starts
    (its length if there is none; never below its start)."""
    kept = index.first(s.segment_id)
    found: int | None = None
    if tier2 is not None and (kept is None or kept[1] >= time_ms):
        found = await tier2.locate(s.segment_id, s.name, time_ms)
    if found is None:
        found = index.locate(s.segment_id, time_ms)
    return min(s.length, max(s.start_offset, s.length if found is None else found))
