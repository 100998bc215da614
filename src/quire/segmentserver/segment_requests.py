"""Segment requests on one connection: reads, info and attributes, and the
segment lifecycle (create, seal, truncate, delete, merge)."""

from __future__ import annotations

import asyncio
import time

from quire.pravega_wire import (
    AppendTimeLocated,
    AppendTimesRead,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    DeleteSegment,
    DeleteTableSegment,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    LocateAppendTime,
    MergeSegments,
    ReadAppendTimes,
    ReadSegment,
    SealSegment,
    SealTableSegment,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentIsTruncated,
    SegmentPolicyUpdated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    StreamSegmentInfo,
    TableSegmentNotEmpty,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    WireCommand,
)
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import MAX_MESSAGE_CHARS, ClientConnection, Reply
from quire.segmentstore import (
    NULL_ATTRIBUTE_VALUE,
    AttributeUpdate,
    BadAttributeUpdateError,
    BadOffsetError,
    ReadResult,
    SegmentStore,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.segment_rates import policy_attributes


class SegmentRequests:
    """The segment requests of one connection (appends and tables aside)."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig,
                 connection: ClientConnection, metrics: SegmentServerMetrics | None) -> None:
        self._store = store
        self._config = config
        self._connection = connection
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()

    # --- reads ---------------------------------------------------------------------

    async def _read_at(self, segment: str, offset: int, length: int) -> ReadResult:
        """Like the store's read, but a read past the end of an unsealed
        segment waits (up to the tail wait) for the segment to reach it."""
        wait_ms = self._config.tail_read_wait_ms
        deadline = self._loop.time() + wait_ms / 1000
        waited = False
        while True:
            remaining_ms = max(0, int((deadline - self._loop.time()) * 1000))
            try:
                r = await self._store.read(segment, offset, length, 0)
                if not r.data and not r.end_of_segment and remaining_ms > 0:
                    waited = True
                    r = await self._store.read(segment, offset, length, remaining_ms)
                if r.data and r.at_tail and not r.end_of_segment:
                    return await self.burst(segment, offset, length, r, waited)
                return r
            except BadOffsetError:
                info = await self._store.get_info(segment)
                if offset <= info.length:
                    continue
                if info.sealed or remaining_ms == 0:
                    return ReadResult(offset, b"", True, info.sealed)
                waited = True
                await self._store.read(segment, info.length, 1, remaining_ms)

    async def burst(self, segment: str, offset: int, length: int, r: ReadResult,
                    waited: bool) -> ReadResult:
        """An answer that reaches the tail of a segment being written (it
        waited there, or the last append is younger than the linger) holds
        the appends of the burst, not only those landed so far: it goes
        once nothing more lands for the linger (at most five lingers in
        all, or once full).  The Pravega client hands out each answer as a
        slice, and has its next read answered before a slice is asked for:
        cut at the instant, the events a writer wrote in a row would come
        out one slice or two, as timing has it."""
        linger_ms = self._config.tail_read_linger_ms
        if not waited and linger_ms > 0:
            last_ms = (await self._store.get_info(segment)).last_modified_ms
            if self._store.clock.wall_ms() - last_ms >= linger_ms:
                return r
        linger_s = linger_ms / 1000
        stop = self._loop.time() + 5 * linger_s
        while len(r.data) < length:
            left_ms = int(min(linger_s, stop - self._loop.time()) * 1000)
            if left_ms <= 0 or not (await self._store.read(segment, offset + len(r.data), 1,
                                                           left_ms)).data:
                break
            r = await self._store.read(segment, offset, length, 0)
        return await self._store.read(segment, offset, length, 0)

    def read_segment(self, c: ReadSegment) -> None:
        length = min(self._config.max_read_bytes, max(1, c.suggested_length))

        metrics, started = self._metrics, time.perf_counter()

        async def read() -> WireCommand:
            r = await self._read_at(c.segment, c.offset, length)
            if metrics is not None:
                metrics.read_latency.observe(time.perf_counter() - started)
                metrics.bytes_read.inc(len(r.data))
            # the reply's offset is the request's, always: the client asserts it
            return SegmentRead(c.segment, c.offset, r.at_tail, r.end_of_segment, r.data,
                               c.request_id)
        self._connection.reply(read, lambda reply: reply, c.request_id, c.segment, c.offset,
                               cost=length, reads_only=True)

    def get_info(self, c: GetStreamSegmentInfo) -> None:
        async def info() -> WireCommand:
            i = await self._store.get_info(c.segment_name)
            return StreamSegmentInfo(c.request_id, c.segment_name, True, i.sealed, i.deleted,
                                     i.last_modified_ms, i.length, i.start_offset)
        self._connection.reply(info, lambda reply: reply, c.request_id, c.segment_name,
                               reads_only=True)

    def read_append_times(self, c: ReadAppendTimes) -> None:
        """Quire's own: when the bytes ``start .. end`` were appended."""
        async def times() -> WireCommand:
            info = await self._store.get_info(c.segment)
            entries = await self._store.append_times(c.segment, c.start, c.end)
            return AppendTimesRead(c.request_id, c.segment, info.storage_length,
                                   tuple(o for o, _ in entries), tuple(t for _, t in entries))
        self._connection.reply(times, lambda reply: reply, c.request_id, c.segment, c.start,
                               reads_only=True)

    def locate_append_time(self, c: LocateAppendTime) -> None:
        """Quire's own: where the first append at or after ``time_ms`` starts."""
        async def locate() -> WireCommand:
            offset = await self._store.locate_append_time(c.segment, c.time_ms)
            return AppendTimeLocated(c.request_id, c.segment, offset)
        self._connection.reply(locate, lambda reply: reply, c.request_id, c.segment,
                               reads_only=True)

    def get_attribute(self, c: GetSegmentAttribute) -> None:
        async def get() -> WireCommand:
            found = await self._store.get_attributes(c.segment_name, [c.attribute_id])
            return SegmentAttribute(c.request_id,
                                    found.get(c.attribute_id, NULL_ATTRIBUTE_VALUE))
        self._connection.reply(get, lambda reply: reply, c.request_id, c.segment_name,
                               reads_only=True)

    def update_attribute(self, c: UpdateSegmentAttribute) -> None:
        def refused(error: BaseException) -> Reply:
            if isinstance(error, BadAttributeUpdateError):
                return SegmentAttributeUpdated(c.request_id, False)
            return None
        self._connection.reply(
            lambda: self._store.update_attributes(c.segment_name, [AttributeUpdate(
                c.attribute_id, UpdateType.REPLACE_IF_EQUALS, c.new_value, c.expected_value)]),
            lambda _: SegmentAttributeUpdated(c.request_id, True),
            c.request_id, c.segment_name, on_error=refused)

    # --- segment lifecycle ------------------------------------------------------------

    def create_segment(self, c: CreateSegment) -> None:
        policy = policy_attributes(c.scale_type, c.target_rate) if c.scale_type else None
        self._connection.reply(
            lambda: self._store.create_segment(c.segment, SegmentType.STREAM, policy),
            lambda _: SegmentCreated(c.request_id, c.segment), c.request_id, c.segment)

    def update_policy(self, c: UpdateSegmentPolicy) -> None:
        self._connection.reply(
            lambda: self._store.update_segment_policy(c.segment, c.scale_type, c.target_rate),
            lambda _: SegmentPolicyUpdated(c.request_id, c.segment), c.request_id, c.segment)

    def create_table_segment(self, c: CreateTableSegment) -> None:
        self._connection.reply(lambda: self._store.create_segment(c.segment, SegmentType.TABLE),
                               lambda _: SegmentCreated(c.request_id, c.segment), c.request_id,
                               c.segment)

    def create_transient_segment(self, c: CreateTransientSegment) -> None:
        self._connection.reply(
            lambda: self._store.create_transient_segment(c.segment, c.writer_id),
            lambda name: SegmentCreated(c.request_id, name), c.request_id, c.segment)

    def seal(self, c: SealSegment | SealTableSegment) -> None:
        self._connection.reply(lambda: self._store.seal(c.segment),
                               lambda _: SegmentSealed(c.request_id, c.segment), c.request_id,
                               c.segment)

    def truncate(self, c: TruncateSegment) -> None:
        def past_the_end(error: BaseException) -> Reply:
            # as Pravega's server answers it: the segment's length in start_offset
            if isinstance(error, BadOffsetError):
                return SegmentIsTruncated(c.request_id, c.segment, error.actual_offset,
                                          str(error)[:MAX_MESSAGE_CHARS], c.truncation_offset)
            return None
        self._connection.reply(lambda: self._store.truncate(c.segment, c.truncation_offset),
                               lambda _: SegmentTruncated(c.request_id, c.segment),
                               c.request_id, c.segment, c.truncation_offset,
                               on_error=past_the_end)

    def delete(self, c: DeleteSegment | DeleteTableSegment) -> None:
        self._connection.reply(lambda: self._store.delete(c.segment),
                               lambda _: SegmentDeleted(c.request_id, c.segment), c.request_id,
                               c.segment)

    def delete_table(self, c: DeleteTableSegment) -> None:
        if not c.must_be_empty:
            self.delete(c)
            return

        async def delete_if_empty() -> WireCommand:
            # checked then deleted: a key put in between (on another
            # connection) is deleted with the table
            page = await self._store.table_iterate(c.segment, keys_only=True, max_entries=1)
            if page.entries:
                return TableSegmentNotEmpty(c.request_id, c.segment, "")
            await self._store.delete(c.segment)
            return SegmentDeleted(c.request_id, c.segment)
        self._connection.reply(delete_if_empty, lambda reply: reply, c.request_id, c.segment)

    def merge(self, c: MergeSegments) -> None:
        # errors name the source, as Pravega's server does
        self._connection.reply(
            lambda: self._store.merge(c.target, c.source),
            lambda r: SegmentsMerged(c.request_id, c.target, c.source, r.target_length),
            c.request_id, c.source)
