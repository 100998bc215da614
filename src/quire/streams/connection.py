"""One client connection to a segment store, over :mod:`quire.pravega_wire`.

:class:`SegmentConnection` is an ``asyncio.Protocol``: it sends ``Hello``
as soon as the socket is up and waits for the server's (a version range
that does not meet ours closes it), then carries pipelined requests, each
with its own request id, and completes each request's future with the
reply carrying that id, in whatever order replies come.  Replies without a
request id (``InvalidEventNumber``) and malformed input break the
connection.  When it breaks, every pending future fails with
:class:`~quire.errors.SegmentStoreConnectionError` (outcome unknown), and
:meth:`SegmentConnection.request` on a broken connection raises it before
sending anything (:attr:`SegmentConnection.broken`): the caller opens a new
one.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from typing import cast

from quire.errors import SegmentStoreConnectionError, TlsHandshakeError, WireCommandError
from quire.pravega_wire import (
    OLDEST_COMPATIBLE_VERSION,
    REPLY_TYPES,
    WIRE_VERSION,
    Decoder,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    WireCommand,
)

_request_ids = itertools.count(1)


def next_request_id() -> int:
    """A request id unique in this process (the server only echoes it)."""
    return next(_request_ids)


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` as ``(host, port)`` (ValueError if it is not one)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a segment store address is host:port, got {address!r}")
    return host, int(port)


class SegmentConnection(asyncio.Protocol):
    """A connection to one segment store; get one with :meth:`open`.

    ``_pending`` maps each unanswered request id to its future; ``_greeted``
    resolves with the server's Hello (or fails when the connection breaks
    before it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._loop = asyncio.get_running_loop()
        self._decoder = Decoder(REPLY_TYPES)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[WireCommand]] = {}
        self._greeted: asyncio.Future[None] = self._loop.create_future()
        self._error: SegmentStoreConnectionError | None = None
        self.writers: dict[int, str] = {}
        """Writer id -> the segment it was set up for on this connection."""
        self.closed = asyncio.Event()
        """Set once the connection is down."""

    @classmethod
    async def open(cls, address: str, timeout_ms: int,
                   tls: ssl.SSLContext | None = None) -> SegmentConnection:
        """Connect to ``address`` (``host:port``; with ``tls``, over TLS
        checking that the certificate covers ``host``) and exchange Hellos
        within ``timeout_ms``; SegmentStoreConnectionError if that fails,
        TlsHandshakeError (not worth retrying) if the TLS handshake does.
        A socket made and not handed to the caller (no Hello in time, the
        caller cancelled) is dropped here: nobody else could close it."""
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        transport: asyncio.Transport | None = None
        try:
            try:
                async with asyncio.timeout(timeout_ms / 1000):
                    if tls is None:
                        transport, connection = await loop.create_connection(
                            lambda: cls(address), host, port)
                    else:
                        transport, connection = await loop.create_connection(
                            lambda: cls(address), host, port, ssl=tls, server_hostname=host)
                    await asyncio.shield(connection._greeted)
            except BaseException:
                if transport is not None:
                    transport.abort()
                raise
        except ssl.SSLError as e:
            raise TlsHandshakeError(f"TLS handshake with segment store {address} failed: "
                                    f"{e.reason or e}") from e
        except (OSError, TimeoutError) as e:
            raise SegmentStoreConnectionError(
                f"cannot connect to segment store {address}: {e or type(e).__name__}") from e
        return connection

    @property
    def broken(self) -> bool:
        return self._error is not None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # --- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION).encode())

    def data_received(self, data: bytes) -> None:
        try:
            self._decoder.feed(data)
            for reply in self._decoder:
                self._dispatch(reply)
        except WireCommandError as e:
            self._break(f"malformed reply: {e}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail_all(SegmentStoreConnectionError(
            f"connection to segment store {self.address} lost"
            + (f": {exc}" if exc is not None else "")))

    # --- replies -------------------------------------------------------------------

    def _dispatch(self, reply: WireCommand) -> None:
        if isinstance(reply, Hello):
            if reply.low_version > WIRE_VERSION or reply.high_version < OLDEST_COMPATIBLE_VERSION:
                self._break(f"server versions {reply.low_version}..{reply.high_version} do "
                            f"not meet ours {OLDEST_COMPATIBLE_VERSION}..{WIRE_VERSION}")
            elif not self._greeted.done():
                self._greeted.set_result(None)
            return
        if isinstance(reply, KeepAlive):
            return
        if isinstance(reply, InvalidEventNumber):
            self._break(f"the server refused writer {reply.writer_id:x}'s event number "
                        f"{reply.event_number}")
            return
        request_id: int | None = getattr(reply, "request_id", None)
        future = None if request_id is None else self._pending.pop(request_id, None)
        if future is None:
            self._break(f"{type(reply).__name__} answers request {request_id}, "
                        "which is not pending")
            return
        if not future.done():
            future.set_result(reply)

    def _break(self, why: str) -> None:
        self._fail_all(SegmentStoreConnectionError(
            f"connection to segment store {self.address} dropped: {why}"))
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    def _fail_all(self, error: SegmentStoreConnectionError) -> None:
        if self._error is None:
            self._error = error
        if not self._greeted.done():
            self._greeted.set_exception(error)
            self._greeted.exception()  # retrieved: open() may have gone
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        self.closed.set()

    # --- requests ----------------------------------------------------------------

    def request(self, command: WireCommand, request_id: int) -> asyncio.Future[WireCommand]:
        """Send ``command`` (whose request id is ``request_id``); the future
        gives the reply with that id.  Raises SegmentStoreConnectionError,
        with nothing sent, if the connection is already broken."""
        if self._error is not None or self._transport is None:
            raise self._error or SegmentStoreConnectionError(
                f"connection to segment store {self.address} is closed")
        future: asyncio.Future[WireCommand] = self._loop.create_future()
        self._pending[request_id] = future
        self._transport.write(command.encode())
        return future

    def send(self, commands: list[tuple[WireCommand, int]]) -> list[asyncio.Future[WireCommand]]:
        """Several requests in one write (as :meth:`request` each)."""
        if self._error is not None or self._transport is None:
            raise self._error or SegmentStoreConnectionError(
                f"connection to segment store {self.address} is closed")
        futures = []
        for _command, request_id in commands:
            future: asyncio.Future[WireCommand] = self._loop.create_future()
            self._pending[request_id] = future
            futures.append(future)
        self._transport.write(b"".join(c.encode() for c, _ in commands))
        return futures

    def abort(self) -> None:
        """Drop the connection now (pending requests fail: outcome unknown)."""
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        await self.closed.wait()
