"""The wire server: one :class:`WireConnection` per client connection over a
:class:`~quire.segmentstore.SegmentStore` (behaviour in :mod:`quire.segmentserver`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from quire.errors import (
    BadAttributeUpdateError,
    BadOffsetError,
    ConfigError,
    ContainerClosedError,
    ContainerFencedError,
    ContainerNotOwnedError,
    QuireError,
    SegmentExistsError,
    SegmentNotFoundError,
    SegmentSealedError,
    SegmentTruncatedError,
    TableKeyBadVersionError,
    TableKeyNotFoundError,
    WireCommandError,
)
from quire.pravega_wire import (
    KEY_NO_VERSION,
    KEY_NOT_EXISTS,
    MAX_WIRECOMMAND_SIZE,
    NO_EVENT_NUMBER,
    OLDEST_COMPATIBLE_VERSION,
    REQUEST_TYPES,
    WIRE_VERSION,
    AppendBlockEnd,
    AppendSetup,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    DataAppended,
    Decoder,
    DeleteSegment,
    DeleteTableSegment,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    Hello,
    KeepAlive,
    MergeSegments,
    MergeTableSegments,
    NoSuchSegment,
    OperationUnsupported,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SealTableSegment,
    SegmentAlreadyExists,
    SegmentAttribute,
    SegmentAttributeUpdated,
    SegmentCreated,
    SegmentDeleted,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentPolicyUpdated,
    SegmentRead,
    SegmentSealed,
    SegmentsMerged,
    SegmentTruncated,
    SetupAppend,
    StreamSegmentInfo,
    TableEntriesDeltaRead,
    TableEntriesRead,
    TableEntriesUpdated,
    TableKey,
    TableKeyBadVersion,
    TableKeyDoesNotExist,
    TableKeysRead,
    TableKeysRemoved,
    TableRead,
    TableSegmentNotEmpty,
    TableValue,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
    WrongHost,
)
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentstore import (
    NOT_EXISTS,
    AppendResult,
    AttributeUpdate,
    ReadResult,
    SegmentStore,
    SegmentType,
    UpdateType,
)
from quire.segmentstore.segment_rates import policy_attributes
from quire.segmentstore.types import NULL_ATTRIBUTE_VALUE

log = logging.getLogger("quire.segmentserver")

Reply = WireCommand | None
"""What a request is answered with; None: close the connection instead."""
Formatter = Callable[["asyncio.Future[Any]"], Reply]
_MAX_MESSAGE_CHARS = 1000
"""An error's text sent as a reply's ``server_stack_trace`` is cut to this."""
"""An event inside an AppendBlockEnd's data: type 0, length (then the bytes)."""


@dataclass(frozen=True)
class SegmentServerConfig:
    max_frame_bytes: int = MAX_WIRECOMMAND_SIZE
    """Largest request payload taken; a longer one closes the connection
    (refused from its header, before it is buffered)."""
    max_outstanding_requests: int = 1024
    """Unanswered requests on one connection above which it is no longer
    read (resumed at half)."""
    tail_read_wait_ms: int = 5_000
    """How long a read at the tail of an unsealed segment waits for data
    before it is answered empty (``at_tail``); the client times out at 30 s."""
    tail_read_linger_ms: int = 10
    """Once data reached a read waiting at the tail, how long more must stay
    away before it is answered (0: answer at once); see ``_burst``."""
    max_read_bytes: int = 2 * 1024 * 1024
    """Most bytes one SegmentRead carries (and table reads, roughly)."""
    max_table_entries_per_read: int = 1_000
    """Most entries or keys one table read answers, whatever was suggested."""

    def __post_init__(self) -> None:
        if not 8 <= self.max_frame_bytes <= MAX_WIRECOMMAND_SIZE:
            raise ConfigError(f"max_frame_bytes must be in 8..{MAX_WIRECOMMAND_SIZE}")
        if self.max_outstanding_requests < 1:
            raise ConfigError("max_outstanding_requests must be positive")
        if not 0 <= self.tail_read_wait_ms < 30_000:
            raise ConfigError("tail_read_wait_ms must be in 0..29999 (the client waits 30 s)")
        if not 0 <= self.tail_read_linger_ms <= 1_000:
            raise ConfigError("tail_read_linger_ms must be in 0..1000")
        if not 1 <= self.max_read_bytes <= MAX_WIRECOMMAND_SIZE // 2:
            raise ConfigError("max_read_bytes must be in 1..half the largest frame")
        if self.max_table_entries_per_read < 1:
            raise ConfigError("max_table_entries_per_read must be positive")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _expected_version(key_version: int) -> int | None:
    """A wire key version as the store's expected version."""
    if key_version == KEY_NO_VERSION:
        return None
    if key_version == KEY_NOT_EXISTS:
        return NOT_EXISTS
    return key_version


def _previous(result: AppendResult) -> int:
    if result.previous_event_number is None:
        return NO_EVENT_NUMBER
    return result.previous_event_number


def _error_reply(error: BaseException, request_id: int, segment: str, offset: int) -> Reply:
    """The reply Pravega's client understands for a store error (None: close)."""
    message = str(error)[:_MAX_MESSAGE_CHARS]
    if isinstance(error, ContainerNotOwnedError | ContainerFencedError | ContainerClosedError):
        return WrongHost(request_id, segment, "", message)
    if isinstance(error, SegmentNotFoundError):
        return NoSuchSegment(request_id, segment, message, offset)
    if isinstance(error, SegmentSealedError):
        return SegmentIsSealed(request_id, segment, message, offset)
    if isinstance(error, SegmentTruncatedError):
        return SegmentIsTruncated(request_id, segment, error.start_offset, message, offset)
    if isinstance(error, SegmentExistsError):
        return SegmentAlreadyExists(request_id, segment, message)
    if isinstance(error, TableKeyBadVersionError):
        return TableKeyBadVersion(request_id, segment, message)
    if isinstance(error, TableKeyNotFoundError):
        return TableKeyDoesNotExist(request_id, segment, message)
    if isinstance(error, QuireError):
        log.warning("request %d on %r refused: %s; closing the connection",
                    request_id, segment, error)
    else:
        log.error("request %d on %r failed; closing the connection", request_id, segment,
                  exc_info=error)
    return None


class WireConnection(asyncio.Protocol):
    """One client connection: decodes requests, hands each to the store on
    arrival, answers in arrival order (see :mod:`quire.segmentserver`).

    ``_pending`` holds, in arrival order, each unanswered request's future
    (the store's, or a task's for reads) and how to turn its outcome into the
    reply; ``_writers`` maps each writer id set up on this connection to its
    segment (AppendBlockEnd and ConditionalBlockEnd name only the writer);
    ``appenders``, shared by the server's connections, maps each (writer id,
    segment) to the connection it was last set up on."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig,
                 on_lost: Callable[[WireConnection], None],
                 appenders: dict[tuple[int, str], WireConnection],
                 metrics: SegmentServerMetrics | None = None) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        self._on_lost = on_lost
        self._appenders = appenders
        self._decoder = Decoder(REQUEST_TYPES, config.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._greeted = False
        self._paused = False
        self._pending: deque[tuple[asyncio.Future[Any], Formatter]] = deque()
        self._writers: dict[int, str] = {}
        self._loop = asyncio.get_running_loop()
        self._handlers: dict[type[WireCommand], Callable[[Any], None]] = {
            Hello: self._hello,
            KeepAlive: self._keep_alive,
            SetupAppend: self._setup_append,
            AppendBlockEnd: self._append_block_end,
            ConditionalBlockEnd: self._conditional_block_end,
            ReadSegment: self._read_segment,
            GetStreamSegmentInfo: self._get_info,
            GetSegmentAttribute: self._get_attribute,
            UpdateSegmentAttribute: self._update_attribute,
            CreateSegment: self._create_segment,
            CreateTableSegment: self._create_table_segment,
            CreateTransientSegment: self._create_transient_segment,
            SealSegment: self._seal,
            SealTableSegment: self._seal,
            TruncateSegment: self._truncate,
            DeleteSegment: self._delete,
            DeleteTableSegment: self._delete_table,
            MergeSegments: self._merge,
            UpdateTableEntries: self._update_table,
            RemoveTableKeys: self._remove_keys,
            ReadTable: self._read_table,
            ReadTableKeys: self._read_table_keys,
            ReadTableEntries: self._read_table_entries,
            ReadTableEntriesDelta: self._read_table_delta,
            UpdateSegmentPolicy: self._update_policy,
            MergeTableSegments: self._unsupported,
        }

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION).encode())

    def data_received(self, data: bytes) -> None:
        try:
            self._decoder.feed(data)
            while self._transport is not None:
                command = self._decoder.next()
                if command is None:
                    return
                if not self._greeted and type(command) is not Hello:
                    self._close(f"{type(command).__name__} before Hello")
                    return
                self._handlers[type(command)](command)
        except WireCommandError as e:
            self._close(f"malformed input: {e}")
        except Exception:  # a defect here: this connection only pays for it
            log.exception("handling a request failed")
            self._close("a request could not be handled")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        for writer_id, segment in self._writers.items():
            if self._appenders.get((writer_id, segment)) is self:
                del self._appenders[writer_id, segment]
        for future, _ in self._pending:
            if isinstance(future, asyncio.Task):
                future.cancel()
            future.add_done_callback(_retrieve)
        self._pending.clear()
        self._on_lost(self)

    # --- replies, in arrival order ---------------------------------------------------

    def _close(self, why: str) -> None:
        if self._transport is not None:
            log.warning("closing connection from %s: %s",
                        self._transport.get_extra_info("peername"), why)
            self._transport.close()
            self._transport = None

    def abort(self) -> None:
        """Drop the connection now, unread bytes and unsent replies with it."""
        if self._transport is not None:
            self._transport.abort()

    def _push(self, future: asyncio.Future[Any], formatter: Formatter) -> None:
        self._pending.append((future, formatter))
        future.add_done_callback(self._flush)
        if not self._paused and len(self._pending) > self._config.max_outstanding_requests:
            assert self._transport is not None
            self._transport.pause_reading()
            self._paused = True

    def _reply(self, request: Callable[[], Any], ok: Callable[[Any], WireCommand],
               request_id: int, segment: str, offset: int = -1,
               on_error: Callable[[BaseException], Reply] | None = None) -> None:
        """Call ``request`` now (the store orders it), answer ``ok(result)``
        or the error's reply when its turn comes."""
        def formatter(future: asyncio.Future[Any]) -> Reply:
            if future.cancelled():
                return None
            error = future.exception()
            if error is None:
                return ok(future.result())
            reply: Reply = None
            if on_error is not None:
                reply = on_error(error)
            if reply is None:
                reply = _error_reply(error, request_id, segment, offset)
            if reply is not None and self._metrics is not None:
                self._metrics.refused.labels(type(reply).__name__).inc()
            return reply
        try:
            future = request()
        except QuireError as e:  # refused before the store took it
            future = self._loop.create_future()
            future.set_exception(e)
        if asyncio.iscoroutine(future):
            future = self._loop.create_task(future)
        self._push(future, formatter)

    def _answer(self, reply: WireCommand) -> None:
        """A reply known at once (still sent after those before it)."""
        future = self._loop.create_future()
        future.set_result(reply)
        self._push(future, asyncio.Future.result)

    def _flush(self, _done: asyncio.Future[Any] | None = None) -> None:
        pending = self._pending
        out: list[bytes] = []
        while pending and pending[0][0].done() and self._transport is not None:
            future, formatter = pending.popleft()
            try:
                reply = formatter(future)
                encoded = None if reply is None else reply.encode()
            except Exception:  # a defect here: this connection only pays for it
                log.exception("answering a request failed")
                encoded = None
            if encoded is None:
                self._transport.write(b"".join(out))
                self._close("a request failed in a way no reply describes")
                return
            out.append(encoded)
        if self._transport is None:
            return
        if out:
            self._transport.write(b"".join(out))
        if self._paused and len(pending) <= self._config.max_outstanding_requests // 2:
            self._paused = False
            self._transport.resume_reading()

    # --- handshake ---------------------------------------------------------------

    def _hello(self, c: Hello) -> None:
        if self._greeted:
            return
        if c.low_version > WIRE_VERSION or c.high_version < OLDEST_COMPATIBLE_VERSION:
            self._close(f"client versions {c.low_version}..{c.high_version} do not meet "
                        f"ours {OLDEST_COMPATIBLE_VERSION}..{WIRE_VERSION}")
            return
        self._greeted = True

    def _keep_alive(self, _c: KeepAlive) -> None:
        self._answer(KeepAlive())

    def _unsupported(self, c: MergeTableSegments) -> None:
        self._answer(OperationUnsupported(c.request_id, type(c).__name__, ""))

    # --- appends ------------------------------------------------------------------

    def _setup_append(self, c: SetupAppend) -> None:
        # The writer's number must count every append accepted before this
        # request (say, sent on a connection that has just dropped), or the
        # client resends them in a block numbered higher, which is then no
        # duplicate: an empty attribute update is a barrier, done when all
        # the operations accepted before it are durable (SegmentIsSealed or
        # NoSuchSegment if it is not writable).
        # A writer set up again on a new connection has left its old one
        # (Pravega's writer keeps one connection per segment): that one is
        # dropped now, so that no block still unread on it lands after this
        # setup's answer, where the barrier below would not count it.
        previous = self._appenders.get((c.writer_id, c.segment))
        if previous is not None and previous is not self:
            previous.abort()
        self._appenders[c.writer_id, c.segment] = self
        barrier = self._store.update_attributes(c.segment, ())
        barrier.add_done_callback(_retrieve)  # also when the connection drops first

        async def setup() -> WireCommand:
            await barrier
            info = await self._store.get_info(c.segment)
            if info.sealed:
                return SegmentIsSealed(c.request_id, c.segment, "", -1)
            self._writers[c.writer_id] = c.segment
            return AppendSetup(c.request_id, c.segment, c.writer_id,
                               info.attributes.get(c.writer_id, NO_EVENT_NUMBER))
        self._reply(setup, lambda reply: reply, c.request_id, c.segment)

    def _writer_segment(self, writer_id: int, what: str) -> str | None:
        segment = self._writers.get(writer_id)
        if segment is None:
            self._close(f"{what} from writer {writer_id:x}, not set up on this connection")
        return segment

    def _append_block_end(self, c: AppendBlockEnd) -> None:
        segment = self._writer_segment(c.writer_id, "AppendBlockEnd")
        if segment is None:
            return
        if c.size_of_whole_events != len(c.data):
            self._close(f"AppendBlockEnd of {len(c.data)} bytes says {c.size_of_whole_events} "
                        "are whole events (partial events are not supported)")
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
            return DataAppended(c.writer_id, c.last_event_number, _previous(r), c.request_id,
                                r.length)
        self._reply(
            lambda: self._store.append(segment, c.data, writer=(c.writer_id,
                                                                 c.last_event_number)),
            appended, c.request_id, segment)

    def _conditional_block_end(self, c: ConditionalBlockEnd) -> None:
        segment = self._writer_segment(c.writer_id, "ConditionalBlockEnd")
        if segment is None:
            return

        def check_failed(error: BaseException) -> Reply:
            if isinstance(error, BadOffsetError):
                return ConditionalCheckFailed(c.writer_id, c.event_number, c.request_id)
            return None
        self._reply(
            lambda: self._store.append(segment, c.data, expected_offset=c.expected_offset,
                                       writer=(c.writer_id, c.event_number)),
            lambda r: DataAppended(c.writer_id, c.event_number, _previous(r), c.request_id,
                                   r.length),
            c.request_id, segment, on_error=check_failed)

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
                    return await self._burst(segment, offset, length, r, waited)
                return r
            except BadOffsetError:
                info = await self._store.get_info(segment)
                if offset <= info.length:
                    continue
                if info.sealed or remaining_ms == 0:
                    return ReadResult(offset, b"", True, info.sealed)
                waited = True
                await self._store.read(segment, info.length, 1, remaining_ms)

    async def _burst(self, segment: str, offset: int, length: int, r: ReadResult,
                     waited: bool) -> ReadResult:
        """An answer that reaches the tail of a segment being written (it
        waited there, or the last append is younger than the linger) holds
        the appends of the burst, not only those landed so far: it goes
        once nothing more lands for the linger (at most five lingers in
        all, or once full).  The Pravega client hands out each answer as a
        slice, and has its next read answered before a slice is asked for:
        cut at the instant, the events a writer wrote in a row would come
        out one slice or two, as timing has it."""
        linger_s = self._config.tail_read_linger_ms / 1000
        if not waited and linger_s > 0:
            age_ms = time.time() * 1000 - (await self._store.get_info(segment)).last_modified_ms
            if age_ms >= self._config.tail_read_linger_ms:
                return r
        stop = self._loop.time() + 5 * linger_s
        while len(r.data) < length:
            left_ms = int(min(linger_s, stop - self._loop.time()) * 1000)
            if left_ms <= 0 or not (await self._store.read(segment, offset + len(r.data), 1,
                                                           left_ms)).data:
                break
            r = await self._store.read(segment, offset, length, 0)
        return await self._store.read(segment, offset, length, 0)

    def _read_segment(self, c: ReadSegment) -> None:
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
        self._reply(read, lambda reply: reply, c.request_id, c.segment, c.offset)

    def _get_info(self, c: GetStreamSegmentInfo) -> None:
        async def info() -> WireCommand:
            i = await self._store.get_info(c.segment_name)
            return StreamSegmentInfo(c.request_id, c.segment_name, True, i.sealed, i.deleted,
                                     i.last_modified_ms, i.length, i.start_offset)
        self._reply(info, lambda reply: reply, c.request_id, c.segment_name)

    def _get_attribute(self, c: GetSegmentAttribute) -> None:
        async def get() -> WireCommand:
            found = await self._store.get_attributes(c.segment_name, [c.attribute_id])
            return SegmentAttribute(c.request_id,
                                    found.get(c.attribute_id, NULL_ATTRIBUTE_VALUE))
        self._reply(get, lambda reply: reply, c.request_id, c.segment_name)

    def _update_attribute(self, c: UpdateSegmentAttribute) -> None:
        def refused(error: BaseException) -> Reply:
            if isinstance(error, BadAttributeUpdateError):
                return SegmentAttributeUpdated(c.request_id, False)
            return None
        self._reply(
            lambda: self._store.update_attributes(c.segment_name, [AttributeUpdate(
                c.attribute_id, UpdateType.REPLACE_IF_EQUALS, c.new_value, c.expected_value)]),
            lambda _: SegmentAttributeUpdated(c.request_id, True),
            c.request_id, c.segment_name, on_error=refused)

    # --- segment lifecycle ------------------------------------------------------------

    def _create_segment(self, c: CreateSegment) -> None:
        policy = policy_attributes(c.scale_type, c.target_rate) if c.scale_type else None
        self._reply(lambda: self._store.create_segment(c.segment, SegmentType.STREAM, policy),
                    lambda _: SegmentCreated(c.request_id, c.segment), c.request_id, c.segment)

    def _update_policy(self, c: UpdateSegmentPolicy) -> None:
        self._reply(lambda: self._store.update_segment_policy(c.segment, c.scale_type,
                                                              c.target_rate),
                    lambda _: SegmentPolicyUpdated(c.request_id, c.segment), c.request_id,
                    c.segment)

    def _create_table_segment(self, c: CreateTableSegment) -> None:
        self._reply(lambda: self._store.create_segment(c.segment, SegmentType.TABLE),
                    lambda _: SegmentCreated(c.request_id, c.segment), c.request_id, c.segment)

    def _create_transient_segment(self, c: CreateTransientSegment) -> None:
        self._reply(lambda: self._store.create_transient_segment(c.segment, c.writer_id),
                    lambda name: SegmentCreated(c.request_id, name), c.request_id, c.segment)

    def _seal(self, c: SealSegment | SealTableSegment) -> None:
        self._reply(lambda: self._store.seal(c.segment),
                    lambda _: SegmentSealed(c.request_id, c.segment), c.request_id, c.segment)

    def _truncate(self, c: TruncateSegment) -> None:
        def past_the_end(error: BaseException) -> Reply:
            # as Pravega's server answers it: the segment's length in start_offset
            if isinstance(error, BadOffsetError):
                return SegmentIsTruncated(c.request_id, c.segment, error.actual_offset,
                                          str(error)[:_MAX_MESSAGE_CHARS], c.truncation_offset)
            return None
        self._reply(lambda: self._store.truncate(c.segment, c.truncation_offset),
                    lambda _: SegmentTruncated(c.request_id, c.segment), c.request_id,
                    c.segment, c.truncation_offset, on_error=past_the_end)

    def _delete(self, c: DeleteSegment) -> None:
        self._reply(lambda: self._store.delete(c.segment),
                    lambda _: SegmentDeleted(c.request_id, c.segment), c.request_id, c.segment)

    def _delete_table(self, c: DeleteTableSegment) -> None:
        if not c.must_be_empty:
            self._reply(lambda: self._store.delete(c.segment),
                        lambda _: SegmentDeleted(c.request_id, c.segment), c.request_id,
                        c.segment)
            return

        async def delete_if_empty() -> WireCommand:
            # checked then deleted: a key put in between (on another
            # connection) is deleted with the table
            page = await self._store.table_iterate(c.segment, keys_only=True, max_entries=1)
            if page.entries:
                return TableSegmentNotEmpty(c.request_id, c.segment, "")
            await self._store.delete(c.segment)
            return SegmentDeleted(c.request_id, c.segment)
        self._reply(delete_if_empty, lambda reply: reply, c.request_id, c.segment)

    def _merge(self, c: MergeSegments) -> None:
        # errors name the source, as Pravega's server does
        self._reply(lambda: self._store.merge(c.target, c.source),
                    lambda r: SegmentsMerged(c.request_id, c.target, c.source, r.target_length),
                    c.request_id, c.source)

    # --- tables -----------------------------------------------------------------------

    def _update_table(self, c: UpdateTableEntries) -> None:
        if c.table_segment_offset != -1:
            self._answer(OperationUnsupported(c.request_id, "conditional table segment offset",
                                              ""))
            return
        entries = [(k.data, v.data, _expected_version(k.key_version))
                   for k, v in c.table_entries]
        self._reply(lambda: self._store.table_put(c.segment, entries),
                    lambda versions: TableEntriesUpdated(c.request_id, tuple(versions)),
                    c.request_id, c.segment)

    def _remove_keys(self, c: RemoveTableKeys) -> None:
        if c.table_segment_offset != -1:
            self._answer(OperationUnsupported(c.request_id, "conditional table segment offset",
                                              ""))
            return
        keys = [(k.data, _expected_version(k.key_version)) for k in c.keys]
        self._reply(lambda: self._store.table_remove(c.segment, keys),
                    lambda _: TableKeysRemoved(c.request_id, c.segment),
                    c.request_id, c.segment)

    def _read_table(self, c: ReadTable) -> None:
        async def read() -> WireCommand:
            found = await self._store.table_get(c.segment, [k.data for k in c.keys])
            entries = tuple(
                (TableKey(k.data, KEY_NOT_EXISTS), TableValue(b"")) if e is None
                else (TableKey(e.key, e.version), TableValue(e.value or b""))
                for k, e in zip(c.keys, found, strict=True))
            return TableRead(c.request_id, c.segment, entries)
        self._reply(read, lambda reply: reply, c.request_id, c.segment)

    def _count(self, suggested: int) -> int:
        return min(max(1, suggested), self._config.max_table_entries_per_read)

    def _read_table_keys(self, c: ReadTableKeys) -> None:
        async def read() -> WireCommand:
            page = await self._store.table_iterate(c.segment, True, c.continuation_token or None,
                                                   self._count(c.suggested_key_count))
            keys = tuple(TableKey(e.key, e.version) for e in page.entries)
            return TableKeysRead(c.request_id, c.segment, keys,
                                 keys[-1].data if keys else c.continuation_token)
        self._reply(read, lambda reply: reply, c.request_id, c.segment)

    def _read_table_entries(self, c: ReadTableEntries) -> None:
        async def read() -> WireCommand:
            page = await self._store.table_iterate(c.segment, False,
                                                   c.continuation_token or None,
                                                   self._count(c.suggested_entry_count))
            entries = tuple((TableKey(e.key, e.version), TableValue(e.value or b""))
                            for e in page.entries)
            return TableEntriesRead(c.request_id, c.segment, entries,
                                    entries[-1][0].data if entries else c.continuation_token)
        self._reply(read, lambda reply: reply, c.request_id, c.segment)

    def _read_table_delta(self, c: ReadTableEntriesDelta) -> None:
        async def read() -> WireCommand:
            delta = await self._store.table_read_delta(c.segment, c.from_position,
                                                       self._count(c.suggested_entry_count))
            entries: list[tuple[TableKey, TableValue]] = []
            last_position = delta.last_position
            size = 0
            for e in delta.entries:
                value = e.value or b""
                size += len(e.key) + len(value) + 24
                if entries and size > self._config.max_read_bytes:
                    last_position = e.version  # the next read starts at this entry
                    break
                entries.append((TableKey(e.key, e.version), TableValue(value)))
            length = (await self._store.get_info(c.segment)).length
            return TableEntriesDeltaRead(c.request_id, c.segment, tuple(entries),
                                         delta.should_clear, last_position >= length,
                                         last_position)
        self._reply(read, lambda reply: reply, c.request_id, c.segment)


class SegmentServer:
    """Serves one :class:`~quire.segmentstore.SegmentStore` on a TCP port."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig | None = None,
                 metrics: SegmentServerMetrics | None = None) -> None:
        self.metrics = metrics
        self.store = store
        self.config = config or SegmentServerConfig()
        self._server: asyncio.Server | None = None
        self._connections: set[WireConnection] = set()
        self._appenders: dict[tuple[int, str], WireConnection] = {}
        self.host = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (port 0: any free one; :attr:`port` says which)."""
        if self._server is not None:
            raise ConfigError("the segment server is started already")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._connection, host, port)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    def _connection(self) -> WireConnection:
        connection = WireConnection(self.store, self.config, self._connections.discard,
                                    self._appenders, self.metrics)
        self._connections.add(connection)
        return connection

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def abort_connections(self) -> int:
        """Drop every client connection now, still listening (clients
        reconnect and set their appends up again); how many were dropped."""
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        return len(connections)

    async def close(self) -> None:
        """Stop listening and drop every connection (the store stays open)."""
        if self._server is None:
            return
        self._server.close()
        self.abort_connections()
        await self._server.wait_closed()
        self._server = None
