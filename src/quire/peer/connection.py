"""One pipelined connection per bookie (BookKeeper's PerChannelBookieClient).

:class:`BookieClient` owns the requests sent to one bookie.  Every request
gets a fresh request id and a deadline; its answer (or its failure) is
delivered exactly once to ``handler(token, result)`` on the event loop,
where ``result`` is the decoded :data:`~quire.protocol.Response` or a
:class:`~quire.errors.QuireError`:

* :class:`~quire.errors.ClientTimeoutError` when the deadline passed first
  (the pool's ticker calls :meth:`BookieClient.expire`);
* :class:`~quire.errors.BookieUnavailableError` when the connection could not
  be made or was lost with the request outstanding;
* :class:`~quire.errors.ClientClosedError` when the client was closed.

Requests may be sent at any time: while no connection exists the first one
starts a connect (reconnect on demand) and frames wait in an outbox.  Frames
sent in one loop iteration leave in one write, or in writes of
:data:`FLUSH_AFTER_FRAMES` frames when a burst is larger.  I/O is an
``asyncio.Protocol`` over the sans-IO :class:`~quire.protocol.Decoder`; this
is the client's hot path, so per-request work is a dict insert, one frame
and one dict pop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, cast

from quire.errors import (
    BookieUnavailableError,
    ClientClosedError,
    ClientTimeoutError,
    ProtocolError,
    QuireError,
)
from quire.protocol import (
    BatchReadRequest,
    Decoder,
    RawAddAnswer,
    ReadLacRequest,
    ReadRequest,
    Response,
    SyncRequest,
    WriteLacRequest,
    add_response_of,
    encode_add_request,
)

log = logging.getLogger("quire.client")

Result: TypeAlias = Response | QuireError
"""What a request's handler receives: the bookie's answer or why there is none."""
Handler: TypeAlias = Callable[[Any, Result], None]
"""``handler(token, result)``; the token is the caller's, passed back as is."""
AddResult: TypeAlias = Result | RawAddAnswer
"""What an add's handler receives: a :data:`Result`, or, for an ADD_ENTRY
answer, the :data:`~quire.protocol.RawAddAnswer` tuple the decoder took it as
(:func:`~quire.protocol.add_response_of` makes the response object)."""
AddHandler: TypeAlias = Callable[[Any, AddResult], None]
"""``handler(token, result)`` of an add (:meth:`BookieClient.add_frame`)."""
_Waiting: TypeAlias = tuple[Handler, Any, float] | tuple[AddHandler, Any, float, bool]
Resolver: TypeAlias = Callable[[str], Awaitable[str]]
"""Bookie id -> ``"host:port"`` (raises BookieUnavailableError if unknown)."""
next_request_id: Callable[[], int] = itertools.count(1).__next__
"""Request ids come from one counter per process, not one per connection:
unique on every connection all the same, and an add's frame can then be
encoded once and written to each bookie of its write set."""

FLUSH_AFTER_FRAMES = 128
"""Frames queued in one loop iteration that are written at once rather than
at the end of the iteration.  A writer that refills a window of 256 adds
from one burst of acknowledgements would otherwise hand the bookie all 256
in one write, after encoding the last of them: bookie and client then work
in turn, and every journal fsync covers the whole window.  Written in
pieces, the bookie starts on the first piece while the client encodes the
rest (2 cores, E=W=A=1, 1 KiB: 44k adds/s in one write, 70k in pieces of
64).  Each piece costs a wake-up cycle of every bookie it goes to (a read,
a journal group, an fsync, a write of answers), so pieces of 128 beat
pieces of 64 once several bookies share the cores: 3-bookie sandbox,
alternating runs, E=3 W=3 A=2 +7-12% adds/s and 27 against 31 us of CPU
per add; E=W=A=1 within noise (117k against 108k, mean of 3 pairs)."""
OutgoingRequest: TypeAlias = ReadRequest | ReadLacRequest | WriteLacRequest | BatchReadRequest \
    | SyncRequest


class _BookieProtocol(asyncio.Protocol):
    """The socket side of a :class:`BookieClient`: decode, dispatch, report loss."""

    def __init__(self, client: BookieClient, max_frame_bytes: int) -> None:
        self.client = client
        self.decoder = Decoder("responses", max_frame_bytes)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.client._connected(self)

    def data_received(self, data: bytes) -> None:
        client = self.client
        decoder = self.decoder
        try:
            decoder.feed(data)
            pop = client._pending.pop
            while True:
                # Runs of ADD answers (the write path's traffic) as raw tuples,
                # anything else one message at a time, in arrival order.
                for answer in decoder.take_add_answers():
                    waiting = pop(answer[0], None)
                    if waiting is None:
                        continue  # timed out or failed already: the answer is late
                    try:
                        if len(waiting) == 4:  # an add's handler: takes the raw answer
                            waiting[0](waiting[1], answer)
                        else:
                            waiting[0](waiting[1], add_response_of(answer))
                    except Exception:
                        log.exception("handler of a response from bookie %s failed",
                                      client.bookie_id)
                message = decoder.next_message()
                if message is None:
                    return
                waiting = pop(message.request_id, None)  # type: ignore[arg-type]
                if waiting is None:
                    continue
                try:
                    waiting[0](waiting[1], message)  # type: ignore[arg-type]
                except Exception:
                    log.exception("handler of a response from bookie %s failed", client.bookie_id)
        except ProtocolError as e:
            log.warning("bookie %s sent a malformed frame (%s): closing the connection",
                        client.bookie_id, e)
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._lost(self, exc)


class BookieClient:
    """Requests to one bookie, pipelined over one connection made on demand."""

    def __init__(self, bookie_id: str, resolve: Resolver, *, connect_timeout_s: float,
                 max_frame_bytes: int) -> None:
        self.bookie_id = bookie_id
        self._resolve = resolve
        self._connect_timeout_s = connect_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, _Waiting] = {}
        """request id -> (handler, token, deadline); an add's has a fourth
        item (True): its handler takes raw ADD answers."""
        self._outbox: list[bytes] = []
        self._protocol: _BookieProtocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._flush_scheduled = False
        self._closed = False
        self.last_failure: float | None = None
        """Loop time of the last failed connect or lost connection (None: none)."""

    # --- sending -------------------------------------------------------------

    def add(self, master_key: bytes, entry: bytes, flags: int, timeout_s: float,
            handler: AddHandler, token: Any) -> None:
        """Send ADD_ENTRY for the stored ``entry``."""
        request_id = next_request_id()
        self.add_frame(request_id, encode_add_request(request_id, master_key, entry, flags),
                       self._loop.time() + timeout_s, handler, token)

    def add_frame(self, request_id: int, frame: bytes, deadline: float, handler: AddHandler,
                  token: Any) -> None:
        """Send an ADD_ENTRY frame encoded with ``request_id`` (from
        :func:`next_request_id`), due by loop time ``deadline``: the writer's
        hot path, one frame for its whole write set.  An ADD_ENTRY answer
        reaches ``handler`` as a raw tuple (see :data:`AddResult`)."""
        self._pending[request_id] = (handler, token, deadline, True)
        outbox = self._outbox
        if self._protocol is None or self._closed or len(outbox) + 1 >= FLUSH_AFTER_FRAMES:
            self._write(frame)
        else:  # what _write does for a connected client below a whole piece, inlined
            outbox.append(frame)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    def send(self, request: OutgoingRequest, timeout_s: float, handler: Handler,
             token: Any) -> None:
        """Send ``request`` (its ``request_id`` is assigned here)."""
        request.request_id = request_id = next_request_id()
        self._pending[request_id] = (handler, token, self._loop.time() + timeout_s)
        self._write(request.encode())

    async def call(self, request: OutgoingRequest, timeout_s: float) -> Response:
        """Send ``request`` and wait for its answer; raises the QuireError that
        took its place (timeout, unavailable, closed)."""
        future: asyncio.Future[Response] = self._loop.create_future()

        def done(_token: Any, result: Result) -> None:
            if future.done():
                return
            if isinstance(result, QuireError):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.send(request, timeout_s, done, None)
        return await future

    def _write(self, frame: bytes) -> None:
        if self._closed:  # fail it on the next iteration, never inside the caller
            self._loop.call_soon(self._fail_all,
                                 ClientClosedError(f"client closed (bookie {self.bookie_id})"))
            return
        outbox = self._outbox
        outbox.append(frame)
        if self._protocol is not None:
            if len(outbox) >= FLUSH_AFTER_FRAMES:
                self._write_outbox()
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        elif self._connecting is None:
            self._connecting = self._loop.create_task(self._connect())

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._write_outbox()

    def _write_outbox(self) -> None:
        protocol = self._protocol
        if protocol is None or protocol.transport is None or not self._outbox:
            return  # a connect in progress flushes when it lands
        frames, self._outbox = self._outbox, []
        # one buffer, one write: cheaper than writelines() for many small frames
        protocol.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    # --- connection life -----------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._protocol is not None

    async def _connect(self) -> None:
        address = "?"
        try:
            address = await self._resolve(self.bookie_id)
            host, _, port = address.rpartition(":")
            await asyncio.wait_for(
                self._loop.create_connection(
                    lambda: _BookieProtocol(self, self._max_frame_bytes), host, int(port)),
                self._connect_timeout_s)
        except asyncio.CancelledError:
            self._connecting = None
            raise
        except (OSError, TimeoutError, ValueError, QuireError) as e:
            self._connecting = None
            self.last_failure = self._loop.time()
            reason = e if isinstance(e, BookieUnavailableError) else BookieUnavailableError(
                f"cannot connect to bookie {self.bookie_id} at {address}: "
                f"{e or type(e).__name__}")
            self._fail_all(reason)
            return
        self._connecting = None

    def _connected(self, protocol: _BookieProtocol) -> None:
        if self._closed:
            assert protocol.transport is not None
            protocol.transport.abort()
            return
        self._protocol = protocol
        self.last_failure = None
        self._write_outbox()

    def _lost(self, protocol: _BookieProtocol, exc: Exception | None) -> None:
        if self._protocol is not protocol:
            return
        self._protocol = None
        if not self._closed:
            self.last_failure = self._loop.time()
        self._fail_all(BookieUnavailableError(
            f"connection to bookie {self.bookie_id} lost" + (f": {exc}" if exc else "")))

    def _fail_all(self, error: QuireError) -> None:
        """Every outstanding request gets ``error`` (handlers may send again:
        those requests go to a fresh dict and a fresh connection)."""
        pending, self._pending = self._pending, {}
        self._outbox = []
        for waiting in pending.values():
            try:
                waiting[0](waiting[1], error)
            except Exception:
                log.exception("handler of a failed request to bookie %s failed", self.bookie_id)

    def expire(self, now: float) -> None:
        """Fail every request whose deadline is ``<= now`` with a timeout."""
        pending = self._pending
        if not pending:
            return
        expired = [rid for rid, waiting in pending.items() if waiting[2] <= now]
        for rid in expired:
            waiting = pending.pop(rid, None)
            if waiting is None:
                continue
            try:
                waiting[0](waiting[1], ClientTimeoutError(
                    f"bookie {self.bookie_id} did not answer request {rid} in time"))
            except Exception:
                log.exception("handler of a timed-out request to bookie %s failed",
                              self.bookie_id)

    @property
    def outstanding(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    def close(self) -> None:
        """Drop the connection; outstanding requests fail with ClientClosedError."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()
        self._fail_all(ClientClosedError(f"client closed (bookie {self.bookie_id})"))
