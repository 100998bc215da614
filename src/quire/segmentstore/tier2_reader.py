"""Reading tier-2 alone: what a container's storage writer recorded there.

The storage writer (:mod:`~quire.segmentstore.storage_writer`) records every
segment's :class:`~quire.tier2.SegmentLayout` in two places of tier-2:

* the container's storage-metadata table segment
  ``_system/containers/storage_metadata_<id>`` (key: segment name, value: the
  segment's id, type and :func:`~quire.tier2.encode_layout`), flushed to
  tier-2 like any table: :func:`storage_metadata_name`;
* snapshot chunks of the container's *system journal*
  (``_system/containers/journal_<id>.E<epoch>.<n>``, the latest snapshot of
  the highest epoch wins), holding the layouts of the container-metadata
  segments, the storage-metadata table's among them: :func:`journal_name`.

So the journal leads to the table, and the table to every other layout:
:func:`read_records` reads both, :func:`read_layout` finds one segment's,
and a :class:`Tier2Reader` reads a segment's bytes through them.  This is
what ``quire tier2 check``, disaster recovery, the Spark reader and a
container reopening over tier-2 read; none of them writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from quire.errors import ChunkNotFoundError, SegmentStoreError, SegmentTruncatedError
from quire.segmentstore.chunk_sidecars import SidecarCache
from quire.segmentstore.names import SYSTEM_SCOPE
from quire.segmentstore.storage_records import (
    JournalSnapshot,
    decode_journal,
    decode_typed_layout_record,
)
from quire.segmentstore.tables import decode_entries
from quire.tier2 import ChunkStorage, SegmentLayout, parse_chunk_name, read_segment

_JOURNAL_READ_ATTEMPTS = 100


def storage_metadata_name(container_id: int) -> str:
    """The container's storage-metadata table segment (layouts by segment name)."""
    return f"{SYSTEM_SCOPE}/containers/storage_metadata_{container_id}"


def journal_name(container_id: int) -> str:
    """The segment name the container's system-journal chunks are named after."""
    return f"{SYSTEM_SCOPE}/containers/journal_{container_id}"


class Tier2Reader:
    """Reads segments' bytes out of tier-2 by the layouts it is given
    (the writer's live ones, or :meth:`load`'s from tier-2 alone)."""

    def __init__(self, storage: ChunkStorage, layouts: dict[str, SegmentLayout],
                 owners: dict[str, int]) -> None:
        self.storage = storage
        self.layouts = layouts
        self.owners = owners
        self.sidecars = SidecarCache(storage)
        """The chunks' sidecars read so far (append times, event boundaries)."""

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

    def _layout(self, segment_id: int, name: str) -> SegmentLayout | None:
        layout = self.layouts.get(name)
        if layout is None or layout.deleted or self.owners.get(name, segment_id) != segment_id:
            return None
        return layout

    async def times(self, segment_id: int, name: str, start: int, end: int
                    ) -> list[tuple[int, int]]:
        """When the segment's bytes ``start .. end`` that tier-2 holds were
        appended, from its chunks' sidecars (a
        :class:`~quire.segmentstore.append_times.Tier2Times`)."""
        layout = self._layout(segment_id, name)
        if layout is None:
            return []
        start, end = max(start, layout.start_offset), min(end, layout.length)
        return await self.sidecars.times(layout, start, end) if start < end else []

    async def locate(self, segment_id: int, name: str, time_ms: int) -> int | None:
        """The first append at or after ``time_ms`` among the bytes tier-2 holds."""
        layout = self._layout(segment_id, name)
        return None if layout is None else await self.sidecars.locate(layout, time_ms)


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
