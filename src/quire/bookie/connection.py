"""Client connections: framing, dispatch in arrival order, answers, back-pressure.

One :class:`BookieConnection` (an ``asyncio.Protocol``, no streams on this
path) per client over the sans-IO :class:`~quire.protocol.Decoder`.  It
hands runs of ADD_ENTRY frames over as columns and anything else one
message at a time, in arrival order, to a :class:`RequestHandler`.  The
:class:`ConnectionHub` holds every open connection and writes what each has
to send once per loop iteration.

A malformed frame closes its connection only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, cast

from quire.bookie.metrics import BookieMetrics
from quire.errors import ProtocolError
from quire.protocol import AddRequestRun, Decoder, Request

log = logging.getLogger("quire.bookie")


class RequestHandler(Protocol):
    """What a :class:`BookieConnection` hands its decoded requests to.

    Every method runs on the event loop's thread, inside ``data_received``,
    in the order the requests arrived on the connection.  Each request is
    answered exactly once through ``conn.send``/``conn.send_many``, at once
    or later (after an fsync, say); the one exception is an unknown op
    without a request id, for which the handler may abort the connection.
    No method raises: a failure while handling a request is answered
    (IO_ERROR) to that request only.  A handler that makes the connection
    hold request bytes until it answers calls ``conn.hold`` (or adds to
    ``conn.pending_bytes``) and gives them back with the answer."""

    def take_adds(self, conn: BookieConnection, run: AddRequestRun) -> None:
        """Consecutive ADD_ENTRY requests, as columns, whatever their flags."""
        ...

    def take_request(self, conn: BookieConnection, request: Request) -> None:
        """Any other request (an ADD_ENTRY only if the decoder made one)."""
        ...

    def release_volatile_acks(self, conn: BookieConnection) -> None:
        """Called at the end of a read that left answers in
        ``conn.volatile_acks``: make what they acknowledge as durable as they
        promise, then send them, or drop them if that fails (the client then
        times out, never reads an OK of unknown durability)."""
        ...


class ConnectionHub:
    """The bookie's open connections.  Answers queued during one loop
    iteration go out in one write per connection (:meth:`flush_all`, which
    first runs the actions given to :meth:`before_answers`); while
    ``throttled`` no connection reads."""

    def __init__(self, metrics: BookieMetrics, *, max_frame_bytes: int,
                 max_connection_pending_bytes: int) -> None:
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.max_connection_pending_bytes = max_connection_pending_bytes
        self.connections: set[BookieConnection] = set()
        self.throttled = False
        """True while the write cache is full and the checkpoint that empties
        it still runs: every connection stops reading until it is done
        (BookKeeper blocks its add threads the same way)."""
        self._flush_queue: list[BookieConnection] = []
        self._before: list[Callable[[], None]] = []
        self._flush_scheduled = False

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush_all)

    def schedule_flush(self, conn: BookieConnection) -> None:
        self._schedule()
        self._flush_queue.append(conn)

    def before_answers(self, action: Callable[[], None]) -> None:
        """Run ``action`` once, before this loop iteration's answers are written."""
        self._schedule()
        self._before.append(action)

    def flush_all(self) -> None:
        """Once per loop iteration: the ``before_answers`` actions, then every
        connection's queued answers."""
        self._flush_scheduled = False
        before = self._before
        if before:
            self._before = []
            for action in before:
                try:
                    action()
                except Exception:  # pragma: no cover - metrics never cost an answer
                    log.exception("an action before the answers failed")
        queue, self._flush_queue = self._flush_queue, []
        for conn in queue:
            conn.flush()

    def flush_if_scheduled(self) -> None:
        """Write now what waits for this iteration's flush (the call_soon it
        scheduled then finds nothing left)."""
        if self._flush_scheduled:
            self.flush_all()

    def set_throttled(self, throttled: bool) -> None:
        """Stop (or resume) reading on every connection (see ``throttled``)."""
        if throttled == self.throttled:
            return
        self.throttled = throttled
        if throttled:
            log.info("write cache full while a checkpoint runs: pausing reads")
        for conn in list(self.connections):
            conn.update_flow()

    def close_all(self) -> None:
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()

    def opened(self, conn: BookieConnection) -> None:
        self.connections.add(conn)
        self.metrics.connections.inc()

    def closed(self, conn: BookieConnection) -> None:
        self.connections.discard(conn)
        self.metrics.connections.dec()


class BookieConnection(asyncio.Protocol):
    """One client connection: decode, hand over, write answers, back-pressure."""

    def __init__(self, hub: ConnectionHub, handler: RequestHandler) -> None:
        self.hub = hub
        self.handler = handler
        self.decoder = Decoder("requests", hub.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.pending_bytes = 0
        """Bytes of requests accepted but not yet answered."""
        self.volatile_acks: list[bytes] = []
        """Answers that go out at the end of this read (see RequestHandler)."""
        self._out: list[bytes] = []
        self._reading_paused = False
        self._writing_paused = False
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.peer = str(transport.get_extra_info("peername"))
        self.hub.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub.closed(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        # Runs of ADD_ENTRY frames are taken as columns; anything else one
        # message at a time, so requests are handled in arrival order.
        handler = self.handler
        take_adds, take_request = handler.take_adds, handler.take_request
        try:
            decoder = self.decoder
            decoder.feed(data)
            while True:
                run = decoder.take_add_requests()
                if run is not None:
                    take_adds(self, run)
                message = decoder.next_message()
                if message is None:
                    break
                take_request(self, message)  # type: ignore[arg-type]
        except ProtocolError as e:
            log.warning("closing connection from %s: malformed frame: %s", self.peer, e)
            self.hub.metrics.malformed_frames.inc()
            if self.transport is not None:
                self.transport.abort()
            return
        if self.volatile_acks:
            handler.release_volatile_acks(self)
        self.update_flow()

    def send(self, frame: bytes, request_bytes: int = 0) -> None:
        """Queue an answer; all answers queued in one loop iteration go out
        in one write (one syscall instead of one per acknowledgement)."""
        self.pending_bytes -= request_bytes
        if not self._out:
            self.hub.schedule_flush(self)
        self._out.append(frame)

    def send_many(self, frames: list[bytes], request_bytes: int = 0) -> None:
        """:meth:`send` for several answers at once."""
        self.pending_bytes -= request_bytes
        if not self._out:
            self.hub.schedule_flush(self)
        self._out += frames

    def flush(self) -> None:
        out, self._out = self._out, []
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        self.update_flow()

    def hold(self, request_bytes: int) -> None:
        self.pending_bytes += request_bytes

    def update_flow(self) -> None:
        """Pause or resume reading: paused while the peer does not read our
        answers, while too many request bytes wait for an answer, or while
        the hub is throttled (write cache full)."""
        if self.transport is None:
            return
        limit = self.hub.max_connection_pending_bytes
        should_pause = self._writing_paused or self.pending_bytes > limit or self.hub.throttled
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif not should_pause and self._reading_paused and self.pending_bytes <= limit // 2:
            self._reading_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.update_flow()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.update_flow()
