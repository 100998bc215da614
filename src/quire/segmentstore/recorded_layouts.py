"""What a storage writer records of tier-2: its layouts, and the system journal.

:class:`RecordedLayouts` is the writer's map of tier-2 (every segment's
layout as recorded or about to be) and what changing it implies: a changed
layout of a user or system segment is put in the storage-metadata table
(:meth:`RecordedLayouts.unrecorded_entries`), one of a container-metadata
segment goes in the next system-journal snapshot (:attr:`journal_dirty`).

**Dropped chunks** go in three steps, so tier-2's records never name a
chunk that is gone, whatever fails when: a chunk a new layout will no
longer name waits with that layout's name (:meth:`drop_later`) until the
layout is set (:meth:`set`; an attempt that fails :meth:`abandon` s them,
its layout never set); then, once every layout set so far is recorded and
flushed to tier-2 (:meth:`release`, at the end of a metadata flush), it may
be deleted (:meth:`take_deletable`).  A chunk written that no layout ever
named (a write whose outcome is unknown, an attempt abandoned) is an
:meth:`orphan`: deleted after the next release too.

**Deleted layouts** stay recorded until their deletion is in tier-2; then
their keys are removed from the table (:meth:`removable`,
:meth:`removed`), so the table follows the live segments, not the history.
:class:`SystemJournal` writes the journal snapshots.  The formats are
:mod:`~quire.segmentstore.storage_records`'s; reading them back is
:mod:`~quire.segmentstore.tier2_reader`'s.
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
        self._pending: dict[str, list[str]] = {}
        """Chunks the next :meth:`set` of a name's layout drops."""
        self._dropped: list[str] = []
        """Chunks no layout set here names; deletable after the next :meth:`release`."""
        self._deletable: list[str] = []
        self._deleted: dict[str, int] = {}
        """Deleted layouts set (name -> owner), not yet released."""
        self._removable: dict[str, int] = {}
        """Deleted layouts recorded and flushed: their keys may leave the table."""

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
        dropped once the new layout is set: it replaces their record)."""
        layout = self.current(name, segment_id)
        if layout is not None:
            return layout
        previous = self.layouts.get(name)
        if previous is not None:
            self.drop_later(name, [c.name for c in previous.chunks])
        return SegmentLayout(name)

    def set(self, layout: SegmentLayout, segment_id: int) -> None:
        """Record ``layout`` as segment ``segment_id``'s; the chunks waiting on
        its name (:meth:`drop_later`) are dropped now."""
        name = layout.segment
        self._dropped += self._pending.pop(name, ())
        if self.layouts.get(name) == layout and self.owners[name] == segment_id:
            return
        self.layouts[name] = layout
        self.owners[name] = segment_id
        if layout.deleted:
            self._deleted[name] = segment_id
        else:
            self._deleted.pop(name, None)
            self._removable.pop(name, None)
        if bucket_of(name, self.container_id) == METADATA:
            self.journal_dirty = True
        else:
            self.unrecorded[name] = layout

    def drop_later(self, name: str, chunks: list[str]) -> None:
        """``chunks`` leave tier-2 once the next layout of ``name`` is set."""
        if chunks:
            self._pending.setdefault(name, []).extend(chunks)

    def abandon(self, name: str) -> None:
        """The attempt at ``name``'s layout failed: nothing it meant to drop goes."""
        self._pending.pop(name, None)

    def orphan(self, chunks: list[str]) -> None:
        """Chunks written (or perhaps written) that no layout names."""
        self._dropped += chunks

    def delete(self, name: str, segment_id: int) -> None:
        """Record segment ``segment_id``'s layout under ``name`` as deleted
        (its chunks dropped), if it has one."""
        layout = self.current(name, segment_id)
        if layout is not None and not layout.deleted:
            gone, dropped = layout.with_deleted()
            self.drop_later(name, dropped)
            self.set(gone, segment_id)

    def release(self) -> None:
        """Every layout set so far is recorded and flushed to tier-2: the
        chunks they dropped may be deleted, and the deleted ones' keys removed."""
        self._deletable += self._dropped
        self._dropped = []
        for name, owner in self._deleted.items():
            if name not in self.unrecorded:
                self._removable[name] = owner
        for name in self._removable:
            self._deleted.pop(name, None)

    def take_deletable(self) -> list[str]:
        """The released chunks, forgotten here (the caller deletes them)."""
        deletable, self._deletable = self._deletable, []
        return deletable

    def take_all_dropped(self) -> list[str]:
        """Every chunk dropped by a layout set, released or not (for a writer
        breaking PDP-40's order on purpose)."""
        self.release()
        return self.take_deletable()

    def removable(self) -> list[str]:
        """The keys of deleted layouts that tier-2 records as deleted (still ours)."""
        return [name for name, owner in self._removable.items()
                if self.owners.get(name) == owner and self.layouts[name].deleted]

    def removed(self, names: list[str]) -> None:
        """Their keys left the table: they are forgotten."""
        for name in names:
            owner = self._removable.pop(name, None)
            if owner is not None and self.owners.get(name) == owner \
                    and self.layouts[name].deleted:
                del self.layouts[name]
                del self.owners[name]

    def unrecorded_entries(self, segments: Mapping[int, SegmentMetadata]
                           ) -> tuple[TableEntries, dict[str, SegmentLayout]]:
        """The storage-metadata table's entries for the changed layouts
        (``segments``: the committed segments, for each one's type), and the
        layouts they hold, for :meth:`recorded` once they are put."""
        entries: TableEntries = []
        for name, layout in self.unrecorded.items():
            owner = segments.get(self.owners[name])
            entries.append((name.encode(), encode_layout_record(
                self.owners[name], layout, 0 if owner is None else int(owner.type)), None))
        return entries, dict(self.unrecorded)

    def recorded(self, put: dict[str, SegmentLayout]) -> None:
        """The layouts ``put`` are in the table: no longer unrecorded (unless
        changed again since)."""
        for name, layout in put.items():
            if self.unrecorded.get(name) is layout:
                del self.unrecorded[name]

    def metadata_layouts(self) -> tuple[SegmentLayout, ...]:
        """The container-metadata segments' layouts, by name (a journal snapshot's)."""
        return tuple(layout for name, layout in sorted(self.layouts.items())
                     if bucket_of(name, self.container_id) == METADATA)


class SystemJournal:
    """Container ``container_id``'s system-journal snapshots in tier-2,
    written by the owner of tier-1 epoch ``epoch``: each snapshot a new
    chunk, the ones before it deleted once it is written (a snapshot whose
    write failed, perhaps written, too)."""

    def __init__(self, storage: ChunkStorage, container_id: int, epoch: int) -> None:
        self._storage = storage
        self._container_id = container_id
        self._epoch = epoch
        self._namer = ChunkNamer(epoch)
        self._chunk: str | None = None
        self._stale: list[str] = []
        self._older_owners = True
        """Whether older owners' snapshots may still be in tier-2."""

    async def write(self, layouts: tuple[SegmentLayout, ...]) -> int:
        """Write a snapshot of ``layouts`` as a new chunk (durable on return);
        its size in bytes."""
        cid = self._container_id
        data = encode_journal(JournalSnapshot(cid, self._epoch, layouts))
        chunk = self._namer.next_name(journal_name(cid))
        try:
            await self._storage.write_chunk(chunk, data)
        except BaseException:
            self._stale.append(chunk)  # perhaps written; a later snapshot replaces it
            raise
        if self._chunk is not None:
            self._stale.append(self._chunk)
        self._chunk = chunk
        return len(data)

    async def delete_stale(self) -> int:
        """Delete the snapshots the last :meth:`write` replaced (after this
        owner's first: every older owner's); how many."""
        storage, chunk = self._storage, self._chunk
        if self._older_owners:  # this owner's first: older owners' snapshots are stale
            self._stale += [info.name for info in await storage.list_chunks(
                journal_name(self._container_id) + ".E") if info.name != chunk
                and parse_chunk_name(info.name)[1] < self._epoch]
            self._older_owners = False
        deleted = 0
        while self._stale:
            await storage.delete(self._stale[-1])
            self._stale.pop()
            deleted += 1
        return deleted
