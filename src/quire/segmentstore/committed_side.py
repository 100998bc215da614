"""A container's committed side: what its tier-1 log holds durably.

:class:`CommittedSide` keeps one container's *committed* state: the
metadata of every operation whose frame is durable (:attr:`~CommittedSide.metadata`),
their data (:attr:`~CommittedSide.read_index`), the checkpoints still in
the log and the merges its storage writer has yet to take.  The container
owns it (``SegmentContainer.committed_side``) and reads and
``get_info`` see only it; the storage writer reads it through
:class:`~quire.segmentstore.writer_source.ContainerWriterSource`.

**Replay.**  Opening a container replays its log here
(:meth:`~CommittedSide.replay`): a checkpoint operation restores the whole
metadata, every other operation is applied as it was live.

**Commits.**  When the container's
:class:`~quire.segmentstore.operation_log.OperationLog` has a frame durable,
it hands the frame's operations here (:meth:`~CommittedSide.commit_frame`,
one call per frame; the appends the container's hot path packed as tuples
are applied inline), and only then acknowledges them.  Each is applied to
the metadata and the read index; a table update also goes to the
container's :class:`~quire.segmentstore.container_tables.ContainerTables`.

**Truncation.**  With tier-2 (``tier2_read``), the log is truncated below a
checkpoint once every byte the checkpoint counts is in tier-2
(:meth:`~CommittedSide.truncate_log`, called by the storage writer).
Replay then starts at that checkpoint: bytes below it are read from tier-2
(the read index's ``fetch_tier2``), and each table's index is rebuilt from
its whole data.  :attr:`~CommittedSide.tier1_bytes` is what the log holds
now: the bytes of its frames from the last truncation point (as replayed,
then as committed).

**Forgetting.**  A checkpoint may leave out deleted segments nothing refers
to any more (their tier-2 data and records are gone): the container drops
them from its accepted state as it writes the checkpoint, and they leave
the committed state when the checkpoint commits (:attr:`~CommittedSide.purge_at`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quire.errors import CorruptRecordError
from quire.log import DurableDataLog, Position
from quire.segmentstore.append_times import AppendTimes, Tier2Times
from quire.segmentstore.container_tables import ContainerTables
from quire.segmentstore.metadata import ContainerMetadata, apply_append
from quire.segmentstore.operation_log import Pending, read_frame, read_operations
from quire.segmentstore.operations import (
    AppendOp,
    AttributesOp,
    CheckpointOp,
    DeleteOp,
    MergeOp,
    Operation,
    SealOp,
    TruncateOp,
    as_operation,
)
from quire.segmentstore.read_index import ReadIndex
from quire.segmentstore.types import SegmentType

Tier2Read = Callable[[int, str, int, int], Awaitable[bytes]]
"""``tier2_read(segment_id, name, offset, length)``: up to ``length`` bytes of
the segment from ``offset`` out of tier-2 (b"" where tier-2 has none)."""
_LAST_ENTRY = (1 << 63) - 1


class CommittedSide:
    """One container's committed state (see the module docstring).

    ``tables`` are the container's; their committed indexes follow the
    committed table updates."""

    def __init__(self, container_id: int, log: DurableDataLog, read_index_budget_bytes: int,
                 tables: ContainerTables, tier2_read: Tier2Read | None = None) -> None:
        self.container_id = container_id
        self._log = log
        self._tables = tables
        self.metadata = ContainerMetadata(container_id)
        """The committed metadata (replaced only while replaying)."""
        self.read_index = ReadIndex(self._fetch, read_index_budget_bytes)
        self.append_times = AppendTimes()
        """When the committed bytes not yet in tier-2 were appended."""
        self.tier2_times: Tier2Times | None = None
        """When the bytes in tier-2 were appended (set by the storage writer)."""
        self.tier2_read: Tier2Read | None = None
        """Where bytes no longer in memory or tier-1 are read (None: no tier-2)."""
        if tier2_read is not None:
            self.read_from_tier2(tier2_read)
        self.merges: list[tuple[int, int, int, int]] = []
        """Committed merges ``(target id, source id, target offset, length)``
        for the storage writer to take (kept only with tier-2)."""
        self.checkpoints: list[tuple[int, Position, dict[int, int], int]] = []
        """Committed checkpoints still in the log, oldest first: (sequence,
        address, each live segment's length then, the log's bytes before
        its frame): where the log may be cut."""
        self.log_bytes = 0
        """Bytes of the log's frames from its first record, as replayed and committed."""
        self.truncated_bytes = 0
        """Of :attr:`log_bytes`, those below the last truncation."""
        self.purge_at: dict[int, set[int]] = {}
        """Checkpoint sequence -> the deleted segments it leaves out."""
        self.after_truncation: Callable[[], None] | None = None
        """Called once the log was truncated."""

    @property
    def tier1_bytes(self) -> int:
        """What the tier-1 log holds now (its bytes from the truncation point)."""
        return self.log_bytes - self.truncated_bytes

    def bytes_committed(self, size: int) -> None:
        """A frame of ``size`` bytes is durable (the operation log's call)."""
        self.log_bytes += size

    async def replay(self) -> None:
        """Apply the log (on opening, before anything is accepted); after a
        truncated log, rebuild the tables' indexes."""
        committed = self.metadata
        started = truncated = False
        async for address, ops in read_operations(self._log, counted=self.bytes_committed):
            for op in ops:
                if not started:
                    # a truncated log starts in the frame of its first checkpoint
                    if not isinstance(op, CheckpointOp) and op.sequence != 1:
                        continue
                    started = True
                    truncated = op.sequence != 1
                if isinstance(op, CheckpointOp):
                    restored = ContainerMetadata.restore(op.checkpoint)
                    if committed.sequence not in (0, restored.sequence):
                        raise CorruptRecordError(
                            f"container {self.container_id}: checkpoint after "
                            f"{restored.sequence} found after {committed.sequence}")
                    self.metadata = committed = restored
                    # a merge whose source or target the checkpoint left out was
                    # in tier-2 before it was forgotten: not the writer's to do
                    self.merges = [m for m in self.merges
                                   if m[0] in restored.segments and m[1] in restored.segments]
                committed.apply(op)
                self._index(op, address)
        self.append_times.seed(committed.segments.values())
        if truncated:
            await self._tables.rebuild()

    # --- tier-2 ---------------------------------------------------------------------

    def read_from_tier2(self, read: Tier2Read) -> None:
        """From now on, read what neither memory nor tier-1 holds through ``read``."""
        self.tier2_read = read
        self.read_index.fetch_tier2 = self.fetch_tier2

    async def fetch_tier2(self, segment_id: int, offset: int, length: int) -> bytes:
        """The read index's way to tier-2 (see :data:`Tier2Read`)."""
        s = self.metadata.segments.get(segment_id)
        if s is None or self.tier2_read is None:
            return b""
        return await self.tier2_read(segment_id, s.name, offset, length)

    def flushed(self, segment_id: int, length: int) -> None:
        """Tier-2 holds the segment's bytes below ``length``: its
        ``storage_length`` says so, and the read index may let them go."""
        self.metadata.segments[segment_id].storage_length = length
        self.read_index.flushed(segment_id, length)
        self.append_times.flushed(segment_id, length)

    async def truncate_log(self, in_tier2: Callable[[int, int], bool]) -> int | None:
        """Truncate the log below the newest checkpoint whose every segment
        length ``(segment_id, length)`` is ``in_tier2``; its sequence (None
        if no checkpoint qualifies).  The checkpoint's own frame stays: a
        reopen starts there."""
        for i in range(len(self.checkpoints) - 1, -1, -1):
            sequence, address, lengths, mark = self.checkpoints[i]
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
        self.truncated_bytes = max(self.truncated_bytes, mark)
        if self.after_truncation is not None:
            self.after_truncation()
        return sequence

    # --- commits --------------------------------------------------------------------

    def commit_frame(self, batch: list[Pending], address: Position) -> None:
        """Each operation of a durable frame, in order (see :meth:`commit`);
        the appends the hot path packed as tuples are applied inline."""
        committed = self.metadata
        segments = committed.segments
        index_append = self.read_index.append
        note_time = self.append_times.note
        commit = self.commit
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
                    or op_sequence != sequence:  # (what committed.apply checks)
                committed.sequence = sequence - 1
                commit(as_operation(op), address)  # raises the error that says what is wrong
                raise AssertionError(f"operation {op_sequence} does not fit")
            if timestamp_ms != s.last_modified_ms:  # a new time: rare (once a ms at most)
                note_time(segment_id, offset, timestamp_ms)
            apply_append(s, offset + len(data), attributes, timestamp_ms)
            index_append(segment_id, offset, data, address)
        committed.sequence = sequence

    def commit(self, op: Operation, address: Position) -> None:
        """Apply one durable operation (its frame at ``address``)."""
        if isinstance(op, CheckpointOp):
            self.metadata.sequence = op.sequence  # the committed state is what it holds
            gone = self.purge_at.pop(op.sequence, None)
            if gone:
                self.metadata.purge(gone)
            self._remember_checkpoint(op, address)
        else:
            self.metadata.apply(op)
            self._index(op, address)

    def _remember_checkpoint(self, op: CheckpointOp, address: Position) -> None:
        self.checkpoints.append((op.sequence, address, {
            s.segment_id: s.length for s in self.metadata.segments.values() if not s.deleted},
            self.log_bytes))

    def _index(self, op: Operation, address: Position) -> None:
        self.append_times.apply(op, self.metadata.segments)
        if isinstance(op, AppendOp):
            if self.metadata.segments[op.segment_id].type is SegmentType.TABLE:
                self._tables.committed_append(op.segment_id, op.offset, op.data)
            self.read_index.append(op.segment_id, op.offset, op.data, address)
        elif isinstance(op, TruncateOp):
            self.read_index.truncate(op.segment_id, op.start_offset)
        elif isinstance(op, DeleteOp):
            self._tables.forget_committed(op.segment_id)
            self.read_index.delete(op.segment_id)
        elif isinstance(op, MergeOp):
            self.read_index.merge(op.target_id, op.source_id, op.target_offset, op.length)
            if self.tier2_read is not None:
                self.merges.append((op.target_id, op.source_id, op.target_offset, op.length))
        elif isinstance(op, SealOp | AttributesOp):
            self.read_index.notify(op.segment_id)
        elif isinstance(op, CheckpointOp):
            self._remember_checkpoint(op, address)

    def failed(self, _error: BaseException) -> None:
        """The log failed (the container with it): wake every waiting reader,
        who finds the failure."""
        self.read_index.notify_all()

    async def _fetch(self, segment_id: int, offset: int, length: int,
                     address: Position) -> bytes:
        """The segment's bytes [offset, offset + length) from the frame at ``address``."""
        parts = [op.data for op in await read_frame(self._log, address)
                 if isinstance(op, AppendOp) and op.segment_id == segment_id
                 and offset <= op.offset < offset + length]
        data = b"".join(parts)
        if len(data) != length:
            raise CorruptRecordError(f"segment {segment_id}: frame {address} holds {len(data)} "
                                     f"of the {length} bytes at {offset}")
        return data
