"""A container's table segments: their requests and their indexes.

:class:`ContainerTables` serves the table requests of one container (put,
remove, get, iterate, read a delta) on the container's segments
(:class:`TableHost`).  It keeps two indexes per table, as the container
keeps two metadata states: the *accepted* index (every update queued, used
to check the next update's conditions and to give its versions) and the
*committed* index (updates whose frame is durable, the one reads see).  An
update is one append to the table's segment (:mod:`quire.segmentstore.tables`
encodes it); the container's committed side hands each committed one back
(:meth:`ContainerTables.committed_append`), on replay too.  After a replay
that started at a checkpoint (a truncated log), each table's index is
rebuilt from its whole data (:meth:`ContainerTables.rebuild`).

An update that leaves a table holding more than twice its live bytes is
followed, in the same call, by its compaction (:mod:`~quire.segmentstore.tables`):
appends of its live entries copied forward, then a truncation where they
begin.  Being queued with the update, against the accepted index, nothing
can come between what compaction read and what it writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from quire.errors import BadOffsetError, CorruptRecordError, SegmentStoreError
from quire.segmentstore.futures import call_as_future, retrieve
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.read_index import ReadIndex
from quire.segmentstore.tables import (
    TableDelta,
    TableEntry,
    TableIndex,
    TableIteratorPage,
    decode_entries,
    encode_batch,
    encode_copies,
)
from quire.segmentstore.types import MAX_APPEND_BYTES, SegmentType

_COMPACTION_APPEND_BYTES = MAX_APPEND_BYTES // 2
"""Copied entries per compaction append, in bytes (an append is one operation)."""


class TableHost(Protocol):
    """What table requests need of their container.

    ``committed`` is the committed metadata and ``read_index`` its data.
    :meth:`writable_segment` and :meth:`committed_segment` resolve a name
    (raising the request's error: no such segment, sealed, a failed
    container); :meth:`log_append` accepts an append of ``data`` at the
    segment's length and logs it, its future giving ``result`` once durable;
    :meth:`log_truncate` accepts and logs a truncation of ``s`` at ``offset``;
    :meth:`barrier` is a future giving ``result`` once everything accepted
    before it is durable."""

    @property
    def committed(self) -> ContainerMetadata: ...

    @property
    def read_index(self) -> ReadIndex: ...

    def writable_segment(self, name: str) -> SegmentMetadata: ...

    def committed_segment(self, name: str) -> SegmentMetadata: ...

    def log_append(self, s: SegmentMetadata, data: bytes,
                   result: object) -> asyncio.Future[Any]: ...

    def log_truncate(self, s: SegmentMetadata, offset: int) -> asyncio.Future[Any]: ...

    def barrier(self, result: object) -> asyncio.Future[Any]: ...


class ContainerTables:
    """The table requests and indexes of one container (see the module docstring)."""

    def __init__(self, host: TableHost) -> None:
        self._host = host
        self.accepted: dict[int, TableIndex] = {}
        self.committed: dict[int, TableIndex] = {}

    # --- updates (accepted state) ----------------------------------------------------

    def put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
            ) -> asyncio.Future[list[int]]:
        """Set keys to values, each if its expected version holds (None: any;
        ``tables.NOT_EXISTS``: must not exist; else exactly that version), all
        or nothing; the future gives the new versions, one per entry.  A key
        given more than once has each condition checked against the table
        before the batch; its last entry wins."""
        def make() -> asyncio.Future[list[int]]:
            s = self._host.writable_segment(name)
            table = self._accepted(s)
            table.check_put(entries)
            if not entries:
                return self._host.barrier([])
            return self._log_batch(s, table, [(k, v) for k, v, _ in entries], versions=True)
        return call_as_future(make, lambda: self._host.barrier(None))

    def remove(self, name: str, keys: Sequence[tuple[bytes, int | None]]
               ) -> asyncio.Future[None]:
        """Remove keys, each if its version holds (None: any, and a missing
        key is no error), all or nothing."""
        def make() -> asyncio.Future[None]:
            s = self._host.writable_segment(name)
            table = self._accepted(s)
            table.check_put([(k, b"", v) for k, v in keys])
            present = [(k, None) for k, _ in keys if k in table.entries]
            if not present:
                return self._host.barrier(None)
            return self._log_batch(s, table, present, versions=False)
        return call_as_future(make, lambda: self._host.barrier(None))

    def _accepted(self, s: SegmentMetadata) -> TableIndex:
        if s.type is not SegmentType.TABLE:
            raise SegmentStoreError(f"segment {s.name!r} is not a table segment")
        table = self.accepted.get(s.segment_id)
        if table is None:
            table = self.accepted[s.segment_id] = TableIndex()
        return table

    def _log_batch(self, s: SegmentMetadata, table: TableIndex,
                   batch: Sequence[tuple[bytes, bytes | None]],
                   versions: bool) -> asyncio.Future[Any]:
        """Log ``batch`` as one append to ``s``; the future gives the
        entries' versions if ``versions``, else None."""
        data, offsets = encode_batch(batch)
        if len(data) > MAX_APPEND_BYTES:
            raise SegmentStoreError(f"a table update is at most {MAX_APPEND_BYTES} bytes")
        offset = s.length
        table.apply(data, offset)
        done = self._host.log_append(s, data,
                                     [offset + o for o in offsets] if versions else None)
        self._compact(s, table)
        return done

    def _compact(self, s: SegmentMetadata, table: TableIndex) -> None:
        """Copy the table's live entries forward and truncate before them, if
        it is due (see the module docstring)."""
        copies = table.compaction(s.start_offset, s.length)
        if copies is None:
            return
        at = s.length
        batch: list[tuple[bytes, bytes, int]] = []
        size = 0
        for entry in copies:
            if batch and size + len(entry[0]) + len(entry[1]) > _COMPACTION_APPEND_BYTES:
                self._log_copies(s, table, batch)
                batch, size = [], 0
            batch.append(entry)
            size += len(entry[0]) + len(entry[1]) + 20
        if batch:
            self._log_copies(s, table, batch)
        self._host.log_truncate(s, at).add_done_callback(retrieve)

    def _log_copies(self, s: SegmentMetadata, table: TableIndex,
                    batch: list[tuple[bytes, bytes, int]]) -> None:
        data = encode_copies(batch)
        table.apply(data, s.length)  # the same versions and values: only where they sit moves
        self._host.log_append(s, data, None).add_done_callback(retrieve)

    def forget_accepted(self, segment_id: int) -> None:
        """The table is being deleted: its next update starts a new index."""
        self.accepted.pop(segment_id, None)

    # --- the committed side -----------------------------------------------------------

    def committed_append(self, segment_id: int, offset: int, data: bytes) -> None:
        """Apply a committed append to table ``segment_id`` at ``offset``."""
        table = self.committed.get(segment_id)
        if table is None:
            table = self.committed[segment_id] = TableIndex()
        table.apply(data, offset)

    def forget_committed(self, segment_id: int) -> None:
        """The table's deletion is committed."""
        self.committed.pop(segment_id, None)

    def accept_committed(self) -> None:
        """Make the accepted indexes copies of the committed ones (on opening)."""
        self.accepted = {i: t.copy() for i, t in self.committed.items()}

    async def rebuild(self) -> None:
        """Each live table's index from its whole data (tier-2, then tier-1)."""
        host = self._host
        for s in host.committed.segments.values():
            if s.deleted or s.type is not SegmentType.TABLE:
                continue
            table = self.committed[s.segment_id] = TableIndex()
            data = bytearray()
            while s.start_offset + len(data) < s.length:
                position = s.start_offset + len(data)
                piece = await host.read_index.read(s.segment_id, position,
                                                   min(1 << 20, s.length - position))
                if not piece:
                    raise SegmentStoreError(f"table {s.name!r}: bytes at {position} are in "
                                            "neither tier-1 nor tier-2")
                data += piece
            table.apply(bytes(data), s.start_offset)

    # --- reads (committed state) ------------------------------------------------------

    def _committed(self, name: str) -> tuple[SegmentMetadata, TableIndex]:
        s = self._host.committed_segment(name)
        if s.type is not SegmentType.TABLE:
            raise SegmentStoreError(f"segment {name!r} is not a table segment")
        return s, self.committed.get(s.segment_id) or TableIndex()

    async def get(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        """Each key's entry, or None if it does not exist."""
        _s, table = self._committed(name)
        out: list[TableEntry | None] = []
        for key in keys:
            found = table.entries.get(key)
            out.append(None if found is None else TableEntry(key, found[1], found[0]))
        return out

    async def iterate(self, name: str, keys_only: bool = False, token: bytes | None = None,
                      max_entries: int = 1000) -> TableIteratorPage:
        """Up to ``max_entries`` entries in key order after ``token``."""
        _s, table = self._committed(name)
        keys = sorted(k for k in table.entries if token is None or k > token)[:max_entries]
        entries = [TableEntry(k, None if keys_only else table.entries[k][1],
                              table.entries[k][0]) for k in keys]
        done = len(keys) < max_entries
        return TableIteratorPage(entries, None if done or not keys else keys[-1])

    async def read_delta(self, name: str, from_position: int,
                         max_entries: int) -> TableDelta:
        """Live entries with version >= ``from_position`` (a version or a
        ``last_position`` given before), in version order."""
        s, table = self._committed(name)
        if from_position < s.start_offset:
            return TableDelta([], s.start_offset, True)
        if from_position > s.length:
            raise BadOffsetError(f"table {name!r}: position {from_position} is past its end "
                                 f"{s.length}", from_position, s.length)
        entries: list[TableEntry] = []
        position = from_position
        length = s.length
        chunk = 1 << 16
        while position < length and len(entries) < max_entries:
            data = await self._host.read_index.read(s.segment_id, position,
                                                    min(chunk, length - position))
            progressed = False
            for version, key, value, end in decode_entries(data, position):
                progressed = True
                position = end
                live = table.entries.get(key)
                if value is not None and live is not None and live[0] == version:
                    entries.append(TableEntry(key, value, version))
                    if len(entries) >= max_entries:
                        break
            if not progressed:
                if chunk >= length - position:
                    raise CorruptRecordError(f"table {name!r}: no entry at {position}")
                chunk *= 2
        return TableDelta(entries, position, False)
