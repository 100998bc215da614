"""The wire server: listens, and serves each client connection with a
:class:`~quire.segmentserver.connection.WireConnection` over one
:class:`~quire.segmentstore.SegmentStore` (behaviour in :mod:`quire.segmentserver`).

Security and limits (all optional; without them the server is plain and open):

* **TLS** with a :class:`~quire.security.ServerTls` (its context, so a
  certificate replaced on disk is presented by the next handshake and
  open connections keep theirs).  The handshake must finish within
  ``idle_timeout_ms``; a plaintext client or garbage fails it, which
  closes that connection only.
* **Tokens** with a :class:`~quire.segmentserver.auth.WireAuth`.
* **Limits** (:class:`~quire.segmentserver.config.SegmentServerConfig`):
  the server accepts connections itself (``sock_accept``) and closes one
  over ``max_connections`` or ``max_connections_per_peer`` at once, before
  any TLS state or protocol object is made for it (a connection counts
  from its accept, its handshake included); a sweep every quarter of
  ``idle_timeout_ms`` closes connections that have not said Hello, or
  leave a started frame unfinished, for longer than it; each connection
  stops being read while its replies are not taken
  (``max_buffered_reply_bytes``) or its budget is spent
  (``max_outstanding_bytes``).  Closures are counted on ``/metrics`` by
  reason (``quire_segmentstore_connections_refused``: ``max_connections``,
  ``max_connections_per_peer``, ``idle_timeout``, ``tls_handshake``), and
  logged at most once per ``REFUSAL_LOG_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass

from quire.errors import ConfigError
from quire.security import ServerTls
from quire.segmentserver.auth import WireAuth
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.connection import WireConnection
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import ClientConnection
from quire.segmentstore import SegmentStore

log = logging.getLogger("quire.segmentserver")
REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass
class _Slot:
    """A connection counted against the limits, from its accept to its end."""

    peer: str
    held: bool = True


class SegmentServer:
    """Serves one :class:`~quire.segmentstore.SegmentStore` on a TCP port
    (with ``tls``: TLS; with ``auth``: every request's token checked)."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig | None = None,
                 metrics: SegmentServerMetrics | None = None, *,
                 tls: ServerTls | None = None, auth: WireAuth | None = None) -> None:
        self.metrics = metrics
        self.store = store
        self.config = config or SegmentServerConfig()
        self.tls = tls
        self.auth = auth
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """The accept loop, the idle sweep and the connections being set up."""
        self._connections: set[WireConnection] = set()
        self._none_left = asyncio.Event()
        """Set while no connection is served (what close waits for)."""
        self._none_left.set()
        self._slots: dict[WireConnection, _Slot] = {}
        self._accepted = 0
        self._per_peer: Counter[str] = Counter()
        self._appenders: dict[tuple[int, str], ClientConnection] = {}
        self._quiet_until = 0.0
        """Refusals are logged again from this time (monotonic)."""
        self.host = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (port 0: any free one; :attr:`port` says which)."""
        if self._listener is not None:
            raise ConfigError("the segment server is started already")
        try:
            listener = socket.create_server((host, port), backlog=1024)
        except OSError as e:
            raise ConfigError(f"segment server: cannot listen on {host}:{port}: {e}") from None
        listener.setblocking(False)
        self._listener = listener
        self.host, self.port = listener.getsockname()[:2]
        loop = asyncio.get_running_loop()
        for work, name in ((self._accept(), "segment-server-accept"),
                           (self._sweep(), "segment-server-idle-sweep")):
            self._spawn(loop.create_task(work, name=name))

    def _spawn(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- accepting, within the limits --------------------------------------------------

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            try:
                sock, address = await loop.sock_accept(self._listener)
            except OSError as e:  # out of descriptors, say: the next accept may work
                log.warning("segment server: accept failed: %s", e)
                await asyncio.sleep(0.1)  # a backoff, not a wait for an event
                continue
            peer = str(address[0]) if isinstance(address, tuple) else ""
            reason = None
            if self._accepted >= self.config.max_connections:
                reason = "max_connections"
            elif self._per_peer[peer] >= self.config.max_connections_per_peer:
                reason = "max_connections_per_peer"
            if reason is not None:
                sock.close()
                self._refused(reason, peer)
                continue
            slot = _Slot(peer)
            self._accepted += 1
            self._per_peer[peer] += 1
            self._spawn(loop.create_task(self._set_up(sock, slot)))

    async def _set_up(self, sock: socket.socket, slot: _Slot) -> None:
        """Serve an accepted socket (its TLS handshake first, under TLS)."""
        loop = asyncio.get_running_loop()
        made: list[WireConnection] = []

        def connection() -> WireConnection:
            made.append(self.protocol())
            self._slots[made[0]] = slot
            return made[0]

        try:
            if self.tls is not None:
                await loop.connect_accepted_socket(
                    connection, sock, ssl=self.tls.context,
                    ssl_handshake_timeout=self.config.idle_timeout_ms / 1000)
            else:
                await loop.connect_accepted_socket(connection, sock)
        except Exception as e:  # the handshake failed or timed out: this connection only
            if made:
                self._slots.pop(made[0], None)
            if self._release(slot) and self.tls is not None:
                self._refused("tls_handshake", slot.peer, f" ({type(e).__name__}: {e})")
            with contextlib.suppress(OSError):
                sock.close()

    def protocol(self) -> WireConnection:
        """A new connection's protocol, for a transport accepted by the caller
        (the accept loop here; an in-process network): the connection
        limits count only what the accept loop accepted."""
        return WireConnection(self.store, self.config, self._lost, self._appenders,
                              self.metrics, auth=self.auth, on_made=self._made)

    def _made(self, connection: WireConnection) -> None:
        self._connections.add(connection)
        self._none_left.clear()
        if self.metrics is not None:
            self.metrics.connections.inc()

    def _lost(self, connection: WireConnection) -> None:
        slot = self._slots.pop(connection, None)
        if slot is not None:
            self._release(slot)
        if connection in self._connections:
            self._connections.discard(connection)
            if not self._connections:
                self._none_left.set()
            if self.metrics is not None:
                self.metrics.connections.dec()

    def _release(self, slot: _Slot) -> bool:
        """Stop counting ``slot`` (once); True if it was still counted."""
        if not slot.held:
            return False
        slot.held = False
        self._accepted -= 1
        self._per_peer[slot.peer] -= 1
        if self._per_peer[slot.peer] <= 0:
            del self._per_peer[slot.peer]
        return True

    def _refused(self, reason: str, peer: str, detail: str = "") -> None:
        if self.metrics is not None:
            self.metrics.connections_refused.labels(reason).inc()
        now = time.monotonic()
        if now >= self._quiet_until:  # one line per interval, whatever the flood
            self._quiet_until = now + REFUSAL_LOG_INTERVAL_S
            log.warning("closing a connection from %s: %s%s (further ones for %g s only on "
                        "quire_segmentstore_connections_refused)", peer, reason, detail,
                        REFUSAL_LOG_INTERVAL_S)

    async def _sweep(self) -> None:
        """Close the connections stalled longer than ``idle_timeout_ms``."""
        timeout_s = self.config.idle_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(timeout_s / 4)  # the sweep's period
            now = loop.time()
            for connection in list(self._connections):
                since = connection.stalled_since()
                if since is not None and now - since > timeout_s:
                    self._refused("idle_timeout", connection.peer)
                    connection.close(f"no Hello or an unfinished frame for over "
                                     f"{self.config.idle_timeout_ms} ms", quiet=True)

    # --- lifetime ------------------------------------------------------------------------

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
        if self._listener is None:
            return
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._listener.close()
        self._listener = None
        self.abort_connections()
        await self._none_left.wait()  # every connection_lost has run
