"""One client connection: framing, the handshake, replies in arrival order,
flow control (behaviour in :mod:`quire.segmentserver`).

:class:`WireConnection` decodes requests and hands each to its handler on
arrival: appends to :class:`~quire.segmentserver.appends.AppendRequests`,
segment requests to :class:`~quire.segmentserver.segment_requests.SegmentRequests`,
table requests to :class:`~quire.segmentserver.table_requests.TableRequests`;
they answer through it (:class:`~quire.segmentserver.replies.ClientConnection`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from quire.errors import ContainerClosedError, ContainerFencedError, QuireError, WireCommandError
from quire.pravega_wire import (
    OLDEST_COMPATIBLE_VERSION,
    REQUEST_TYPES,
    WIRE_VERSION,
    AppendBlockEnd,
    ConditionalBlockEnd,
    CreateSegment,
    CreateTableSegment,
    CreateTransientSegment,
    Decoder,
    DeleteSegment,
    DeleteTableSegment,
    GetSegmentAttribute,
    GetStreamSegmentInfo,
    Hello,
    KeepAlive,
    LocateAppendTime,
    MergeSegments,
    MergeTableSegments,
    OperationUnsupported,
    ReadAppendTimes,
    ReadSegment,
    ReadTable,
    ReadTableEntries,
    ReadTableEntriesDelta,
    ReadTableKeys,
    RemoveTableKeys,
    SealSegment,
    SealTableSegment,
    SetupAppend,
    TruncateSegment,
    UpdateSegmentAttribute,
    UpdateSegmentPolicy,
    UpdateTableEntries,
    WireCommand,
)
from quire.segmentserver.appends import AppendRequests
from quire.segmentserver.auth import WireAuth
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import ClientConnection, Formatter, Reply, error_reply, log
from quire.segmentserver.segment_requests import SegmentRequests
from quire.segmentserver.table_requests import TableRequests
from quire.segmentstore import SegmentStore
from quire.segmentstore.futures import retrieve

LARGE_REPLY_BYTES = 1 << 16
"""Replies are joined into one write unless one is larger than this."""


class WireConnection(asyncio.Protocol):
    """One client connection: decodes requests, hands each to the store on
    arrival, answers in arrival order (see :mod:`quire.segmentserver`).

    ``_pending`` holds, in arrival order, each unanswered request's future
    (the store's, or a task's for reads) and how to turn its outcome into the
    reply; ``appenders``, shared by the server's connections, maps each
    (writer id, segment) to the connection it was last set up on."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig,
                 on_lost: Callable[[WireConnection], None],
                 appenders: dict[tuple[int, str], ClientConnection],
                 metrics: SegmentServerMetrics | None = None, *,
                 auth: WireAuth | None = None,
                 on_made: Callable[[WireConnection], None] | None = None) -> None:
        self._config = config
        self._metrics = metrics
        self._on_lost = on_lost
        self._on_made = on_made
        self._decoder = Decoder(REQUEST_TYPES, config.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self.peer: str = ""
        """The client's IP address, once connected."""
        self._greeted = False
        self._paused = False
        self._write_paused = False
        self._pending: deque[tuple[asyncio.Future[Any], Formatter, int]] = deque()
        self._pending_bytes = 0
        """The budget in use: the costs of the unanswered requests."""
        self._loop = asyncio.get_running_loop()
        self.opened_at = self._loop.time()
        self._progress_at = self.opened_at
        """When the frame being received began (or the last one ended)."""
        self._appends = AppendRequests(store, self, appenders, metrics)
        segments = SegmentRequests(store, config, self, metrics)
        tables = TableRequests(store, config, self)
        self._handlers: dict[type[WireCommand], Callable[[Any], None]] = {
            Hello: self._hello,
            KeepAlive: self._keep_alive,
            SetupAppend: self._appends.setup_append,
            AppendBlockEnd: self._appends.append_block_end,
            ConditionalBlockEnd: self._appends.conditional_block_end,
            ReadSegment: segments.read_segment,
            GetStreamSegmentInfo: segments.get_info,
            ReadAppendTimes: segments.read_append_times,
            LocateAppendTime: segments.locate_append_time,
            GetSegmentAttribute: segments.get_attribute,
            UpdateSegmentAttribute: segments.update_attribute,
            CreateSegment: segments.create_segment,
            CreateTableSegment: segments.create_table_segment,
            CreateTransientSegment: segments.create_transient_segment,
            SealSegment: segments.seal,
            SealTableSegment: segments.seal,
            TruncateSegment: segments.truncate,
            DeleteSegment: segments.delete,
            DeleteTableSegment: segments.delete_table,
            MergeSegments: segments.merge,
            UpdateTableEntries: tables.update_entries,
            RemoveTableKeys: tables.remove_keys,
            ReadTable: tables.read_table,
            ReadTableKeys: tables.read_keys,
            ReadTableEntries: tables.read_entries,
            ReadTableEntriesDelta: tables.read_delta,
            UpdateSegmentPolicy: segments.update_policy,
            MergeTableSegments: self._unsupported,
        }
        if auth is not None:
            self._handlers = auth.guard(self._handlers, self.refuse)

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self._on_made is not None:
            self._on_made(self)
        high = self._config.max_buffered_reply_bytes
        self._transport.set_write_buffer_limits(high=high, low=high // 4)
        self._transport.write(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION).encode())

    def data_received(self, data: bytes) -> None:
        decoder = self._decoder
        starting = decoder.buffered_bytes == 0
        try:
            decoder.feed(data)
        except WireCommandError as e:
            self.close(f"malformed input: {e}")
            return
        if self._dispatch() or starting:
            self._progress_at = self._loop.time()

    def _dispatch(self) -> int:
        """Hand the whole commands buffered to their handlers, until the
        connection pauses (a chunk may hold thousands of requests: those
        after the pause wait in the decoder); how many were handed on."""
        decoder = self._decoder
        decoded = 0
        try:
            while self._transport is not None and not self._paused:
                command = decoder.next()
                if command is None:
                    break
                decoded += 1
                if not self._greeted and type(command) is not Hello:
                    self.close(f"{type(command).__name__} before Hello")
                    break
                self._handlers[type(command)](command)
        except WireCommandError as e:
            self.close(f"malformed input: {e}")
        except Exception:  # a defect here: this connection only pays for it
            log.exception("handling a request failed")
            self.close("a request could not be handled")
        return decoded

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._appends.forget_writers()
        for future, _, _ in self._pending:
            if isinstance(future, asyncio.Task):
                future.cancel()
            future.add_done_callback(retrieve)
        self._pending.clear()
        self._pending_bytes = 0
        self._on_lost(self)

    def pause_writing(self) -> None:
        """The client is not taking its replies: stop reading its requests."""
        self._write_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._resume_if_drained()

    def stalled_since(self) -> float | None:
        """Since when this connection has owed the server its handshake (no
        Hello yet) or the rest of a frame it started; None if it owes nothing
        (or is closing, or paused: then the server is the one not reading)."""
        if self._transport is None:
            return None
        if not self._greeted:
            return self.opened_at
        if self._decoder.buffered_bytes and not self._paused:
            return self._progress_at
        return None

    # --- replies, in arrival order ---------------------------------------------------

    def close(self, why: str, quiet: bool = False) -> None:
        """Close the connection (what is written still goes out), saying why
        in the log (at debug level if ``quiet``: the caller logs for many)."""
        if self._transport is not None:
            (log.debug if quiet else log.warning)(
                "closing connection from %s: %s", self._transport.get_extra_info("peername"),
                why)
            self._transport.close()
            self._transport = None

    def abort(self) -> None:
        """Drop the connection now, unread bytes and unsent replies with it."""
        if self._transport is not None:
            self._transport.abort()

    def _push(self, future: asyncio.Future[Any], formatter: Formatter, cost: int = 0) -> None:
        self._pending.append((future, formatter, cost))
        self._pending_bytes += cost
        future.add_done_callback(self._flush)
        if not self._paused and (len(self._pending) > self._config.max_outstanding_requests
                                 or self._pending_bytes > self._config.max_outstanding_bytes):
            self._pause()

    def _pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True

    def _resume_if_drained(self) -> None:
        config = self._config
        if self._paused and not self._write_paused and self._transport is not None \
                and len(self._pending) <= config.max_outstanding_requests // 2 \
                and self._pending_bytes <= config.max_outstanding_bytes // 2 \
                and self._transport.get_write_buffer_size() < config.max_buffered_reply_bytes:
            self._paused = False
            self._transport.resume_reading()
            if self._decoder.buffered_bytes and self._dispatch():  # what waited while paused
                self._progress_at = self._loop.time()

    def reply(self, request: Callable[[], Any], ok: Callable[[Any], WireCommand],
              request_id: int, segment: str, offset: int = -1,
              on_error: Callable[[BaseException], Reply] | None = None,
              cost: int = 0, reads_only: bool = False) -> None:
        """Call ``request`` now (the store orders it), answer ``ok(result)``
        or the error's reply when its turn comes (see
        :class:`~quire.segmentserver.replies.ClientConnection`).
        ``reads_only`` marks requests that change nothing (kept for a later
        choice: answering them WrongHost when their container fails under
        them reshuffled the stream simulation and seed 145 lost liveness)."""
        def formatter(future: asyncio.Future[Any]) -> Reply:
            if future.cancelled():
                return None
            error = future.exception()
            if error is None:
                return ok(future.result())
            if taken and isinstance(error, ContainerClosedError | ContainerFencedError):
                # taken, then its container failed: its outcome is unknown, and
                # WrongHost would tell the client it was not applied (a retry
                # elsewhere finds it applied: BadVersion for a put that landed);
                # the connection closes instead, as for any unknown outcome
                return None
            reply: Reply = None
            if on_error is not None:
                reply = on_error(error)
            if reply is None:
                reply = error_reply(error, request_id, segment, offset)
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
        taken = not future.done()
        self._push(future, formatter, cost)

    def answer(self, reply: WireCommand) -> None:
        """A reply known at once (still sent after those before it)."""
        future = self._loop.create_future()
        future.set_result(reply)
        self._push(future, asyncio.Future.result)

    def refuse(self, reply: WireCommand) -> None:
        """Answer a refusal known at once (an AuthTokenCheckFailed), counted."""
        if self._metrics is not None:
            self._metrics.refused.labels(type(reply).__name__).inc()
        self.answer(reply)

    def _flush(self, _done: asyncio.Future[Any] | None = None) -> None:
        pending = self._pending
        out: list[bytes] = []
        large = False
        while pending and pending[0][0].done() and self._transport is not None:
            future, formatter, cost = pending.popleft()
            self._pending_bytes -= cost
            try:
                reply = formatter(future)
                encoded = None if reply is None else reply.encode()
            except Exception:  # a defect here: this connection only pays for it
                log.exception("answering a request failed")
                encoded = None
            if encoded is None:
                self._transport.write(b"".join(out))
                self.close("a request failed in a way no reply describes")
                return
            out.append(encoded)
            if len(encoded) > LARGE_REPLY_BYTES:
                large = True
        if self._transport is None:
            return
        if large:
            self._transport.writelines(out)  # no copy of megabytes of reads
        elif out:
            self._transport.write(b"".join(out))
        if self._paused:
            self._resume_if_drained()

    # --- handshake ---------------------------------------------------------------

    def _hello(self, c: Hello) -> None:
        if self._greeted:
            return
        if c.low_version > WIRE_VERSION or c.high_version < OLDEST_COMPATIBLE_VERSION:
            self.close(f"client versions {c.low_version}..{c.high_version} do not meet "
                       f"ours {OLDEST_COMPATIBLE_VERSION}..{WIRE_VERSION}")
            return
        self._greeted = True

    def _keep_alive(self, _c: KeepAlive) -> None:
        self.answer(KeepAlive())

    def _unsupported(self, c: MergeTableSegments) -> None:
        self.answer(OperationUnsupported(c.request_id, type(c).__name__, ""))
