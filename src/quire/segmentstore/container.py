"""One segment container: its segments, on one tier-1 log.

A request is checked and resolved *when it is called*, against the
container's accepted state (every operation queued so far), becomes one
operation (:mod:`~quire.segmentstore.operations`) and goes to the
:class:`~quire.segmentstore.operation_log.OperationLog`.  Mutating methods
are plain methods returning futures, so requests are ordered by call, not by
await: two appends called one after the other land in that order even if
the caller awaits the second first.  A refused request raises nothing at
call time; its future fails with the typed error, and nothing of it is
applied.

When the frame holding an operation is durable, the operation is applied to
the committed state and the read index, then acknowledged.  Reads and
``get_info`` see only the committed state.  A failed tier-1 append fails the
container (every later call fails with the same error); it must be
reopened, which replays the log.

Opening a container takes its log (fencing the previous owner), replays it
(a checkpoint operation restores the whole metadata; every other operation
is applied as it was live) and writes a checkpoint, which also proves the
log is still ours.

With tier-2 (``tier2_read``), the log is truncated below a checkpoint once
every byte the checkpoint counts is in tier-2 (:meth:`truncate_log`, called
by the storage writer).  Replay then starts at that checkpoint: bytes below
it are read from tier-2 (the read index's ``fetch_tier2``), and each table's
index is rebuilt from its whole data.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    ContainerClosedError,
    ContainerFencedError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
)
from quire.log import DurableDataLog, LogFencedError, Position
from quire.segmentstore import frames
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata
from quire.segmentstore.operation_log import OperationLog, Pending, read_frame
from quire.segmentstore.operations import (
    APPEND,
    PLAIN_APPEND_HEAD,
    WRITER_APPEND_HEAD,
    AppendOp,
    Attributes,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    PackedAppend,
    SealOp,
    SegmentMapOp,
    TruncateOp,
    as_operation,
    decode,
)
from quire.segmentstore.read_index import ReadIndex
from quire.segmentstore.segment_rates import SegmentRates
from quire.segmentstore.tables import (
    TableDelta,
    TableEntry,
    TableIndex,
    TableIteratorPage,
    decode_entries,
    encode_batch,
)
from quire.segmentstore.types import (
    ATTRIBUTE_KEY_LIMIT,
    NULL_ATTRIBUTE_VALUE,
    VALUE_MAX,
    VALUE_MIN,
    AppendResult,
    AttributeUpdate,
    MergeResult,
    ReadResult,
    SegmentInfo,
    SegmentType,
    UpdateType,
    check_key,
    check_value,
)

T = TypeVar("T")
_TABLE = SegmentType.TABLE
_pack_plain_append = PLAIN_APPEND_HEAD.pack
_PLAIN_APPEND_LENGTH = PLAIN_APPEND_HEAD.size - 4
"""An APPEND's length in a frame without its data (the length prefix not counted)."""
_pack_writer_append = WRITER_APPEND_HEAD.pack
_WRITER_APPEND_LENGTH = WRITER_APPEND_HEAD.size - 4
"""The same for an APPEND carrying one attribute (a writer's number)."""
_KEY_LIMIT = ATTRIBUTE_KEY_LIMIT
_LOW_64 = (1 << 64) - 1
Tier2Read = Callable[[int, str, int, int], Awaitable[bytes]]
"""``tier2_read(segment_id, name, offset, length)``: up to ``length`` bytes of
the segment from ``offset`` out of tier-2 (b"" where tier-2 has none)."""
_LAST_ENTRY = (1 << 63) - 1
MAX_APPEND_BYTES = 16 << 20
"""The largest append: room for the Pravega client's blocks of up to 8 MiB of
events with their headers.  One larger than a frame is written as part
frames (:func:`~quire.segmentstore.frames.split`)."""
MAX_NAME_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES
    max_frames_in_flight: int = 8
    frame_cut_ops: int = 128
    """Cut a frame as soon as this many operations are queued (frames pipeline).
    Each frame costs every bookie of the ensemble one pass of its add pipeline
    (a read, a journal group, a write of answers: about 0.3 ms of CPU for a
    frame of a few KiB), so frames of 128 beat 64 and 32 with 256 appends
    outstanding, 100 B and 1 KiB alike (docs/performance.md, "Segment appends")."""
    frame_cut_bytes: int = 256 << 10
    """... or this many bytes."""
    read_index_budget_bytes: int = 256 << 20
    """Committed data kept in memory (Pravega's cache); past it the oldest is
    dropped and read back from tier-1, or tier-2 once flushed there."""
    checkpoint_every_bytes: int = 64 << 20
    """Write a metadata checkpoint after this many bytes of operations."""


def resolve_updates(current: Mapping[int, int], updates: Iterable[AttributeUpdate],
                    extra: Iterable[tuple[int, int]] = ()) -> Attributes:
    """The final values ``updates`` give against ``current``, in order
    (BadAttributeUpdateError if a condition fails: then nothing applies)."""
    changed: dict[int, int] = {}
    for u in updates:
        if not isinstance(u, AttributeUpdate):
            raise BadAttributeUpdateError(f"not an AttributeUpdate: {u!r}")
        old = changed.get(u.key, current.get(u.key))
        kind = u.update_type
        if kind is UpdateType.REPLACE:
            value = u.value
        elif kind is UpdateType.REPLACE_IF_EQUALS:
            if (NULL_ATTRIBUTE_VALUE if old is None else old) != u.comparison_value:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x} is {old}, not {u.comparison_value}")
            value = u.value
        elif kind is UpdateType.REPLACE_IF_GREATER:
            if old is not None and u.value <= old:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x} is {old}, not below {u.value}")
            value = u.value
        elif kind is UpdateType.ACCUMULATE:
            value = (old or 0) + u.value
            try:
                check_value(value)
            except BadAttributeUpdateError:
                raise BadAttributeUpdateError(
                    f"attribute {u.key:#x}: {old} + {u.value} overflows") from None
        else:
            raise BadAttributeUpdateError(f"unknown update type {kind!r}")
        changed[u.key] = value
    for key, value in extra:
        changed[key] = value
    return tuple(changed.items())


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SegmentContainer:
    """One container on its tier-1 log; get one with :meth:`open`."""

    def __init__(self, container_id: int, log: DurableDataLog, config: ContainerConfig,
                 clock: Clock, tier2_read: Tier2Read | None = None) -> None:
        self.container_id = container_id
        self._log = log
        self._config = config
        self._clock_ms = clock.wall_ms
        self.committed = ContainerMetadata(container_id)
        self.accepted = self.committed
        self.read_index = ReadIndex(self._fetch, config.read_index_budget_bytes)
        self.tier2_read = tier2_read
        """Where bytes no longer in memory or tier-1 are read (None: no tier-2)."""
        if tier2_read is not None:
            self.read_index.fetch_tier2 = self.fetch_tier2
        self.merges: list[tuple[int, int, int, int]] = []
        """Committed merges ``(target id, source id, target offset, length)``
        for the storage writer to take (kept only with tier-2)."""
        self.checkpoints: list[tuple[int, Position, dict[int, int]]] = []
        """Committed checkpoints still in the log, oldest first: (sequence,
        address, each live segment's length then): where the log may be cut."""
        self._oplog = OperationLog(log, self._commit, max_frame_bytes=config.max_frame_bytes,
                                   max_frames_in_flight=config.max_frames_in_flight,
                                   cut_ops=config.frame_cut_ops,
                                   cut_bytes=config.frame_cut_bytes,
                                   on_failure=self._failed,
                                   on_frame_committed=self._commit_frame)
        self._bytes_since_checkpoint = 0
        self._checkpoint_every_bytes = config.checkpoint_every_bytes
        self.tables_accepted: dict[int, TableIndex] = {}
        self.tables_committed: dict[int, TableIndex] = {}
        self.rates = SegmentRates()
        """Bytes and events appended per segment, for auto-scaling."""

    @property
    def epoch(self) -> int:
        return self._log.epoch

    @property
    def clock_ms(self) -> Callable[[], int]:
        """The container's wall clock (``Clock.wall_ms``), for timestamps and thresholds."""
        return self._clock_ms

    @property
    def operation_log(self) -> OperationLog:
        return self._oplog

    @classmethod
    async def open(cls, container_id: int, log: DurableDataLog,
                   config: ContainerConfig | None = None, *,
                   clock: Clock = SYSTEM_CLOCK,
                   tier2_read: Tier2Read | None = None) -> SegmentContainer:
        """Take ``log`` (fencing its previous owner), replay it, checkpoint.
        ``clock`` stamps its operations; ``tier2_read`` reads what a
        truncated log no longer holds."""
        container = cls(container_id, log, config or ContainerConfig(), clock, tier2_read)
        try:
            await log.initialize()
            truncated = await container._replay()
            if truncated:
                await container._rebuild_tables()
            container.accepted = container.committed.copy()
            container.tables_accepted = {i: t.copy()
                                         for i, t in container.tables_committed.items()}
            await container._checkpoint()
        except LogFencedError as e:
            await log.close()
            raise ContainerFencedError(f"container {container_id}: fenced while opening") from e
        except BaseException:
            await log.close()
            raise
        return container

    async def _replay(self) -> bool:
        """Apply the log; True if it starts at a checkpoint after truncation."""
        committed = self.committed
        started = truncated = False
        assembler: frames.PartAssembler[Position] = frames.PartAssembler()
        async for address, frame in self._log.read(None):
            if frames.is_part(frame):
                whole = assembler.add(frame, address)
                if whole is None:
                    continue
                raws: list[bytes | memoryview] = [whole[0]]
                address = whole[1]  # an operation in parts is read back from its first
            else:
                assembler.abandon()  # parts cut short were never acknowledged
                raws = list(frames.unpack(frame))
            for raw in raws:
                op = decode(raw)
                if not started:
                    # a truncated log starts in the frame of its first checkpoint
                    if not isinstance(op, CheckpointOp) and op.sequence != 1:
                        continue
                    started = True
                    truncated = op.sequence != 1
                if isinstance(op, CheckpointOp):
                    restored = ContainerMetadata.restore(op.checkpoint)
                    if committed.sequence not in (0, restored.sequence):
                        raise ValueError(f"container {self.container_id}: checkpoint after "
                                         f"{restored.sequence} found after {committed.sequence}")
                    self.committed = committed = restored
                committed.apply(op)
                self._index(op, address)
        return truncated

    async def _rebuild_tables(self) -> None:
        """Each live table's index from its whole data (tier-2, then tier-1)."""
        for s in self.committed.segments.values():
            if s.deleted or s.type is not SegmentType.TABLE:
                continue
            table = self.tables_committed[s.segment_id] = TableIndex()
            data = bytearray()
            while s.start_offset + len(data) < s.length:
                position = s.start_offset + len(data)
                piece = await self.read_index.read(s.segment_id, position,
                                                   min(1 << 20, s.length - position))
                if not piece:
                    raise SegmentStoreError(f"table {s.name!r}: bytes at {position} are in "
                                            "neither tier-1 nor tier-2")
                data += piece
            table.apply(bytes(data), s.start_offset)

    async def fetch_tier2(self, segment_id: int, offset: int, length: int) -> bytes:
        """The read index's way to tier-2 (see :data:`Tier2Read`)."""
        s = self.committed.segments.get(segment_id)
        if s is None or self.tier2_read is None:
            return b""
        return await self.tier2_read(segment_id, s.name, offset, length)

    def add_checkpoint(self) -> asyncio.Future[Any] | None:
        """Write a checkpoint now, unless nothing was logged since the last
        one; its future completes when it is durable."""
        if self.checkpoints and self.checkpoints[-1][0] == self.accepted.sequence:
            return None
        self._oplog.check()
        return self._add_checkpoint()

    async def truncate_log(self, in_tier2: Callable[[int, int], bool]) -> int | None:
        """Truncate the log below the newest checkpoint whose every segment
        length ``(segment_id, length)`` is ``in_tier2``; its sequence (None
        if no checkpoint qualifies).  The checkpoint's own frame stays: a
        reopen starts there."""
        for i in range(len(self.checkpoints) - 1, -1, -1):
            sequence, address, lengths = self.checkpoints[i]
            if all(in_tier2(sid, length) for sid, length in lengths.items()):
                break
        else:
            return None
        if address.entry_id > 0:
            await self._log.truncate(Position(address.ledger_seq, address.entry_id - 1))
        elif address.ledger_seq > 0:
            await self._log.truncate(Position(address.ledger_seq - 1, _LAST_ENTRY))
        # else: the checkpoint is the log's first record, nothing is below it
        del self.checkpoints[:i]
        return sequence

    async def _checkpoint(self) -> None:
        await self._add_checkpoint()

    def _add_checkpoint(self) -> asyncio.Future[Any]:
        accepted = self.accepted
        op = CheckpointOp(accepted.sequence + 1, self._clock_ms(), accepted.checkpoint())
        accepted.apply(op)
        self._bytes_since_checkpoint = 0
        return self._oplog.add(op)

    # --- the committed side -------------------------------------------------

    def _commit_frame(self, batch: list[Pending], address: Position) -> None:
        """Each operation of a durable frame, in order (see :meth:`_commit`);
        the appends the hot path packed as tuples are applied inline."""
        committed = self.committed
        segments = committed.segments
        index_append = self.read_index.append
        commit = self._commit
        sequence = committed.sequence
        for pending in batch:
            op = pending[0]
            if not isinstance(op, tuple):
                committed.sequence = sequence
                commit(op, address)
                sequence = committed.sequence
                continue
            segment_id, offset, data, op_sequence, timestamp_ms, attributes = op
            s = segments.get(segment_id)
            sequence += 1
            if s is None or s.deleted or s.sealed or offset != s.length \
                    or op_sequence != sequence:
                committed.sequence = sequence - 1
                commit(as_operation(op), address)  # raises the error that says what is wrong
                raise AssertionError(f"operation {op_sequence} does not fit")
            s.length = offset + len(data)
            if attributes:
                s.attributes.update(attributes)
            s.last_modified_ms = timestamp_ms
            index_append(segment_id, offset, data, address)
        committed.sequence = sequence

    def _commit(self, op: Operation, address: Position) -> None:
        if type(op) is AppendOp:  # the hot path: committed.apply(op) inline
            committed = self.committed
            s = committed.segments.get(op.segment_id)
            if s is None or s.deleted or s.sealed or op.offset != s.length \
                    or op.sequence != committed.sequence + 1:
                committed.apply(op)  # raises the ValueError that says what is wrong
                raise AssertionError(f"operation {op.sequence} does not fit")
            s.length += len(op.data)
            if op.attributes:
                s.attributes.update(op.attributes)
            s.last_modified_ms = op.timestamp_ms
            committed.sequence = op.sequence
            if s.type is SegmentType.TABLE:
                self._index(op, address)
            else:
                self.read_index.append(op.segment_id, op.offset, op.data, address)
        elif isinstance(op, CheckpointOp):
            self.committed.sequence = op.sequence  # the committed state is what it holds
            self._remember_checkpoint(op, address)
        else:
            self.committed.apply(op)
            self._index(op, address)

    def _remember_checkpoint(self, op: CheckpointOp, address: Position) -> None:
        self.checkpoints.append((op.sequence, address, {
            s.segment_id: s.length for s in self.committed.segments.values() if not s.deleted}))

    def _index(self, op: Operation, address: Position) -> None:
        if isinstance(op, AppendOp):
            if self.committed.segments[op.segment_id].type is SegmentType.TABLE:
                table = self.tables_committed.get(op.segment_id)
                if table is None:
                    table = self.tables_committed[op.segment_id] = TableIndex()
                table.apply(op.data, op.offset)
            self.read_index.append(op.segment_id, op.offset, op.data, address)
        elif isinstance(op, TruncateOp):
            self.read_index.truncate(op.segment_id, op.start_offset)
        elif isinstance(op, DeleteOp):
            self.tables_committed.pop(op.segment_id, None)
            self.read_index.delete(op.segment_id)
        elif isinstance(op, MergeOp):
            self.read_index.merge(op.target_id, op.source_id, op.target_offset, op.length)
            if self.tier2_read is not None:
                self.merges.append((op.target_id, op.source_id, op.target_offset, op.length))
        elif isinstance(op, SealOp | AttributesOp):
            self.read_index.notify(op.segment_id)
        elif isinstance(op, CheckpointOp):
            self._remember_checkpoint(op, address)

    @property
    def failure(self) -> BaseException | None:
        """Why the container stopped serving (fenced by another owner, a
        tier-1 append failed, closed), or None while it serves."""
        oplog = self._oplog
        if oplog.failure is not None:
            return oplog.failure
        return ContainerClosedError("the container is closed") if oplog.closed else None

    def _failed(self, _error: BaseException) -> None:
        self.read_index.notify_all()

    async def _fetch(self, segment_id: int, offset: int, length: int,
                     address: Position) -> bytes:
        """The segment's bytes [offset, offset + length) from the frame at ``address``."""
        parts = [op.data for op in await read_frame(self._log, address)
                 if isinstance(op, AppendOp) and op.segment_id == segment_id
                 and offset <= op.offset < offset + length]
        data = b"".join(parts)
        if len(data) != length:
            raise ValueError(f"segment {segment_id}: frame {address} holds {len(data)} of the "
                             f"{length} bytes at {offset}")
        return data

    # --- requests ------------------------------------------------------------

    def _submit(self, make: Callable[[], asyncio.Future[T]]) -> asyncio.Future[T]:
        """``make()``'s future, or a future failed with what it raised."""
        try:
            return make()
        except QuireError as e:
            future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            future.set_exception(e)
            return future

    def _segment(self, name: str) -> SegmentMetadata:
        self._oplog.check()
        s = self.accepted.get(name)
        if s is None:
            raise SegmentNotFoundError(f"no segment {name!r}")
        return s

    def _writable(self, name: str) -> SegmentMetadata:
        s = self._segment(name)
        if s.sealed:
            raise SegmentSealedError(f"segment {name!r} is sealed")
        return s

    def _log_op(self, op: Operation, result: object = None) -> asyncio.Future[Any]:
        self.accepted.apply(op)
        future = self._oplog.add(op, result)
        if isinstance(op, AppendOp):
            self._bytes_since_checkpoint += len(op.data) + 64
        else:
            self._bytes_since_checkpoint += 64
        if self._bytes_since_checkpoint >= self._checkpoint_every_bytes:
            # its failure, if any, is the log's and reaches every later request
            self._add_checkpoint().add_done_callback(_retrieve)
        return future

    def _next(self) -> tuple[int, int]:
        return self.accepted.sequence + 1, self._clock_ms()

    def create_segment(self, name: str, segment_type: SegmentType = SegmentType.STREAM,
                       attributes: Mapping[int, int] | Sequence[AttributeUpdate] | None = None,
                       ) -> asyncio.Future[None]:
        """Create a segment (SegmentExistsError if the name is taken)."""
        def make() -> asyncio.Future[None]:
            self._oplog.check()
            encoded = name.encode() if isinstance(name, str) else b""
            if not encoded or len(encoded) > MAX_NAME_BYTES:
                raise SegmentStoreError(f"a segment name is 1 to {MAX_NAME_BYTES} bytes of "
                                        f"UTF-8, got {name!r}")
            if self.accepted.get(name) is not None:
                raise SegmentExistsError(f"segment {name!r} exists")
            kind = SegmentType(segment_type)
            if attributes is None:
                initial: Attributes = ()
            elif isinstance(attributes, Mapping):
                for k, v in attributes.items():
                    check_key(k)
                    check_value(v)
                initial = tuple(attributes.items())
            else:
                initial = resolve_updates({}, attributes)
            seq, now = self._next()
            op = SegmentMapOp(seq, now, self.accepted.next_segment_id, name, kind, initial)
            return self._log_op(op)
        return self._submit(make)

    def append(self, name: str, data: bytes,
               attribute_updates: Sequence[AttributeUpdate] = (),
               expected_offset: int | None = None,
               writer: tuple[int, int] | None = None) -> asyncio.Future[AppendResult]:
        """Append ``data`` (see :class:`~quire.segmentstore.SegmentStore.append`).

        The hot path, for a plain append and for one carrying only a
        writer's number (the wire server's): no closure, no operation
        object (a :data:`~quire.segmentstore.operations.PackedAppend`
        tuple), the accepted state updated in place (what
        :meth:`ContainerMetadata.apply` would do, its checks having been
        made here), the operation encoded with one ``struct`` call."""
        try:
            oplog = self._oplog
            if oplog._failure is not None or oplog._closed:
                oplog.check()
            accepted = self.accepted
            segment_id = accepted.by_name.get(name)
            if segment_id is None:
                raise SegmentNotFoundError(f"no segment {name!r}")
            s = accepted.segments[segment_id]
            if s.sealed or s.type is _TABLE:
                if s.sealed:
                    raise SegmentSealedError(f"segment {name!r} is sealed")
                raise SegmentStoreError(f"segment {name!r} is a table: use table_put")
            if type(data) is not bytes:
                data = bytes(data)
            size = len(data)
            if size > MAX_APPEND_BYTES:
                raise SegmentStoreError(f"an append is at most {MAX_APPEND_BYTES} bytes, "
                                        f"got {size}")
            offset = s.length
            if expected_offset is not None and expected_offset != offset and writer is None:
                # (with a writer, a duplicate is recognised before the offset is checked)
                raise BadOffsetError(f"segment {name!r}: expected offset {expected_offset}, "
                                     f"length is {offset}", expected_offset, offset)
            if not attribute_updates:
                sequence = accepted.sequence + 1
                now = self._clock_ms()
                end = offset + size
                if writer is None:
                    raw = _pack_plain_append(_PLAIN_APPEND_LENGTH + size, APPEND, sequence, now,
                                             segment_id, offset, 0, size) + data
                    queued: PackedAppend = (segment_id, offset, data, sequence, now, ())
                    result = AppendResult(end)
                    events = 1
                else:
                    wid, number = writer
                    if type(wid) is not int or not 0 <= wid < _KEY_LIMIT:
                        check_key(wid)
                    if type(number) is not int \
                            or not VALUE_MIN <= number <= VALUE_MAX:
                        check_value(number)
                    attributes = s.attributes
                    last = attributes.get(wid)
                    if last is not None and number <= last:
                        return oplog.barrier(AppendResult(offset, number, last,
                                                          duplicate=True))
                    if expected_offset is not None and expected_offset != offset:
                        raise BadOffsetError(f"segment {name!r}: expected offset "
                                             f"{expected_offset}, length is {offset}",
                                             expected_offset, offset)
                    raw = _pack_writer_append(_WRITER_APPEND_LENGTH + size, APPEND, sequence,
                                              now, segment_id, offset, 1, wid >> 64,
                                              wid & _LOW_64, number, size) + data
                    queued = (segment_id, offset, data, sequence, now,
                              ((wid, number),))
                    attributes[wid] = number
                    result = AppendResult(end, number, last)
                    events = 1 if last is None else number - last
                s.length = end
                s.last_modified_ms = now
                accepted.sequence = sequence
                self.rates.record(segment_id, size, events)
                future = oplog.add_encoded(queued, raw, result)
                self._bytes_since_checkpoint += size + 64
                if self._bytes_since_checkpoint >= self._checkpoint_every_bytes:
                    # its failure, if any, is the log's and reaches every later request
                    self._add_checkpoint().add_done_callback(_retrieve)
                return future
            extra: tuple[tuple[int, int], ...] = ()
            event_number = previous = None
            if writer is not None:
                writer_id, event_number = writer
                check_key(writer_id)
                check_value(event_number)
                previous = s.attributes.get(writer_id)
                if previous is not None and event_number <= previous:
                    return oplog.barrier(AppendResult(offset, event_number, previous,
                                                      duplicate=True))
                extra = ((writer_id, event_number),)
            if expected_offset is not None and expected_offset != offset:
                raise BadOffsetError(f"segment {name!r}: expected offset {expected_offset}, "
                                     f"length is {offset}", expected_offset, offset)
            resolved = resolve_updates(s.attributes, attribute_updates, extra)
            sequence = accepted.sequence + 1
            now = self._clock_ms()
            op = AppendOp(sequence, now, segment_id, offset, data, resolved)
            # accepted.apply(op), its checks made above
            s.length = offset + size
            if resolved:
                s.attributes.update(resolved)
            s.last_modified_ms = now
            accepted.sequence = sequence
            future = oplog.add(op, AppendResult(offset + size, event_number, previous))
            self._bytes_since_checkpoint += size + 64
            if self._bytes_since_checkpoint >= self._checkpoint_every_bytes:
                self._add_checkpoint().add_done_callback(_retrieve)
            return future
        except QuireError as e:
            failed: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
            failed.set_exception(e)
            return failed

    def seal(self, name: str) -> asyncio.Future[int]:
        """Seal the segment; the future gives its final length."""
        def make() -> asyncio.Future[int]:
            s = self._writable(name)
            seq, now = self._next()
            return self._log_op(SealOp(seq, now, s.segment_id), s.length)
        return self._submit(make)

    def truncate(self, name: str, offset: int) -> asyncio.Future[None]:
        """Drop the segment's data below ``offset`` (a no-op below its start)."""
        def make() -> asyncio.Future[None]:
            s = self._segment(name)
            if not 0 <= offset <= s.length:
                raise BadOffsetError(f"segment {name!r}: truncate at {offset}, length "
                                     f"{s.length}", offset, s.length)
            if offset <= s.start_offset:
                return self._oplog.barrier()
            seq, now = self._next()
            return self._log_op(TruncateOp(seq, now, s.segment_id, offset))
        return self._submit(make)

    def delete(self, name: str) -> asyncio.Future[None]:
        def make() -> asyncio.Future[None]:
            s = self._segment(name)
            seq, now = self._next()
            self.tables_accepted.pop(s.segment_id, None)
            return self._log_op(DeleteOp(seq, now, s.segment_id))
        return self._submit(make)

    def update_attributes(self, name: str,
                          updates: Sequence[AttributeUpdate]) -> asyncio.Future[None]:
        def make() -> asyncio.Future[None]:
            s = self._writable(name)
            resolved = resolve_updates(s.attributes, updates)
            if not resolved:
                return self._oplog.barrier()
            seq, now = self._next()
            return self._log_op(AttributesOp(seq, now, s.segment_id, resolved))
        return self._submit(make)

    def merge(self, target: str, source: str) -> asyncio.Future[MergeResult]:
        """Append all of ``source`` to ``target`` and remove ``source``
        (sealed first if it is not).  The source must not be truncated."""
        def make() -> asyncio.Future[MergeResult]:
            t = self._writable(target)
            src = self._segment(source)
            if src is t:
                raise SegmentStoreError(f"cannot merge segment {target!r} into itself")
            if SegmentType.TABLE in (t.type, src.type):
                raise SegmentStoreError("table segments are not merged (yet)")
            if src.start_offset != 0:
                raise SegmentTruncatedError(f"segment {source!r} is truncated: only a whole "
                                            f"segment can be merged", src.start_offset)
            if not src.sealed:
                seq, now = self._next()
                self._log_op(SealOp(seq, now, src.segment_id)).add_done_callback(_retrieve)
            seq, now = self._next()
            op = MergeOp(seq, now, t.segment_id, src.segment_id, t.length, src.length)
            return self._log_op(op, MergeResult(t.length + src.length))
        return self._submit(make)

    def create_transient_segment(self, parent: str, writer_id: int) -> asyncio.Future[str]:
        """Create a server-named segment of ``parent``'s (in this container);
        the future gives its name."""
        def make() -> asyncio.Future[str]:
            self._segment(parent)
            check_key(writer_id)
            name = f"{parent}#transient.{writer_id:032x}.{self.accepted.next_segment_id}"
            seq, now = self._next()
            op = SegmentMapOp(seq, now, self.accepted.next_segment_id, name,
                              SegmentType.TRANSIENT, ())
            return self._log_op(op, name)
        return self._submit(make)

    # --- tables ---------------------------------------------------------------------

    def _table(self, s: SegmentMetadata) -> TableIndex:
        if s.type is not SegmentType.TABLE:
            raise SegmentStoreError(f"segment {s.name!r} is not a table segment")
        table = self.tables_accepted.get(s.segment_id)
        if table is None:
            table = self.tables_accepted[s.segment_id] = TableIndex()
        return table

    def _table_batch(self, s: SegmentMetadata, table: TableIndex,
                     batch: Sequence[tuple[bytes, bytes | None]]) -> tuple[AppendOp, list[int]]:
        data, offsets = encode_batch(batch)
        if len(data) > MAX_APPEND_BYTES:
            raise SegmentStoreError(f"a table update is at most {MAX_APPEND_BYTES} bytes")
        seq, now = self._next()
        op = AppendOp(seq, now, s.segment_id, s.length, data)
        table.apply(data, s.length)
        return op, [s.length + o for o in offsets]

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> asyncio.Future[list[int]]:
        """Set keys to values, each if its expected version holds (None: any;
        ``tables.NOT_EXISTS``: must not exist; else exactly that version), all
        or nothing; the future gives the new versions, one per entry.  A key
        given more than once has each condition checked against the table
        before the batch; its last entry wins."""
        def make() -> asyncio.Future[list[int]]:
            s = self._writable(name)
            table = self._table(s)
            table.check_put(entries)
            if not entries:
                return self._oplog.barrier([])
            op, versions = self._table_batch(s, table, [(k, v) for k, v, _ in entries])
            return self._log_op(op, versions)
        return self._submit(make)

    def table_remove(self, name: str, keys: Sequence[tuple[bytes, int | None]]
                     ) -> asyncio.Future[None]:
        """Remove keys, each if its version holds (None: any, and a missing
        key is no error), all or nothing."""
        def make() -> asyncio.Future[None]:
            s = self._writable(name)
            table = self._table(s)
            table.check_put([(k, b"", v) for k, v in keys])
            present = [(k, None) for k, _ in keys if k in table.entries]
            if not present:
                return self._oplog.barrier()
            op, _versions = self._table_batch(s, table, present)
            return self._log_op(op)
        return self._submit(make)

    def _committed_table(self, name: str) -> tuple[SegmentMetadata, TableIndex]:
        s = self._committed(name)
        if s.type is not SegmentType.TABLE:
            raise SegmentStoreError(f"segment {name!r} is not a table segment")
        return s, self.tables_committed.get(s.segment_id) or TableIndex()

    async def table_get(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        """Each key's entry, or None if it does not exist."""
        _s, table = self._committed_table(name)
        out: list[TableEntry | None] = []
        for key in keys:
            found = table.entries.get(key)
            out.append(None if found is None else TableEntry(key, found[1], found[0]))
        return out

    async def table_iterate(self, name: str, keys_only: bool = False,
                            token: bytes | None = None,
                            max_entries: int = 1000) -> TableIteratorPage:
        """Up to ``max_entries`` entries in key order after ``token``."""
        _s, table = self._committed_table(name)
        keys = sorted(k for k in table.entries if token is None or k > token)[:max_entries]
        entries = [TableEntry(k, None if keys_only else table.entries[k][1],
                              table.entries[k][0]) for k in keys]
        done = len(keys) < max_entries
        return TableIteratorPage(entries, None if done or not keys else keys[-1])

    async def table_read_delta(self, name: str, from_position: int,
                               max_entries: int) -> TableDelta:
        """Live entries with version >= ``from_position`` (a version or a
        ``last_position`` given before), in version order."""
        s, table = self._committed_table(name)
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
            data = await self.read_index.read(s.segment_id, position,
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
                    raise ValueError(f"table {name!r}: no entry at {position}")
                chunk *= 2
        return TableDelta(entries, position, False)

    # --- reads (committed state) -------------------------------------------------

    def _committed(self, name: str) -> SegmentMetadata:
        self._oplog.check()
        s = self.committed.get(name)
        if s is None:
            raise SegmentNotFoundError(f"no segment {name!r}")
        return s

    async def get_info(self, name: str) -> SegmentInfo:
        return self._committed(name).info()

    async def get_attributes(self, name: str, keys: Iterable[int]) -> dict[int, int]:
        """The stored values of ``keys`` (absent keys are left out)."""
        attributes = self._committed(name).attributes
        return {k: attributes[k] for k in keys if k in attributes}

    async def read(self, name: str, offset: int, max_length: int,
                   wait_ms: int = 0) -> ReadResult:
        """Up to ``max_length`` bytes from ``offset``.  At the tail of an
        unsealed segment, waits up to ``wait_ms`` for data, then answers
        (possibly empty, ``at_tail``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            s = self._committed(name)
            if offset < s.start_offset:
                raise SegmentTruncatedError(
                    f"segment {name!r} starts at {s.start_offset}, read at {offset}",
                    s.start_offset)
            if offset > s.length or max_length < 0:
                raise BadOffsetError(f"segment {name!r}: read at {offset}, length {s.length}",
                                     offset, s.length)
            if offset < s.length and max_length > 0:
                segment_id = s.segment_id
                data = await self.read_index.read(segment_id, offset,
                                                  min(max_length, s.length - offset))
                s = self._committed(name)
                if offset < s.start_offset:
                    raise SegmentTruncatedError(
                        f"segment {name!r} starts at {s.start_offset}, read at {offset}",
                        s.start_offset)
                end = offset + len(data)
                return ReadResult(offset, data, end == s.length, end == s.length and s.sealed)
            if max_length == 0:
                at_tail = offset == s.length
                return ReadResult(offset, b"", at_tail, at_tail and s.sealed)
            remaining = deadline - loop.time()
            if s.sealed or remaining <= 0:
                return ReadResult(offset, b"", True, s.sealed)
            changed = self.read_index.changed(s.segment_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed, remaining)

    # --- lifecycle ---------------------------------------------------------------

    async def close(self) -> None:
        """Wait for the queued operations, then give up the log (idempotent)."""
        try:
            await self._oplog.close()
        except (ContainerFencedError, ContainerClosedError):
            pass
        except LogFencedError:
            pass
        finally:
            await self._log.close()
            self.read_index.notify_all()
