"""When a segment's bytes were appended: Quire's own requests to a segment store.

Pravega's ``SegmentRead`` carries no time; a Quire segment store stamps
every append with its clock and answers two requests of its own
(:mod:`quire.pravega_wire`): :func:`append_times` (``(offset, time_ms)``
entries for a byte range, from memory for bytes not yet flushed and from
the tier-2 chunks' sidecars for the rest) and :func:`locate_append_time`
(where the first append at or after a time starts: a binary search over
the sidecars, no bytes read).
"""

from __future__ import annotations

from quire.pravega_wire import (
    AppendTimeLocated,
    AppendTimesRead,
    LocateAppendTime,
    ReadAppendTimes,
)
from quire.streams.refusals import expect
from quire.streams.segments import RemoteSegmentStore

NO_TIME = -1
"""The time of bytes whose append time is not known."""


async def append_times(segments: RemoteSegmentStore, name: str, start: int, end: int
                       ) -> tuple[int, list[tuple[int, int]]]:
    """When segment ``name``'s bytes ``start .. end`` were appended:
    ``(offset, time_ms)`` entries, bytes from each offset up to the next at
    that time (the first at ``start``; time :data:`NO_TIME`: not known), and
    how much of the segment tier-2 holds."""
    reply = expect(await segments.request(
        name, lambda r, t: ReadAppendTimes(r, name, start, end, t)), AppendTimesRead, name)
    return reply.storage_length, list(zip(reply.offsets, reply.times, strict=True))


async def locate_append_time(segments: RemoteSegmentStore, name: str, time_ms: int) -> int:
    """Where segment ``name``'s first append at or after ``time_ms`` starts
    (an event boundary), or its length if nothing was appended since."""
    reply = expect(await segments.request(
        name, lambda r, t: LocateAppendTime(r, name, time_ms, t)), AppendTimeLocated, name)
    return int(reply.offset)
