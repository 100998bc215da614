"""The in-memory twin of :class:`~quire.segmentstore.writer_source.WriterSource`.

:class:`MemoryWriterSource` is a container's committed state with no log and
no read index: a request (``create_segment``, ``append``, ``seal``,
``truncate``, ``delete``, ``merge``, ``update_attributes``, ``table_put``)
is applied through :meth:`~quire.segmentstore.metadata.ContainerMetadata.apply`,
the container's own state transition, and is committed at once.  Every
byte appended stays in memory, so :meth:`read` never needs tier-2.
Checkpoints and tier-1 truncation are remembered as numbers:
:attr:`checkpoints` and :attr:`truncated_at`; a test sets :attr:`failure`
(the container stopped serving) and :attr:`pressure` (tier-1 near its
ceiling); :meth:`forget` drops the deleted segments at once, and
:meth:`quarantine` marks and seals a segment as the container does.  A storage writer runs on it
alone, with no container::

    source = MemoryWriterSource()
    writer = await StorageWriter.start(source, storage, config)
    await source.create_segment("sc/st/0")
    await source.append("sc/st/0", b"bytes")
    await writer.flush_once()

Its requests take the container's arguments (attribute updates resolved by
the container's :func:`~quire.segmentstore.attribute_updates.resolve_updates`), so a
test written against a container runs on it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from quire.clock import Clock
from quire.errors import (
    BadOffsetError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentStoreError,
)
from quire.segmentstore.append_times import AppendTimes, Tier2Times, TimeEntries
from quire.segmentstore.attribute_updates import resolve_updates
from quire.segmentstore.container import sealed_error
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.names import check_name
from quire.segmentstore.operations import (
    AppendOp,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    SealOp,
    SegmentMapOp,
    TruncateOp,
)
from quire.segmentstore.tables import TableIndex, encode_batch
from quire.segmentstore.types import (
    QUARANTINED_ATTRIBUTE,
    AppendResult,
    AttributeUpdate,
    SegmentInfo,
    SegmentType,
)
from quire.segmentstore.writer_source import Merge
from quire.testing.clock import ManualClock

if TYPE_CHECKING:
    from quire.segmentstore.committed_side import Tier2Read

_NO_ENTRIES: Mapping[bytes, tuple[int, bytes]] = {}


class MemoryWriterSource:
    """A :class:`~quire.segmentstore.writer_source.WriterSource` in memory
    (see the module docstring); ``clock`` is its clock (default: a
    :class:`~quire.testing.clock.ManualClock` standing at 0)."""

    def __init__(self, container_id: int = 0, epoch: int = 1,
                 clock: Clock | None = None) -> None:
        self.metadata = ContainerMetadata(container_id)
        self._epoch = epoch
        self._clock = clock or ManualClock(0)
        self.data: dict[int, bytearray] = {}
        """Every segment's bytes from offset 0 (truncation drops none)."""
        self.tables: dict[int, TableIndex] = {}
        self._merges: list[Merge] = []
        self.checkpoints: list[tuple[int, dict[int, int]]] = []
        """Checkpoints still in "tier-1", oldest first: (sequence, each live
        segment's length then)."""
        self.truncated_at: int | None = None
        """The sequence of the checkpoint "tier-1" was last cut at."""
        self.tier2_read: Tier2Read | None = None
        """What :meth:`read_from_tier2` was given."""
        self.times = AppendTimes()
        """When the bytes were appended (the container's index, fed the same way)."""
        self.tier2_times: Tier2Times | None = None
        """What :meth:`times_from_tier2` was given."""
        self.failure: BaseException | None = None
        """Why "the container" stopped serving (a test sets it)."""
        self.pressure = False
        """What :meth:`tier1_pressure` answers (a test sets it)."""
        self.forgotten: list[int] = []
        """The segments :meth:`forget` dropped, in order."""

    # --- WriterSource ----------------------------------------------------------------

    @property
    def container_id(self) -> int:
        return self.metadata.container_id

    @property
    def epoch(self) -> int:
        return self._epoch

    def now_ms(self) -> int:
        return self._clock.wall_ms()

    def tier1_pressure(self) -> bool:
        return self.pressure

    @property
    def segments(self) -> Mapping[int, SegmentMetadata]:
        return self.metadata.segments

    def segment(self, name: str) -> SegmentMetadata | None:
        return self.metadata.get(name)

    def table_entries(self, segment_id: int) -> Mapping[bytes, tuple[int, bytes]]:
        table = self.tables.get(segment_id)
        return _NO_ENTRIES if table is None else table.entries

    def take_merges(self) -> Sequence[Merge]:
        taken, self._merges = self._merges, []
        return taken

    async def read(self, segment_id: int, offset: int, length: int) -> bytes:
        s = self.metadata.segments.get(segment_id)
        if s is None or s.deleted or offset < s.start_offset:
            return b""
        return bytes(self.data[segment_id][offset:min(offset + length, s.length)])

    def flushed(self, segment_id: int, length: int) -> None:
        self.metadata.segments[segment_id].storage_length = length
        self.times.flushed(segment_id, length)

    def append_times(self, segment_id: int, start: int, end: int) -> TimeEntries:
        return self.times.between(segment_id, start, end)

    def times_from_tier2(self, times: Tier2Times) -> None:
        self.tier2_times = times

    def read_from_tier2(self, read: Tier2Read) -> None:
        self.tier2_read = read

    async def create_segment(self, name: str,
                             segment_type: SegmentType = SegmentType.STREAM) -> None:
        check_name("segment", name)
        if self.metadata.get(name) is not None:
            raise SegmentExistsError(f"segment {name!r} exists")
        segment_id = self.metadata.next_segment_id
        self._apply(SegmentMapOp(self._sequence(), self.now_ms(), segment_id, name,
                                 SegmentType(segment_type)))
        self.data[segment_id] = bytearray()

    async def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                        ) -> list[int]:
        """Put entries (their expected versions are checked as the container does)."""
        s = self._writable(name)
        table = self._table(s)
        table.check_put(entries)
        if not entries:
            return []
        data, offsets = encode_batch([(k, v) for k, v, _ in entries])
        offset = s.length
        self._append(s, data, ())
        table.apply(data, offset)
        return [offset + o for o in offsets]

    async def quarantine(self, name: str) -> None:
        s = self._live(name)
        if QUARANTINED_ATTRIBUTE not in s.attributes:
            self._apply(AttributesOp(self._sequence(), self.now_ms(), s.segment_id,
                                     ((QUARANTINED_ATTRIBUTE, self.now_ms()),)))
        if not s.sealed:
            self._apply(SealOp(self._sequence(), self.now_ms(), s.segment_id))

    def forget(self, segment_ids: Sequence[int]) -> None:
        self.metadata.purge(set(segment_ids))
        for segment_id in segment_ids:
            if segment_id not in self.metadata.segments:
                self.data.pop(segment_id, None)
                self.forgotten.append(segment_id)

    def add_checkpoint(self) -> None:
        """A checkpoint, unless nothing happened since the last (durable at once)."""
        if self.checkpoints and self.checkpoints[-1][0] == self.metadata.sequence:
            return
        self._apply(CheckpointOp(self._sequence(), self.now_ms(), b""))
        self.checkpoints.append((self.metadata.sequence, {
            s.segment_id: s.length for s in self.metadata.segments.values() if not s.deleted}))

    async def truncate_log(self, in_tier2: Callable[[int, int], bool]) -> int | None:
        for i in range(len(self.checkpoints) - 1, -1, -1):
            sequence, lengths = self.checkpoints[i]
            if all(in_tier2(sid, length) for sid, length in lengths.items()):
                del self.checkpoints[:i]
                self.truncated_at = sequence
                return sequence
        return None

    # --- the container's side (its requests' names and arguments) ---------------------------

    async def append(self, name: str, data: bytes,
                     attribute_updates: Sequence[AttributeUpdate] = ()) -> AppendResult:
        s = self._writable(name)
        if s.type is SegmentType.TABLE:
            raise SegmentStoreError(f"segment {name!r} is a table: use table_put")
        self._append(s, data, resolve_updates(s.attributes, attribute_updates))
        return AppendResult(s.length)

    async def update_attributes(self, name: str, updates: Sequence[AttributeUpdate]) -> None:
        s = self._writable(name)
        resolved = resolve_updates(s.attributes, updates)
        if resolved:
            self._apply(AttributesOp(self._sequence(), self.now_ms(), s.segment_id, resolved))

    async def table_remove(self, name: str, keys: Sequence[tuple[bytes, int | None]]) -> None:
        s = self._writable(name)
        table = self._table(s)
        table.check_put([(k, b"", v) for k, v in keys])
        present = [(k, None) for k, _ in keys if k in table.entries]
        if present:
            data, _offsets = encode_batch(present)
            offset = s.length
            self._append(s, data, ())
            table.apply(data, offset)

    async def get_info(self, name: str) -> SegmentInfo:
        return self._live(name).info()

    async def seal(self, name: str) -> None:
        s = self._writable(name)
        self._apply(SealOp(self._sequence(), self.now_ms(), s.segment_id))

    async def truncate(self, name: str, offset: int) -> None:
        s = self._live(name)
        if not 0 <= offset <= s.length:
            raise BadOffsetError(f"segment {name!r}: truncate at {offset}, length "
                                 f"{s.length}", offset, s.length)
        if offset > s.start_offset:
            self._apply(TruncateOp(self._sequence(), self.now_ms(), s.segment_id, offset))

    async def delete(self, name: str) -> None:
        s = self._live(name)
        self._apply(DeleteOp(self._sequence(), self.now_ms(), s.segment_id))
        self.tables.pop(s.segment_id, None)

    async def merge(self, target: str, source: str) -> None:
        """Append all of ``source`` (sealed first) to ``target``; ``source`` is gone."""
        t, src = self._writable(target), self._live(source)
        if not src.sealed:
            await self.seal(source)
        op = MergeOp(self._sequence(), self.now_ms(), t.segment_id, src.segment_id,
                     t.length, src.length)
        self._apply(op)
        self.data[t.segment_id] += self.data[src.segment_id]
        if self.tier2_read is not None:  # as a container: only a writer takes them
            self._merges.append((t.segment_id, src.segment_id, op.target_offset, op.length))

    # --- inside ----------------------------------------------------------------------------

    def _sequence(self) -> int:
        return self.metadata.sequence + 1

    def _apply(self, op: Operation) -> None:
        self.metadata.apply(op)  # ValueError if it does not fit: nothing changes
        self.times.apply(op, self.metadata.segments)

    def _append(self, s: SegmentMetadata, data: bytes,
                attributes: tuple[tuple[int, int], ...]) -> None:
        self._apply(AppendOp(self._sequence(), self.now_ms(), s.segment_id, s.length,
                             bytes(data), attributes))
        self.data[s.segment_id] += data

    def _live(self, name: str) -> SegmentMetadata:
        s = self.metadata.get(name)
        if s is None:
            raise SegmentNotFoundError(f"no segment {name!r}")
        return s

    def _table(self, s: SegmentMetadata) -> TableIndex:
        if s.type is not SegmentType.TABLE:
            raise SegmentStoreError(f"segment {s.name!r} is not a table segment")
        return self.tables.setdefault(s.segment_id, TableIndex())

    def _writable(self, name: str) -> SegmentMetadata:
        s = self._live(name)
        if s.sealed:
            raise sealed_error(s)
        return s
