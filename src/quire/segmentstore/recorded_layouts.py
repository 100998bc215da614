"""What a storage writer records of tier-2: its layouts, and the system journal.

:class:`RecordedLayouts` is the writer's map of tier-2 (every segment's
layout as recorded or about to be) and what changing it implies: a changed
layout of a user or system segment is put in the storage-metadata table
(:meth:`RecordedLayouts.take_unrecorded`), one of a container-metadata
segment goes in the next system-journal snapshot (:attr:`journal_dirty`),
and the chunks a layout no longer names are deleted an iteration later
(:attr:`dropped`).  :class:`SystemJournal` writes those snapshots.  The
formats are :mod:`~quire.segmentstore.storage_records`'s; reading them back
is :mod:`~quire.segmentstore.tier2_reader`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from quire.segmentstore.metadata import SegmentMetadata
from quire.segmentstore.names import SYSTEM_SCOPE, base_segment_name
from quire.segmentstore.storage_records import (
    JournalSnapshot,
    decode_layout_record,
    encode_journal,
    encode_layout_record,
)
from quire.segmentstore.tier2_reader import journal_name, storage_metadata_name
from quire.tier2 import ChunkNamer, ChunkStorage, SegmentLayout, parse_chunk_name

USER, SYSTEM, METADATA = 0, 1, 2
"""Flush priority buckets, flushed in this order."""
BUCKET_NAMES = ("user", "system", "container metadata")
TableEntries = list[tuple[bytes, bytes, int | None]]
"""Entries of a ``table_put``: (key, value, expected version)."""


def bucket_of(name: str, container_id: int) -> int:
    """The priority bucket of segment ``name`` (an ``$attributes``/``$index``
    segment and a transaction go with their base segment)."""
    base = base_segment_name(name)
    if base == storage_metadata_name(container_id):
        return METADATA
    if base.startswith(SYSTEM_SCOPE + "/"):
        return SYSTEM
    return USER


class RecordedLayouts:
    """The layout of every tier-2 segment of container ``container_id`` as
    its writer recorded it (or is about to, see the module docstring)."""

    def __init__(self, container_id: int) -> None:
        self.container_id = container_id
        self.layouts: dict[str, SegmentLayout] = {}
        """Segment name -> its recorded layout."""
        self.owners: dict[str, int] = {}
        """Segment name -> the id of the segment whose layout :attr:`layouts` holds."""
        self.unrecorded: dict[str, SegmentLayout] = {}
        """Layouts changed and not yet put in the storage-metadata table."""
        self.journal_dirty = False
        """A container-metadata layout changed since the last journal snapshot."""
        self.dropped: list[str] = []
        """Chunks no recorded layout names any more; deleted next iteration."""

    def load(self, table: Mapping[bytes, tuple[int, bytes]],
             journal: JournalSnapshot | None, metadata_segment_id: int) -> None:
        """Take the layouts recorded before: the storage-metadata table's
        ``table`` (tier-1's) and the ``journal``'s (tier-2's), whose
        segments are the storage-metadata segment ``metadata_segment_id``'s."""
        for key, (_version, value) in table.items():
            owner, layout = decode_layout_record(value)
            self.layouts[key.decode()] = layout
            self.owners[key.decode()] = owner
        if journal is not None:
            for layout in journal.layouts:
                self.layouts[layout.segment] = layout
                self.owners[layout.segment] = metadata_segment_id

    def current(self, name: str, segment_id: int) -> SegmentLayout | None:
        """Segment ``segment_id``'s recorded layout under ``name`` (None if
        the recorded one is another segment's, deleted since, of that name)."""
        layout = self.layouts.get(name)
        return layout if layout is not None and self.owners[name] == segment_id else None

    def live(self, name: str, segment_id: int) -> bool:
        """Whether segment ``segment_id`` has a layout under ``name`` not yet deleted."""
        layout = self.layouts.get(name)
        return layout is not None and not layout.deleted and self.owners[name] == segment_id

    def layout_for(self, name: str, segment_id: int) -> SegmentLayout:
        """The layout to grow for segment ``segment_id``: its own, or a new one
        (the chunks of an earlier segment of that name, not yet deleted, are
        dropped: the new layout replaces its record)."""
        layout = self.current(name, segment_id)
        if layout is not None:
            return layout
        previous = self.layouts.get(name)
        if previous is not None:
            self.dropped += [c.name for c in previous.chunks]
        return SegmentLayout(name)

    def set(self, layout: SegmentLayout, segment_id: int) -> None:
        """Record ``layout`` as segment ``segment_id``'s."""
        if self.layouts.get(layout.segment) == layout \
                and self.owners[layout.segment] == segment_id:
            return
        self.layouts[layout.segment] = layout
        self.owners[layout.segment] = segment_id
        if bucket_of(layout.segment, self.container_id) == METADATA:
            self.journal_dirty = True
        else:
            self.unrecorded[layout.segment] = layout

    def delete(self, name: str, segment_id: int) -> None:
        """Record segment ``segment_id``'s layout under ``name`` as deleted
        (its chunks dropped), if it has one."""
        layout = self.current(name, segment_id)
        if layout is not None and not layout.deleted:
            gone, dropped = layout.with_deleted()
            self.set(gone, segment_id)
            self.dropped += dropped

    def take_dropped(self) -> list[str]:
        """The dropped chunks, forgotten here (the caller deletes them)."""
        dropped, self.dropped = self.dropped, []
        return dropped

    def take_unrecorded(self, segments: Mapping[int, SegmentMetadata]) -> TableEntries:
        """The storage-metadata table's entries for the changed layouts
        (``segments``: the committed segments, for each one's type),
        forgotten here (the caller puts them)."""
        entries: TableEntries = []
        for name, layout in self.unrecorded.items():
            owner = segments.get(self.owners[name])
            entries.append((name.encode(), encode_layout_record(
                self.owners[name], layout, 0 if owner is None else int(owner.type)), None))
        self.unrecorded = {}
        return entries

    def metadata_layouts(self) -> tuple[SegmentLayout, ...]:
        """The container-metadata segments' layouts, by name (a journal snapshot's)."""
        return tuple(layout for name, layout in sorted(self.layouts.items())
                     if bucket_of(name, self.container_id) == METADATA)


class SystemJournal:
    """Container ``container_id``'s system-journal snapshots in tier-2,
    written by the owner of tier-1 epoch ``epoch``: each snapshot a new
    chunk, the one before it deleted once it is written."""

    def __init__(self, storage: ChunkStorage, container_id: int, epoch: int) -> None:
        self._storage = storage
        self._container_id = container_id
        self._epoch = epoch
        self._namer = ChunkNamer(epoch)
        self._chunk: str | None = None
        self._previous: str | None = None

    async def write(self, layouts: tuple[SegmentLayout, ...]) -> int:
        """Write a snapshot of ``layouts`` as a new chunk (durable on return);
        its size in bytes."""
        cid = self._container_id
        data = encode_journal(JournalSnapshot(cid, self._epoch, layouts))
        chunk = self._namer.next_name(journal_name(cid))
        await self._storage.write_chunk(chunk, data)
        self._previous, self._chunk = self._chunk, chunk
        return len(data)

    async def delete_stale(self) -> int:
        """Delete the snapshots the last :meth:`write` replaced (after this
        owner's first: every older owner's); how many."""
        storage, chunk = self._storage, self._chunk
        if self._previous is None:  # this owner's first: older owners' snapshots are stale
            stale = [info.name for info in await storage.list_chunks(
                journal_name(self._container_id) + ".E") if info.name != chunk
                and parse_chunk_name(info.name)[1] < self._epoch]
        else:
            stale = [self._previous]
        for name in stale:
            await storage.delete(name)
        return len(stale)
