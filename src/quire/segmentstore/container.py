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
the committed state, then acknowledged.  The committed state is the
container's :attr:`SegmentContainer.committed_side`
(:class:`~quire.segmentstore.committed_side.CommittedSide`): the committed
metadata and read index, the log's replay at opening, the commits, the
checkpoints still in the log and its truncation below them (with tier-2).
Reads and ``get_info`` see only the committed state.  A failed tier-1
append fails the container (every later call fails with the same error); it
must be reopened, which replays the log.

Opening a container takes its log (fencing the previous owner), replays it
and writes a checkpoint, which also proves the log is still ours.

Table requests are served by the container's :attr:`SegmentContainer.tables`
(:class:`~quire.segmentstore.container_tables.ContainerTables`) on its
segments; the committed side hands it each committed table update.

With tier-2, the container's tier-1 log has a ceiling
(:attr:`ContainerConfig.tier1_ceiling_bytes`): past it the appends'
acknowledgements are held (:mod:`~quire.segmentstore.throttle`).  Its
storage writer may quarantine a segment (:meth:`SegmentContainer.quarantine`)
and lets it drop deleted segments (:meth:`SegmentContainer.forget`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quire.clock import SYSTEM_CLOCK, Clock
from quire.errors import (
    BadOffsetError,
    ContainerFencedError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentQuarantinedError,
    SegmentSealedError,
    SegmentStoreError,
    SegmentTruncatedError,
)
from quire.log import DurableDataLog, LogFencedError
from quire.segmentstore import frames
from quire.segmentstore.append_times import TimeEntries, locate_time, segment_times
from quire.segmentstore.attribute_updates import initial_attributes, resolve_updates
from quire.segmentstore.committed_side import CommittedSide, Tier2Read
from quire.segmentstore.container_tables import ContainerTables
from quire.segmentstore.container_upkeep import ContainerUpkeep
from quire.segmentstore.futures import call_as_future, refused, retrieve
from quire.segmentstore.metadata import ContainerMetadata, SegmentMetadata, apply_append
from quire.segmentstore.names import check_name
from quire.segmentstore.operation_log import OperationLog
from quire.segmentstore.operations import (
    APPEND,
    PLAIN_APPEND_HEAD,
    WRITER_APPEND_HEAD,
    AppendOp,
    Attributes,
    AttributesOp,
    DeleteOp,
    MergeOp,
    PackedAppend,
    SealOp,
    SegmentMapOp,
    TruncateOp,
)
from quire.segmentstore.throttle import Tier1Throttle
from quire.segmentstore.types import (
    ATTRIBUTE_KEY_LIMIT,
    MAX_APPEND_BYTES,
    QUARANTINED_ATTRIBUTE,
    VALUE_MAX,
    VALUE_MIN,
    AppendResult,
    AttributeUpdate,
    MergeResult,
    ReadResult,
    SegmentInfo,
    SegmentType,
    check_key,
    check_value,
)

_TABLE = SegmentType.TABLE
_pack_plain_append = PLAIN_APPEND_HEAD.pack
_PLAIN_APPEND_LENGTH = PLAIN_APPEND_HEAD.size - 4
"""An APPEND's length in a frame without its data (the length prefix not counted)."""
_pack_writer_append = WRITER_APPEND_HEAD.pack
_WRITER_APPEND_LENGTH = WRITER_APPEND_HEAD.size - 4
"""The same for an APPEND carrying one attribute (a writer's number)."""
_KEY_LIMIT = ATTRIBUTE_KEY_LIMIT
_LOW_64 = (1 << 64) - 1


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
    tier1_ceiling_bytes: int = 2 << 30
    """With tier-2: what the tier-1 log may hold before appends are
    acknowledged only as tier-2 takes the backlog (half of it: flush all)."""


def sealed_error(s: SegmentMetadata) -> SegmentSealedError:
    """The refusal of a change to sealed segment ``s`` (quarantined or not)."""
    if QUARANTINED_ATTRIBUTE in s.attributes:
        return SegmentQuarantinedError(f"segment {s.name!r} is quarantined: tier-2 refused "
                                       "it, so it was sealed with every byte acknowledged")
    return SegmentSealedError(f"segment {s.name!r} is sealed")


class SegmentContainer(ContainerUpkeep):
    """One container on its tier-1 log; get one with :meth:`open`."""

    def __init__(self, container_id: int, log: DurableDataLog, config: ContainerConfig,
                 clock: Clock, tier2_read: Tier2Read | None = None) -> None:
        self.container_id = container_id
        self._log = log
        self._clock_ms = clock.wall_ms
        self._stamp_ms = 0
        self.tables = ContainerTables(self)
        """The table requests on this container's segments, and their indexes."""
        side = CommittedSide(container_id, log, config.read_index_budget_bytes, self.tables,
                             tier2_read)
        self.committed_side: CommittedSide = side
        """The committed state: what the log holds durably (see the module docstring)."""
        self.read_index = side.read_index
        """The committed data (the committed side's)."""
        self.accepted = side.metadata
        """The accepted state: every operation queued so far (a copy of the
        committed state made once the log is replayed)."""
        self.throttle = Tier1Throttle(container_id, config.tier1_ceiling_bytes,
                                      lambda: side.tier1_bytes, clock.wall_ms)
        """The tier-1 ceiling (active with tier-2)."""
        side.after_truncation = self.throttle.update
        self._forgettable: set[int] = set()
        self._oplog = OperationLog(log, side.commit, max_frame_bytes=config.max_frame_bytes,
                                   max_frames_in_flight=config.max_frames_in_flight,
                                   cut_ops=config.frame_cut_ops,
                                   cut_bytes=config.frame_cut_bytes,
                                   on_failure=side.failed,
                                   on_frame_committed=side.commit_frame,
                                   checkpoint_every_bytes=config.checkpoint_every_bytes,
                                   on_checkpoint_due=self._checkpoint_due,
                                   on_bytes_committed=self._bytes_committed)

    @property
    def epoch(self) -> int:
        return self._log.epoch

    @property
    def committed(self) -> ContainerMetadata:
        """The committed metadata (the committed side's)."""
        return self.committed_side.metadata

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
            await container.committed_side.replay()
            container.accepted = container.committed.copy()
            container._stamp_ms = max((s.last_modified_ms for s in
                                       container.accepted.segments.values()), default=0)
            container.tables.accept_committed()
            container.throttle.active = tier2_read is not None
            await container._add_checkpoint()
        except LogFencedError as e:
            await log.close()
            raise ContainerFencedError(f"container {container_id}: fenced while opening") from e
        except BaseException:
            await log.close()
            raise
        return container

    # --- requests ------------------------------------------------------------

    def writable_segment(self, name: str) -> SegmentMetadata:
        """The accepted segment ``name``: SegmentNotFoundError if there is
        none, SegmentSealedError if it is sealed, the container's failure
        if it failed."""
        s = self._segment(name)
        if s.sealed:
            raise sealed_error(s)
        return s

    def log_append(self, s: SegmentMetadata, data: bytes, result: object) -> asyncio.Future[Any]:
        """Accept and log an append of ``data`` at accepted segment ``s``'s
        length (checked by the caller); the future gives ``result`` once it
        is durable."""
        seq, now = self._next()
        return self._log_op(AppendOp(seq, now, s.segment_id, s.length, data), result)

    def log_truncate(self, s: SegmentMetadata, offset: int) -> asyncio.Future[Any]:
        """Accept and log a truncation of accepted segment ``s`` at ``offset``
        (checked by the caller: a table's compaction)."""
        seq, now = self._next()
        return self._log_op(TruncateOp(seq, now, s.segment_id, offset))

    def barrier(self, result: object = None) -> asyncio.Future[Any]:
        """A future giving ``result`` once every operation accepted so far is durable."""
        return self._oplog.barrier(result)

    def create_segment(self, name: str, segment_type: SegmentType = SegmentType.STREAM,
                       attributes: Mapping[int, int] | Sequence[AttributeUpdate] | None = None,
                       ) -> asyncio.Future[None]:
        """Create a segment (SegmentExistsError if the name is taken)."""
        def make() -> asyncio.Future[None]:
            self._oplog.check()
            check_name("segment", name)
            if self.accepted.get(name) is not None:
                raise SegmentExistsError(f"segment {name!r} exists")
            kind = SegmentType(segment_type)
            initial = initial_attributes(attributes)
            seq, now = self._next()
            op = SegmentMapOp(seq, now, self.accepted.next_segment_id, name, kind, initial)
            return self._log_op(op)
        return call_as_future(make, self._oplog.barrier)

    def append(self, name: str, data: bytes,
               attribute_updates: Sequence[AttributeUpdate] = (),
               expected_offset: int | None = None,
               writer: tuple[int, int] | None = None) -> asyncio.Future[AppendResult]:
        """Append ``data`` (see :class:`~quire.segmentstore.SegmentStore.append`).

        The hot path, for a plain append and for one carrying only a
        writer's number (the wire server's): no closure, no operation
        object (a :data:`~quire.segmentstore.operations.PackedAppend`
        tuple), the accepted state updated in place by
        :func:`~quire.segmentstore.metadata.apply_append` (the checks
        :meth:`ContainerMetadata.apply` would make having been made here),
        the operation encoded with one ``struct`` call."""
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
                    raise sealed_error(s)
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
                now = self._clock_ms()  # (self._stamp(), inline: the hot path)
                if now > self._stamp_ms:
                    self._stamp_ms = now
                else:
                    now = self._stamp_ms
                end = offset + size
                if writer is None:
                    raw = _pack_plain_append(_PLAIN_APPEND_LENGTH + size, APPEND, sequence, now,
                                             segment_id, offset, 0, size) + data
                    changed: Attributes = ()
                    queued: PackedAppend = (segment_id, offset, data, sequence, now, changed)
                    result = AppendResult(end)
                    events = 1
                else:
                    wid, number = writer
                    if type(wid) is not int or not 0 <= wid < _KEY_LIMIT:
                        check_key(wid)
                    if type(number) is not int \
                            or not VALUE_MIN <= number <= VALUE_MAX:
                        check_value(number)
                    last = s.attributes.get(wid)
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
                    changed = ((wid, number),)
                    queued = (segment_id, offset, data, sequence, now, changed)
                    result = AppendResult(end, number, last)
                    events = 1 if last is None else number - last
                apply_append(s, end, changed, now)
                accepted.sequence = sequence
                s.appended_bytes += size  # auto-scaling's counts (segment_rates)
                s.appended_events += events
                if self.throttle.throttled:
                    return self.throttle.hold(oplog.add_encoded(queued, raw, result, size))
                return oplog.add_encoded(queued, raw, result, size)
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
            now = self._stamp()
            op = AppendOp(sequence, now, segment_id, offset, data, resolved)
            apply_append(s, offset + size, resolved, now)  # accepted.apply(op): checked above
            accepted.sequence = sequence
            added = oplog.add(op, AppendResult(offset + size, event_number, previous))
            return self.throttle.hold(added) if self.throttle.throttled else added
        except QuireError as e:  # (as call_as_future answers: once what was accepted is durable)
            return refused(e, self._oplog.barrier)

    def seal(self, name: str) -> asyncio.Future[int]:
        """Seal the segment; the future gives its final length."""
        def make() -> asyncio.Future[int]:
            s = self.writable_segment(name)
            seq, now = self._next()
            return self._log_op(SealOp(seq, now, s.segment_id), s.length)
        return call_as_future(make, self._oplog.barrier)

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
        return call_as_future(make, self._oplog.barrier)

    def delete(self, name: str) -> asyncio.Future[None]:
        def make() -> asyncio.Future[None]:
            s = self._segment(name)
            seq, now = self._next()
            self.tables.forget_accepted(s.segment_id)
            return self._log_op(DeleteOp(seq, now, s.segment_id))
        return call_as_future(make, self._oplog.barrier)

    def update_attributes(self, name: str,
                          updates: Sequence[AttributeUpdate]) -> asyncio.Future[None]:
        def make() -> asyncio.Future[None]:
            s = self.writable_segment(name)
            resolved = resolve_updates(s.attributes, updates)
            if not resolved:
                return self._oplog.barrier()
            seq, now = self._next()
            return self._log_op(AttributesOp(seq, now, s.segment_id, resolved))
        return call_as_future(make, self._oplog.barrier)

    def merge(self, target: str, source: str) -> asyncio.Future[MergeResult]:
        """Append all of ``source`` to ``target`` and remove ``source``
        (sealed first if it is not).  The source must not be truncated.
        No such source is answered only once ownership is confirmed through
        tier-1: a commit retried takes it for "merged already", which an
        owner that has not noticed another took its container over (paused
        past its lease, say) must not say of a source the new owner made."""
        def make() -> asyncio.Future[MergeResult]:
            t = self.writable_segment(target)
            try:
                src = self._segment(source)
            except SegmentNotFoundError as e:
                return self._refused_as_owner(e)
            if src is t:
                raise SegmentStoreError(f"cannot merge segment {target!r} into itself")
            if SegmentType.TABLE in (t.type, src.type):
                raise SegmentStoreError("table segments are not merged (yet)")
            if src.start_offset != 0:
                raise SegmentTruncatedError(f"segment {source!r} is truncated: only a whole "
                                            f"segment can be merged", src.start_offset)
            if not src.sealed:
                seq, now = self._next()
                self._log_op(SealOp(seq, now, src.segment_id)).add_done_callback(retrieve)
            seq, now = self._next()
            op = MergeOp(seq, now, t.segment_id, src.segment_id, t.length, src.length)
            return self._log_op(op, MergeResult(t.length + src.length))
        return call_as_future(make, self._oplog.barrier)

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
        return call_as_future(make, self._oplog.barrier)

    # --- tables ---------------------------------------------------------------------

    def table_put(self, name: str, entries: Sequence[tuple[bytes, bytes, int | None]]
                  ) -> asyncio.Future[list[int]]:
        """:meth:`ContainerTables.put` (under the name the store and the
        storage writer's source give it)."""
        return self.tables.put(name, entries)

    # --- reads (committed state) -------------------------------------------------

    def committed_segment(self, name: str) -> SegmentMetadata:
        """The committed segment ``name`` (SegmentNotFoundError if there is
        none, the container's failure if it failed)."""
        self._oplog.check()
        s = self.committed_side.metadata.get(name)
        if s is None:
            raise SegmentNotFoundError(f"no segment {name!r}")
        return s

    async def get_info(self, name: str) -> SegmentInfo:
        return self.committed_segment(name).info()

    async def get_attributes(self, name: str, keys: Iterable[int]) -> dict[int, int]:
        """The stored values of ``keys`` (absent keys are left out)."""
        attributes = self.committed_segment(name).attributes
        return {k: attributes[k] for k in keys if k in attributes}

    async def read(self, name: str, offset: int, max_length: int,
                   wait_ms: int = 0) -> ReadResult:
        """Up to ``max_length`` bytes from ``offset``.  At the tail of an
        unsealed segment, waits up to ``wait_ms`` for data, then answers
        (possibly empty, ``at_tail``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            s = self.committed_segment(name)
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
                s = self.committed_segment(name)
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

    async def append_times(self, name: str, start: int, end: int) -> TimeEntries:
        """When the segment's bytes ``start .. end`` were appended
        (:func:`~quire.segmentstore.append_times.segment_times`)."""
        side = self.committed_side
        return await segment_times(side.append_times, side.tier2_times,
                                   self.committed_segment(name), start, end)

    async def locate_append_time(self, name: str, time_ms: int) -> int:
        """Where the segment's first append at or after ``time_ms`` starts."""
        side = self.committed_side
        return await locate_time(side.append_times, side.tier2_times,
                                 self.committed_segment(name), time_ms)
