"""What a storage writer sees of its container: the :class:`WriterSource` seam.

The storage writer (:mod:`~quire.segmentstore.storage_writer`) flushes one
container's committed segments to tier-2.  Everything it needs of the
container goes through a :class:`WriterSource` (Pravega's
``WriterDataSource`` plays this part): :class:`ContainerWriterSource` is the
one over a live :class:`~quire.segmentstore.container.SegmentContainer`,
:class:`quire.testing.memory_writer_source.MemoryWriterSource` its
in-memory twin for tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.types import SegmentType

if TYPE_CHECKING:  # the adapter only holds a container: importing one is the caller's
    from quire.segmentstore.append_times import Tier2Times, TimeEntries
    from quire.segmentstore.committed_side import CommittedSide, Tier2Read
    from quire.segmentstore.container import SegmentContainer

Merge = tuple[int, int, int, int]
"""A committed merge: (target id, source id, offset in the target, length)."""
_NO_ENTRIES: Mapping[bytes, tuple[int, bytes]] = {}


class WriterSource(Protocol):
    """A container as its storage writer sees it.

    **The committed state.**  :attr:`segments` and :meth:`segment` show the
    container's *committed* segments (operations whose tier-1 frame is
    durable), live: each call sees the state of that instant, and nothing
    changes between two calls without an ``await`` between them (one event
    loop).  The writer only reads them, except through :meth:`flushed`.  A
    deleted segment stays in :attr:`segments` (``deleted`` true) so that the
    writer can delete its tier-2 chunks; it is no longer found by name.
    :meth:`table_entries` is a table segment's committed index, in step with
    its ``length``.  :meth:`take_merges` hands over each merge committed
    since :meth:`read_from_tier2` exactly once, in commit order.

    **Bytes.**  :meth:`read` returns committed bytes of a segment from
    memory, tier-1, or tier-2 through the reader given to
    :meth:`read_from_tier2`.  :meth:`append_times` says when committed
    bytes not yet flushed were appended (for the chunks' sidecars); the
    times of flushed ones it answers through :meth:`times_from_tier2`'s.

    **Recording.**  :meth:`create_segment`, :meth:`table_put` and
    :meth:`table_remove` are the container's own requests (their futures
    fail with the container's typed errors:
    :class:`~quire.errors.ContainerFencedError` once another owner took the
    log, and so on); the writer keeps its storage-metadata table with them.
    :meth:`add_checkpoint` and :meth:`truncate_log` cut tier-1 below what
    tier-2 holds; :meth:`forget` lets the container drop deleted segments
    tier-2 no longer records.

    **Ownership and pressure.**  :attr:`failure` says why the container
    stopped serving (another owner took it, it failed, it was closed): the
    writer stops then, and retries every other failure.
    :meth:`tier1_pressure` says the tier-1 log is near its ceiling (flush
    everything now).  :meth:`quarantine` sets a segment aside
    (:mod:`~quire.segmentstore.quarantine`).

    Every error is a :class:`~quire.errors.QuireError`.
    """

    @property
    def container_id(self) -> int:
        """The container's id."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch the container took on its tier-1 log (names the writer's chunks)."""
        ...

    def now_ms(self) -> int:
        """The container's clock, in milliseconds."""
        ...

    @property
    def failure(self) -> BaseException | None:
        """Why the container stopped serving, or None while it serves."""
        ...

    def tier1_pressure(self) -> bool:
        """Whether the container's tier-1 log holds so much that every
        unflushed byte should go to tier-2 now (so it can be truncated)."""
        ...

    @property
    def segments(self) -> Mapping[int, SegmentMetadata]:
        """Every committed segment by id, deleted ones included (read only)."""
        ...

    def segment(self, name: str) -> SegmentMetadata | None:
        """The live committed segment called ``name``, or None."""
        ...

    def table_entries(self, segment_id: int) -> Mapping[bytes, tuple[int, bytes]]:
        """Table segment ``segment_id``'s committed index: key -> (version,
        value); empty for a table with no entries (read only)."""
        ...

    def take_merges(self) -> Sequence[Merge]:
        """The merges committed since the last call (none before
        :meth:`read_from_tier2`), oldest first."""
        ...

    async def read(self, segment_id: int, offset: int, length: int) -> bytes:
        """Up to ``length`` committed bytes of the segment from ``offset``
        (the caller knows they exist); fewer, or b"", only where the segment
        was truncated or deleted meanwhile."""
        ...

    def flushed(self, segment_id: int, length: int) -> None:
        """Tier-2 holds the segment's bytes below ``length`` now: its
        ``storage_length`` says so, and memory may let them go."""
        ...

    def read_from_tier2(self, read: Tier2Read) -> None:
        """From now on, read what neither memory nor tier-1 holds through ``read``."""
        ...

    def append_times(self, segment_id: int, start: int, end: int) -> TimeEntries:
        """When the segment's committed bytes ``start .. end`` (not yet
        flushed: :meth:`flushed` forgets theirs) were appended: ``(offset,
        time_ms)`` entries, the first at ``start`` unless not known
        (:meth:`~quire.segmentstore.append_times.AppendTimes.between`)."""
        ...

    def times_from_tier2(self, times: Tier2Times) -> None:
        """From now on, answer when flushed bytes were appended through ``times``."""
        ...

    def create_segment(self, name: str, segment_type: SegmentType) -> Awaitable[None]:
        """Create a segment (the container's request: it fails if the name is taken)."""
        ...

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> Awaitable[list[int]]:
        """Put entries in table segment ``name`` (the container's request);
        its result is each entry's new version, once durable in tier-1."""
        ...

    def table_remove(self, name: str, keys: Sequence[tuple[bytes, int | None]]
                     ) -> Awaitable[None]:
        """Remove keys from table segment ``name`` (the container's request)."""
        ...

    def quarantine(self, name: str) -> Awaitable[None]:
        """Mark segment ``name`` quarantined and seal it (the container's
        request; durable once done): its appends are refused from then on."""
        ...

    def forget(self, segment_ids: Sequence[int]) -> None:
        """These deleted segments are gone from tier-2 and its records: the
        container may drop them from its metadata (at its next checkpoint)."""
        ...

    def add_checkpoint(self) -> Awaitable[object] | None:
        """Write a checkpoint of the accepted state to tier-1 now; what to
        await for it to be durable, or None if nothing needs one (nothing
        logged since the last) or it is durable already."""
        ...

    async def truncate_log(self, in_tier2: Callable[[int, int], bool]) -> int | None:
        """Cut tier-1 below the newest durable checkpoint whose every
        segment length ``(segment_id, length)`` is ``in_tier2``; that
        checkpoint's sequence, or None if none qualifies (nothing is cut)."""
        ...


class ContainerWriterSource:
    """The :class:`WriterSource` of a live container: its committed side
    (:class:`~quire.segmentstore.committed_side.CommittedSide`) and its
    table indexes for the committed state, its requests for the rest."""

    def __init__(self, container: SegmentContainer) -> None:
        self._container = container
        self._committed: CommittedSide = container.committed_side

    @property
    def container_id(self) -> int:
        return self._container.container_id

    @property
    def epoch(self) -> int:
        return self._container.epoch

    def now_ms(self) -> int:
        return self._container.clock_ms()

    @property
    def failure(self) -> BaseException | None:
        return self._container.failure

    def tier1_pressure(self) -> bool:
        return self._container.throttle.pressure

    @property
    def segments(self) -> Mapping[int, SegmentMetadata]:
        return self._committed.metadata.segments

    def segment(self, name: str) -> SegmentMetadata | None:
        return self._committed.metadata.get(name)

    def table_entries(self, segment_id: int) -> Mapping[bytes, tuple[int, bytes]]:
        table = self._container.tables.committed.get(segment_id)
        return _NO_ENTRIES if table is None else table.entries

    def take_merges(self) -> Sequence[Merge]:
        merges = self._committed.merges
        if not merges:
            return ()  # (asked once per segment flushed)
        taken = list(merges)
        merges.clear()
        return taken

    async def read(self, segment_id: int, offset: int, length: int) -> bytes:
        return await self._committed.read_index.read(segment_id, offset, length)

    def flushed(self, segment_id: int, length: int) -> None:
        self._committed.flushed(segment_id, length)

    def read_from_tier2(self, read: Tier2Read) -> None:
        self._committed.read_from_tier2(read)

    def append_times(self, segment_id: int, start: int, end: int) -> TimeEntries:
        return self._committed.append_times.between(segment_id, start, end)

    def times_from_tier2(self, times: Tier2Times) -> None:
        self._committed.tier2_times = times

    def create_segment(self, name: str, segment_type: SegmentType) -> Awaitable[None]:
        return self._container.create_segment(name, segment_type)

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> Awaitable[list[int]]:
        return self._container.tables.put(name, entries)

    def table_remove(self, name: str, keys: Sequence[tuple[bytes, int | None]]
                     ) -> Awaitable[None]:
        return self._container.tables.remove(name, keys)

    def quarantine(self, name: str) -> Awaitable[None]:
        return self._container.quarantine(name)

    def forget(self, segment_ids: Sequence[int]) -> None:
        self._container.forget(segment_ids)

    def add_checkpoint(self) -> Awaitable[object] | None:
        return self._container.add_checkpoint()

    async def truncate_log(self, in_tier2: Callable[[int, int], bool]) -> int | None:
        return await self._committed.truncate_log(in_tier2)
