"""Client connections: framing, dispatch in arrival order, answers, back-pressure.

One :class:`BookieConnection` (an ``asyncio.Protocol``, no streams on this
path) per client over the sans-IO :class:`~quire.protocol.Decoder`.  It
hands runs of ADD_ENTRY frames over as columns and anything else one
message at a time, in arrival order, to a :class:`RequestHandler`.  The
:class:`ConnectionHub` holds every open connection and writes what each has
to send once per loop iteration.

A malformed frame closes its connection only.

**Limits that hold under abuse** (the settings are
:class:`~quire.bookie.config.BookieConfig`'s; every refusal and pause is
counted on ``/metrics``):

* admission (:meth:`ConnectionHub.admit`): at most ``max_connections``
  connections, and ``max_connections_per_peer`` from one IP address, a TLS
  handshake in progress included; one more is closed at once;
* a per-connection budget of ``max_connection_pending_bytes``: the bytes of
  requests taken and not answered yet (adds held until durable) plus the
  answers queued in this loop iteration, these alone at most
  ``max_buffered_reply_bytes`` (more could not be written anyway).  Past
  it, the connection stops taking the requests it has buffered (a read of
  64 KiB of batch-read requests could otherwise queue gigabytes of
  answers) and stops reading its socket, until its answers went out and
  half the budget is free;
* write back-pressure: the transport's write buffer high-water mark is
  ``max_buffered_reply_bytes``; above it (a client that does not read its
  answers) the transport calls :meth:`BookieConnection.pause_writing` and
  the connection stops reading, until :meth:`~BookieConnection.resume_writing`;
* idle connections: :meth:`ConnectionHub.sweep_idle` closes those that sent
  nothing for ``idle_timeout_ms`` and either never sent a whole frame or
  hold part of one (a connection that did its work and waits for the next
  is kept: clients pool them), and those whose answers wait, unread, with
  none of them read for as long (the memory they hold is given back).
  The per-read cost is one counter (:attr:`BookieConnection.reads`); the
  sweep runs on a timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, cast

from quire.bookie.config import ConnectionLimits
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


def peer_host(transport: asyncio.BaseTransport) -> str:
    """The IP address a connection comes from (a transport's own name for
    its peer if it is not an address pair; "?" if unknown)."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "?" if name is None else str(name)


class ConnectionHub:
    """The bookie's open connections.  Answers queued during one loop
    iteration go out in one write per connection (:meth:`flush_all`, which
    first runs the actions given to :meth:`before_answers`); while
    ``throttled`` no connection reads.  It also admits connections and
    closes idle ones (the limits of the module docstring)."""

    def __init__(self, metrics: BookieMetrics, *, max_frame_bytes: int,
                 max_connection_pending_bytes: int,
                 limits: ConnectionLimits | None = None) -> None:
        self.metrics = metrics
        self.max_frame_bytes = max_frame_bytes
        self.max_connection_pending_bytes = max_connection_pending_bytes
        self.limits = limits or ConnectionLimits()
        self.connections: set[BookieConnection] = set()
        self.admitted = 0
        """Connections admitted and not gone (TLS handshakes in progress included)."""
        self._per_peer: dict[str, int] = {}
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

    def admit(self, host: str) -> bool:
        """Take one more connection from ``host`` if the limits allow it
        (counted otherwise); :meth:`leave` gives it back."""
        limits = self.limits
        if limits.max_connections and self.admitted >= limits.max_connections:
            self.refused("max_connections")
            return False
        count = self._per_peer.get(host, 0)
        if limits.max_connections_per_peer and count >= limits.max_connections_per_peer:
            self.refused("max_connections_per_peer")
            return False
        self._per_peer[host] = count + 1
        self.admitted += 1
        return True

    def leave(self, host: str) -> None:
        self.admitted -= 1
        count = self._per_peer.pop(host, 0) - 1
        if count > 0:
            self._per_peer[host] = count

    def refused(self, reason: str, detail: str = "") -> None:
        """Count a connection closed by a limit (or TLS); logged at most
        every few seconds (an attack would flood the log)."""
        self.metrics.connection_refusals.labels(reason).inc()
        self.metrics.log_refusal(reason, detail)

    def opened(self, conn: BookieConnection) -> None:
        self.connections.add(conn)
        self.metrics.connections.inc()

    def closed(self, conn: BookieConnection) -> None:
        self.connections.discard(conn)
        self.metrics.connections.dec()
        self.leave(conn.host)

    def sweep_idle(self, now: float) -> int:
        """Close the connections idle past ``idle_timeout_ms`` (module
        docstring) as of loop time ``now``; how many."""
        timeout_s = self.limits.idle_timeout_ms / 1000.0
        if not timeout_s:
            return 0
        closed = 0
        for conn in list(self.connections):
            transport = conn.transport
            if transport is None or transport.is_closing():
                continue
            unread = transport.get_write_buffer_size() if conn.writing_paused else -1
            mark = (conn.reads, unread)
            if mark != conn.idle_mark:
                conn.idle_mark, conn.idle_since = mark, now
                continue
            if now - conn.idle_since < timeout_s:
                continue
            if conn.stalled:
                self.refused("idle_timeout")
            elif conn.writing_paused:  # its answers wait, and it read none of them
                self.refused("replies_unread_timeout")
            else:
                continue
            transport.abort()
            closed += 1
        return closed


class BookieConnection(asyncio.Protocol):
    """One client connection: decode, hand over, write answers, back-pressure."""

    def __init__(self, hub: ConnectionHub, handler: RequestHandler, *,
                 admitted: bool = False) -> None:
        self.hub = hub
        self.handler = handler
        self.decoder = Decoder("requests", hub.max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self.pending_bytes = 0
        """Bytes of requests accepted but not yet answered."""
        self.out_bytes = 0
        """Bytes of the answers queued in this loop iteration (not yet written)."""
        self.volatile_acks: list[bytes] = []
        """Answers that go out at the end of this read (see RequestHandler)."""
        self.reads = 0
        """Reads of the socket so far (the idle sweep's only per-read cost)."""
        self.idle_mark: tuple[int, int] = (0, -1)
        self.idle_since = 0.0
        """(:attr:`reads`, its unread answers' bytes while writing is paused)
        at the sweep that last saw them change, and when."""
        self._out: list[bytes] = []
        self._reading_paused = False
        self._writing_paused = False
        self._holding = False
        """Requests buffered and not taken: the budget was spent (module docstring)."""
        self._admitted = admitted
        """Admitted already (by the TLS handshake that made it)."""
        self._opened = False
        self.peer = "?"
        self.host = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.peer = str(transport.get_extra_info("peername"))
        self.host = peer_host(transport)
        hub = self.hub
        if not self._admitted and not hub.admit(self.host):
            self.transport.abort()
            return
        limit = hub.limits.max_buffered_reply_bytes
        if limit:
            self.transport.set_write_buffer_limits(high=limit)
        self._opened = True
        self.idle_since = asyncio.get_running_loop().time()
        hub.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._opened:
            self._opened = False
            self.hub.closed(self)
        self.transport = None

    @property
    def writing_paused(self) -> bool:
        """Whether the transport holds more answers than its client reads."""
        return self._writing_paused

    @property
    def stalled(self) -> bool:
        """Never sent a whole request, or holds part of one, with nothing in
        flight: what the idle sweep closes once it sent nothing for long."""
        return (self.reads == 0 or self.decoder.buffered_bytes > 0) and not self._holding \
            and not self.pending_bytes and not self._out

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        try:
            self.decoder.feed(data)
        except ProtocolError as e:
            self._malformed(e)
            return
        if not self._holding:
            self._serve()

    def _serve(self) -> None:
        # Runs of ADD_ENTRY frames are taken as columns; anything else one
        # message at a time, so requests are handled in arrival order.
        handler = self.handler
        take_adds, take_request = handler.take_adds, handler.take_request
        hub = self.hub
        limit = hub.max_connection_pending_bytes
        replies_limit = hub.limits.max_buffered_reply_bytes or limit
        try:
            decoder = self.decoder
            while True:
                run = decoder.take_add_requests()
                if run is not None:
                    take_adds(self, run)
                message = decoder.next_message()
                if message is None:
                    break
                take_request(self, message)  # type: ignore[arg-type]
                out = self.out_bytes
                if (out > replies_limit or self.pending_bytes + out > limit) \
                        and decoder.buffered_bytes:
                    self._holding = True  # the budget is spent: the rest waits
                    hub.metrics.reads_paused.labels("request_budget").inc()
                    break
        except ProtocolError as e:
            self._malformed(e)
            return
        if self.volatile_acks:
            handler.release_volatile_acks(self)
        self.update_flow()

    def _malformed(self, e: ProtocolError) -> None:
        log.warning("closing connection from %s: malformed frame: %s", self.peer, e)
        self.hub.metrics.malformed_frames.inc()
        if self.transport is not None:
            self.transport.abort()

    def _resume_serving(self) -> None:
        if self.transport is not None and not self._holding:
            self._serve()

    def send(self, frame: bytes, request_bytes: int = 0) -> None:
        """Queue an answer; all answers queued in one loop iteration go out
        in one write (one syscall instead of one per acknowledgement)."""
        self.pending_bytes -= request_bytes
        self.out_bytes += len(frame)
        if not self._out:
            self.hub.schedule_flush(self)
        self._out.append(frame)

    def send_many(self, frames: list[bytes], request_bytes: int = 0) -> None:
        """:meth:`send` for several answers at once."""
        self.pending_bytes -= request_bytes
        self.out_bytes += sum(map(len, frames))
        if not self._out:
            self.hub.schedule_flush(self)
        self._out += frames

    def flush(self) -> None:
        out, self._out = self._out, []
        self.out_bytes = 0
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        self.update_flow()

    def hold(self, request_bytes: int) -> None:
        self.pending_bytes += request_bytes

    def update_flow(self) -> None:
        """Pause or resume reading: paused while the peer does not read our
        answers, while the budget is spent (request bytes waiting for an
        answer, answers queued), or while the hub is throttled (write cache
        full).  Resumed at half the budget (no flapping); requests left
        buffered when the budget ran out are then taken first."""
        if self.transport is None:
            return
        limit = self.hub.max_connection_pending_bytes
        should_pause = self._writing_paused or self.pending_bytes > limit or self.hub.throttled \
            or self._holding
        if should_pause and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        elif self._reading_paused and not (self._writing_paused or self.hub.throttled) \
                and self.pending_bytes + self.out_bytes <= limit // 2:
            self._reading_paused = False
            if self._holding:
                self._holding = False
                asyncio.get_running_loop().call_soon(self._resume_serving)
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.hub.metrics.reads_paused.labels("replies_unread").inc()
        self.update_flow()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.update_flow()
