"""The bookie's listening socket: admission, TLS and mutual TLS, idle connections.

:class:`BookieListener` accepts connections for a
:class:`~quire.bookie.server.BookieServer`:

* every accepted connection is admitted by the hub's limits first
  (:meth:`~quire.bookie.connection.ConnectionHub.admit`), before any byte
  of it is read;
* **TLS** when the bookie has a certificate (``tls_cert_file``): the
  listener accepts each connection itself, admits it, and hands it to the
  loop's TLS layer (``loop.connect_accepted_socket``); its
  :class:`~quire.bookie.connection.BookieConnection` is made when the
  handshake is done, so no request is read from a peer that did not
  finish it.  The certificate is
  the :class:`~quire.security.ServerTls`' (reloaded when the files change:
  new handshakes present the new one, open connections keep theirs);
* **mutual TLS** when ``tls_ca_file`` is set: the handshake requires a
  client certificate the CA signed, and its role (the subject field
  ``tls_role_field``, ``OU`` by default) must be one of
  ``tls_allowed_roles`` (empty: any role; BookKeeper's
  ``BookieAuthZFactory``), checked when the handshake is done, before
  anything the peer sent is read;
* a handshake that fails (a plaintext client, garbage, an untrusted or
  missing certificate) or does not finish within ``idle_timeout_ms``
  closes that connection only, counted on ``/metrics``
  (``quire_bookie_connection_refusals_total{reason="tls_handshake"}``,
  ``"idle_timeout"`` for one that took too long, ``"tls_role"`` for a role
  refused); the listener goes on serving;
* a sweep every quarter of ``idle_timeout_ms`` closes the idle connections
  (:meth:`~quire.bookie.connection.ConnectionHub.sweep_idle`).

The plaintext path is a plain asyncio server of
:class:`~quire.bookie.connection.BookieConnection` s: admission happens in
their ``connection_made``, nothing else is added.  Both paths make the same
connection object, so the request path is the same over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Coroutine
from typing import Any, cast

from quire.bookie.connection import BookieConnection, ConnectionHub, RequestHandler, peer_host
from quire.errors import RoleNotAllowedError
from quire.security import ServerTls, require_role

log = logging.getLogger("quire.bookie")

SWEEPS_PER_TIMEOUT = 4
MIN_SWEEP_INTERVAL_S = 0.05
DEFAULT_HANDSHAKE_TIMEOUT_S = 60.0
"""A handshake's limit without ``idle_timeout_ms`` (asyncio's default)."""

class _Authorized(BookieConnection):
    """A connection over TLS: its peer's certificate role is checked when
    the handshake is done, before anything it sent is read (the TLS layer
    calls ``connection_made`` then, before any ``data_received``)."""

    def __init__(self, listener: BookieListener, hub: ConnectionHub,
                 handler: RequestHandler) -> None:
        super().__init__(hub, handler, admitted=True)
        self._listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._listener.authorize(transport):
            super().connection_made(transport)


class BookieListener:
    """See the module docstring.  ``tls`` None: plaintext."""

    def __init__(self, hub: ConnectionHub, handler: RequestHandler, tls: ServerTls | None, *,
                 allowed_roles: tuple[str, ...] = (), role_field: str = "OU") -> None:
        self.hub = hub
        self._handler = handler
        self._tls = tls
        self._allowed_roles = frozenset(allowed_roles)
        self._role_field = role_field
        timeout_ms = hub.limits.idle_timeout_ms
        self._handshake_timeout_s = timeout_ms / 1000.0 if timeout_ms else \
            DEFAULT_HANDSHAKE_TIMEOUT_S
        self._server: asyncio.Server | None = None
        self._socket: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """The accept loop, the sweep and the TLS handshakes in progress."""

    async def start(self, host: str, port: int) -> int:
        """Listen; the port (``port`` 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        if self._tls is None:
            hub, handler = self.hub, self._handler
            self._server = await loop.create_server(lambda: BookieConnection(hub, handler),
                                                    host, port, reuse_address=True)
            port = int(self._server.sockets[0].getsockname()[1])
        else:
            self._socket = listening_socket(host, port)
            port = int(self._socket.getsockname()[1])
            self._spawn(self._accept(self._socket))
        if self.hub.limits.idle_timeout_ms:
            self._spawn(self._sweep())
        return port

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listening: socket.socket) -> None:
        """TLS: accept, admit (before a byte is read), hand the socket to
        the loop's TLS layer with the handshake's deadline."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listening)
            except OSError as e:  # EMFILE and the like: wait, do not spin
                log.warning("accepting a connection failed: %s", e)
                await asyncio.sleep(0.1)
                continue
            host = str(address[0]) if isinstance(address, tuple) else "?"
            if not self.hub.admit(host):
                abort_socket(sock)
                continue
            self._spawn(self._handshake(sock, host))

    async def _handshake(self, sock: socket.socket, host: str) -> None:
        assert self._tls is not None
        hub, handler = self.hub, self._handler
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: _Authorized(self, hub, handler), sock, ssl=self._tls.context,
                ssl_handshake_timeout=self._handshake_timeout_s)
        except asyncio.CancelledError:  # (the loop closes the socket it was given)
            hub.leave(host)
            raise
        except Exception as e:  # any failed handshake closes this connection only
            hub.leave(host)
            timed_out = isinstance(e, ConnectionAbortedError) and "longer" in str(e)
            hub.refused("idle_timeout" if timed_out else "tls_handshake",
                        f"{host}: {e or type(e).__name__}")

    def authorize(self, transport: asyncio.BaseTransport) -> bool:
        """Whether the peer of a finished handshake may go on (its role is
        allowed); a refused one is closed and counted."""
        if not self._allowed_roles:
            return True
        try:
            require_role(transport.get_extra_info("peercert"), self._allowed_roles,
                         self._role_field)
        except RoleNotAllowedError as e:
            host = peer_host(transport)
            cast(asyncio.Transport, transport).abort()
            self.hub.leave(host)
            self.hub.refused("tls_role", f"{host}: {e}")
            return False
        return True

    async def _sweep(self) -> None:
        interval = max(MIN_SWEEP_INTERVAL_S,
                       self.hub.limits.idle_timeout_ms / 1000.0 / SWEEPS_PER_TIMEOUT)
        while True:
            await asyncio.sleep(interval)
            try:
                self.hub.sweep_idle(asyncio.get_running_loop().time())
            except Exception:  # pragma: no cover - the sweep never stops the bookie
                log.exception("idle connection sweep failed")

    def close(self) -> None:
        """Stop accepting, the sweep and the handshakes in progress (open
        connections are the hub's to close)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def wait_closed(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def listening_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking listening TCP socket (SO_REUSEADDR, as asyncio's servers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def abort_socket(sock: socket.socket) -> None:
    """Close with a reset, not a graceful FIN (nothing is owed to the peer);
    only for a socket the loop was never given."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
