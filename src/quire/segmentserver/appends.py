"""Appends on one connection: SetupAppend, AppendBlockEnd, ConditionalBlockEnd."""

from __future__ import annotations

import contextlib
import time

from quire.pravega_wire import (
    NO_EVENT_NUMBER,
    AppendBlockEnd,
    AppendSetup,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    DataAppended,
    SetupAppend,
    WireCommand,
)
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import ClientConnection, Reply
from quire.segmentstore import AppendResult, BadOffsetError, SegmentSealedError, SegmentStore
from quire.segmentstore.futures import retrieve

SEAL_WAIT_MS = 1000
"""A setup on a segment being sealed looks again this often (woken sooner
by the seal)."""


def _previous(result: AppendResult) -> int:
    if result.previous_event_number is None:
        return NO_EVENT_NUMBER
    return result.previous_event_number


class AppendRequests:
    """The append requests of one connection.

    ``_writers`` maps each writer id set up on this connection to its
    segment (AppendBlockEnd and ConditionalBlockEnd name only the writer);
    ``appenders``, shared by the server's connections, maps each (writer id,
    segment) to the connection it was last set up on."""

    def __init__(self, store: SegmentStore, connection: ClientConnection,
                 appenders: dict[tuple[int, str], ClientConnection],
                 metrics: SegmentServerMetrics | None) -> None:
        self._store = store
        self._connection = connection
        self._appenders = appenders
        self._metrics = metrics
        self._writers: dict[int, str] = {}

    def forget_writers(self) -> None:
        """The connection is lost: it is no longer any writer's appender."""
        for writer_id, segment in self._writers.items():
            if self._appenders.get((writer_id, segment)) is self._connection:
                del self._appenders[writer_id, segment]

    def setup_append(self, c: SetupAppend) -> None:
        # The writer's number must count every append accepted before this
        # request (say, sent on a connection that has just dropped), or the
        # client resends them in a block numbered higher, which is then no
        # duplicate: an empty attribute update is a barrier, done when all
        # the operations accepted before it are durable (NoSuchSegment if
        # there is no such segment).
        # A writer set up again on a new connection has left its old one
        # (Pravega's writer keeps one connection per segment): that one is
        # dropped now, so that no block still unread on it lands after this
        # setup's answer, where the barrier below would not count it.
        # A sealed segment answers the writer's number too (as Pravega's
        # server does), once its seal is durable (and with it every append
        # accepted before it): the writer learns which of its blocks the
        # segment has, and sends its successors only the others (each block
        # it sends here is answered SegmentIsSealed).  Answering
        # SegmentIsSealed to the setup would make it send them all there.
        previous = self._appenders.get((c.writer_id, c.segment))
        if previous is not None and previous is not self._connection:
            previous.abort()
        self._appenders[c.writer_id, c.segment] = self._connection
        barrier = self._store.update_attributes(c.segment, ())
        barrier.add_done_callback(retrieve)  # also when the connection drops first

        async def setup() -> WireCommand:
            with contextlib.suppress(SegmentSealedError):
                await barrier
            info = await self._store.get_info(c.segment)
            while not info.sealed and barrier.exception() is not None:
                # sealed, the seal not yet durable: a read at the end wakes when it is
                await self._store.read(c.segment, info.length, 1, SEAL_WAIT_MS)
                info = await self._store.get_info(c.segment)
            self._writers[c.writer_id] = c.segment
            return AppendSetup(c.request_id, c.segment, c.writer_id,
                               info.attributes.get(c.writer_id, NO_EVENT_NUMBER))
        self._connection.reply(setup, lambda reply: reply, c.request_id, c.segment)

    def _writer_segment(self, writer_id: int, what: str) -> str | None:
        segment = self._writers.get(writer_id)
        if segment is None:
            self._connection.close(f"{what} from writer {writer_id:x}, not set up on this "
                                   "connection")
        return segment

    def append_block_end(self, c: AppendBlockEnd) -> None:
        segment = self._writer_segment(c.writer_id, "AppendBlockEnd")
        if segment is None:
            return
        if c.size_of_whole_events != len(c.data):
            self._connection.close(f"AppendBlockEnd of {len(c.data)} bytes says "
                                   f"{c.size_of_whole_events} are whole events (partial events "
                                   "are not supported)")
            return
        # One store append, whatever its size: a frame is at most
        # MAX_WIRECOMMAND_SIZE, under the store's MAX_APPEND_BYTES (larger
        # appends are written as part frames), so a block lands whole or not
        # at all and its writer number says which.
        metrics, started = self._metrics, time.perf_counter()

        def appended(r: AppendResult) -> WireCommand:
            if metrics is not None:
                metrics.append_latency.observe(time.perf_counter() - started)
                if not r.duplicate:
                    metrics.events.inc(c.num_event)
                    metrics.bytes_appended.inc(len(c.data))
                    totals = metrics.segment_totals.get(segment)
                    if totals is None:
                        totals = metrics.segment_totals[segment] = [0, 0]
                    totals[0] += c.num_event
                    totals[1] += len(c.data)
            return DataAppended(c.writer_id, c.last_event_number, _previous(r), c.request_id,
                                r.length)
        self._connection.reply(
            lambda: self._store.append(segment, c.data, writer=(c.writer_id,
                                                                c.last_event_number)),
            appended, c.request_id, segment, cost=len(c.data))

    def conditional_block_end(self, c: ConditionalBlockEnd) -> None:
        segment = self._writer_segment(c.writer_id, "ConditionalBlockEnd")
        if segment is None:
            return

        def check_failed(error: BaseException) -> Reply:
            if isinstance(error, BadOffsetError):
                return ConditionalCheckFailed(c.writer_id, c.event_number, c.request_id)
            return None
        self._connection.reply(
            lambda: self._store.append(segment, c.data, expected_offset=c.expected_offset,
                                       writer=(c.writer_id, c.event_number)),
            lambda r: DataAppended(c.writer_id, c.event_number, _previous(r), c.request_id,
                                   r.length),
            c.request_id, segment, on_error=check_failed, cost=len(c.data))
