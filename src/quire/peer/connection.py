"""One pipelined connection per bookie (BookKeeper's PerChannelBookieClient).

:class:`BookieClient` owns the requests sent to one bookie, one typed call
per operation: :meth:`~BookieClient.read_entry`,
:meth:`~BookieClient.fence_read` and :meth:`~BookieClient.write_lac` report
to a handler; :meth:`~BookieClient.add`, :meth:`~BookieClient.read_lac`,
:meth:`~BookieClient.batch_read` and :meth:`~BookieClient.sync` are awaited.
Every request gets a fresh request id and a deadline; its outcome is
delivered exactly once, on the event loop: the response the request calls
for, answered OK, or a :class:`~quire.errors.QuireError` in its place:

* the error of the bookie's answer, made by :func:`quire.peer.answers.outcome`
  (a refusal's status, or an unexpected answer);
* :class:`~quire.errors.ClientTimeoutError` when the deadline passed first
  (the pool's ticker calls :meth:`BookieClient.expire`);
* :class:`~quire.errors.BookieUnavailableError` when the connection could not
  be made or was lost with the request outstanding;
* :class:`~quire.errors.ClientClosedError` when the client was closed.

A writer's adds take the hot path, :meth:`~BookieClient.add_frame`: one
frame encoded once for its whole write set, and an OK answer delivered as
the decoder's raw tuple (:data:`~quire.protocol.RawAddAnswer`), no object.

Requests may be sent at any time: while no connection exists the first one
starts a connect (reconnect on demand) and frames wait in an outbox.  With
a :class:`~quire.security.ClientTls` the connection is TLS: the bookie's
certificate must be signed by the CA and name the host of its address, and
the client's certificate, if it has one, is shown; the handshake counts in
the connect timeout, and a refused one fails the waiting requests with
BookieUnavailableError naming the TLS error.  Frames
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
from quire.peer.answers import Expected, add_refusal, outcome
from quire.protocol import (
    FLAG_DO_FENCING,
    LAST_ENTRY_ID,
    AddResponse,
    BatchReadRequest,
    BatchReadResponse,
    Decoder,
    RawAddAnswer,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    SyncRequest,
    SyncResponse,
    WriteLacRequest,
    WriteLacResponse,
    add_response_of,
    encode_add_request,
)
from quire.security import ClientTls

log = logging.getLogger("quire.peer")

ReadHandler: TypeAlias = Callable[[Any, ReadResponse | QuireError], None]
"""``handler(token, result)`` of :meth:`BookieClient.read_entry` and
:meth:`BookieClient.fence_read`; the token is the caller's, passed back as is."""
WriteLacHandler: TypeAlias = Callable[[Any, WriteLacResponse | QuireError], None]
"""``handler(token, result)`` of :meth:`BookieClient.write_lac`."""
AddHandler: TypeAlias = Callable[[Any, RawAddAnswer | QuireError], None]
"""``handler(token, result)`` of :meth:`BookieClient.add_frame`: the raw
answer (its status is OK) or the error in its place."""
_Waiting: TypeAlias = tuple[Callable[[Any, Any], None], Any, float, type[Any] | None]
"""A request on the wire: (handler, token, deadline, the response type its
outcome is made of; None for a raw add)."""
_OK = 0
"""StatusCode.OK as the wire value raw ADD answers carry."""
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

FLUSH_FRAME_BYTES = 4096
"""A frame at least this long is written at once, with what is queued
before it: coalescing saves a write per small frame, nothing for a large
one, and holding a large frame to the end of the iteration makes the
bookie wait for the caller's whole burst (a segment container cuts
operation frames of several KiB in the middle of a burst of appends)."""
_TypedRequest: TypeAlias = ReadRequest | ReadLacRequest | WriteLacRequest | BatchReadRequest \
    | SyncRequest


def _settle(future: asyncio.Future[Any], result: object) -> None:
    """The handler of an awaited call: its future gets the outcome."""
    if future.done():
        return
    if isinstance(result, QuireError):
        future.set_exception(result)
    else:
        future.set_result(result)


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
        ok = _OK
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
                        if answer[1] == ok and waiting[3] is None:  # a raw add's OK
                            waiting[0](waiting[1], answer)
                        else:
                            waiting[0](waiting[1], client._add_outcome(answer, waiting[3]))
                    except Exception:
                        log.exception("handler of a response from bookie %s failed",
                                      client.bookie_id)
                message = decoder.next_message()
                if message is None:
                    return
                waiting = pop(message.request_id, None)  # type: ignore[arg-type]
                if waiting is None:
                    continue
                expected = waiting[3]
                try:
                    if type(message) is expected and message.status == ok:  # type: ignore[union-attr]
                        waiting[0](waiting[1], message)  # outcome()'s OK case, inlined
                    else:
                        waiting[0](waiting[1], client._outcome(message, expected))  # type: ignore[arg-type]
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
                 max_frame_bytes: int, tls: ClientTls | None = None) -> None:
        self.bookie_id = bookie_id
        self._tls = tls
        self._resolve = resolve
        self._connect_timeout_s = connect_timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._loop = asyncio.get_running_loop()
        self._pending: dict[int, _Waiting] = {}
        """request id -> (handler, token, deadline, expected response type)."""
        self._outbox: list[bytes] = []
        self._protocol: _BookieProtocol | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._flush_scheduled = False
        self._closed = False
        self.last_failure: float | None = None
        """Loop time of the last failed connect or lost connection (None: none)."""

    # --- typed calls ----------------------------------------------------------

    def read_entry(self, ledger_id: int, entry_id: int, timeout_s: float,
                   handler: ReadHandler, token: Any) -> None:
        """READ_ENTRY; ``handler`` gets the OK :class:`~quire.protocol.ReadResponse`
        (its ``entry`` set) or the error in its place.  Single-entry reads'
        hot path: :meth:`_request` inlined."""
        request_id = next_request_id()
        self._pending[request_id] = (handler, token, self._loop.time() + timeout_s, ReadResponse)
        self._write(ReadRequest(request_id, ledger_id, entry_id).encode())

    def fence_read(self, ledger_id: int, master_key: bytes, timeout_s: float,
                   handler: ReadHandler, token: Any) -> None:
        """Fence the ledger on this bookie and read its last entry
        (READ_ENTRY of the last entry with DO_FENCING); ``handler`` gets the
        OK response or the error in its place (an explicit negative: the
        bookie is fenced and holds no entry of the ledger)."""
        self._request(ReadRequest(0, ledger_id, LAST_ENTRY_ID, FLAG_DO_FENCING, master_key),
                      ReadResponse, timeout_s, handler, token)

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes, timeout_s: float,
                  handler: WriteLacHandler, token: Any) -> None:
        """WRITE_LAC (an explicit LAC for readers of an idle ledger)."""
        self._request(WriteLacRequest(0, ledger_id, lac, master_key), WriteLacResponse,
                      timeout_s, handler, token)

    async def add(self, master_key: bytes, entry: bytes, flags: int,
                  timeout_s: float) -> AddResponse:
        """ADD_ENTRY of the stored ``entry``, answered OK; raises the error in
        its place.  Not the writer's path: see :meth:`add_frame`."""
        future: asyncio.Future[AddResponse] = self._loop.create_future()
        request_id = next_request_id()
        self._pending[request_id] = (_settle, future, self._loop.time() + timeout_s,
                                     AddResponse)
        self._write(encode_add_request(request_id, master_key, entry, flags))
        return await future

    async def read_lac(self, ledger_id: int, timeout_s: float) -> int:
        """The bookie's LAC of the ledger (READ_LAC); raises the error in its
        place (an explicit negative when it holds nothing of the ledger)."""
        return (await self._call(ReadLacRequest(0, ledger_id), ReadLacResponse, timeout_s)).lac

    async def batch_read(self, ledger_id: int, start_entry_id: int, max_count: int,
                         max_size_bytes: int, timeout_s: float) -> BatchReadResponse:
        """BP-62 BATCH_READ_ENTRY, answered OK; raises the error in its place
        (:class:`~quire.errors.UnsupportedError` from a bookie without batch
        reads)."""
        return await self._call(
            BatchReadRequest(0, ledger_id, start_entry_id, max_count, max_size_bytes),
            BatchReadResponse, timeout_s)

    async def sync(self, ledger_id: int, timeout_s: float) -> int:
        """BP-14 SYNC: the bookie makes what it holds of the ledger persistent
        and answers its LastAddSynced; raises the error in its place."""
        return (await self._call(SyncRequest(0, ledger_id), SyncResponse,
                                 timeout_s)).last_add_synced

    # --- the writer's add path -------------------------------------------------

    def add_frame(self, request_id: int, frame: bytes, deadline: float, handler: AddHandler,
                  token: Any) -> None:
        """Send an ADD_ENTRY frame encoded with ``request_id`` (from
        :func:`next_request_id`), due by loop time ``deadline``: the writer's
        hot path, one frame for its whole write set.  An OK answer reaches
        ``handler`` as the decoder's raw tuple (:data:`~quire.protocol.RawAddAnswer`);
        anything else as the error in its place."""
        self._pending[request_id] = (handler, token, deadline, None)
        outbox = self._outbox
        if self._protocol is None or self._closed or len(outbox) + 1 >= FLUSH_AFTER_FRAMES \
                or len(frame) >= FLUSH_FRAME_BYTES:
            self._write(frame)
        else:  # what _write does for a connected client below a whole piece, inlined
            outbox.append(frame)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)

    # --- sending and answers ----------------------------------------------------

    def _request(self, request: _TypedRequest, expected: type[Expected], timeout_s: float,
                 handler: Callable[[Any, Any], None], token: Any) -> None:
        """Send ``request`` (its ``request_id`` is assigned here); its outcome,
        an OK ``expected`` or an error, goes to ``handler(token, outcome)``."""
        request.request_id = request_id = next_request_id()
        self._pending[request_id] = (handler, token, self._loop.time() + timeout_s, expected)
        self._write(request.encode())

    async def _call(self, request: _TypedRequest, expected: type[Expected],
                    timeout_s: float) -> Expected:
        future: asyncio.Future[Expected] = self._loop.create_future()
        self._request(request, expected, timeout_s, _settle, future)
        return await future

    def _outcome(self, message: Response, expected: type[Any] | None) -> object:
        """What the handler of a request gets for a message answering it."""
        if expected is not None:
            return outcome(message, expected, self.bookie_id)
        # a raw add answered outside a run of ADD answers (a bare error, say)
        result = outcome(message, AddResponse, self.bookie_id)
        if isinstance(result, QuireError):
            return result
        return (result.request_id, int(result.status), result.ledger_id, result.entry_id,
                result.last_add_synced)

    def _add_outcome(self, answer: RawAddAnswer, expected: type[Any] | None) -> object:
        """What the handler of a request gets for an ADD answer that is not a
        raw add's OK."""
        if expected is None:
            return add_refusal(answer, self.bookie_id)
        return outcome(add_response_of(answer), expected, self.bookie_id)

    def _write(self, frame: bytes) -> None:
        if self._closed:  # fail it on the next iteration, never inside the caller
            self._loop.call_soon(self._fail_all,
                                 ClientClosedError(f"client closed (bookie {self.bookie_id})"))
            return
        outbox = self._outbox
        outbox.append(frame)
        if self._protocol is not None:
            if len(outbox) >= FLUSH_AFTER_FRAMES or len(frame) >= FLUSH_FRAME_BYTES:
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
            tls = self._tls
            if tls is None:
                connecting = self._loop.create_connection(
                    lambda: _BookieProtocol(self, self._max_frame_bytes), host, int(port))
            else:
                connecting = self._loop.create_connection(
                    lambda: _BookieProtocol(self, self._max_frame_bytes), host, int(port),
                    ssl=tls.context(), server_hostname=host.strip("[]"),
                    ssl_handshake_timeout=self._connect_timeout_s)
            await asyncio.wait_for(connecting, self._connect_timeout_s)
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
