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
  ``max_connections`` and ``max_connections_per_peer`` close a connection
  over them as soon as it is made (after its handshake, under TLS); a
  sweep every quarter of ``idle_timeout_ms`` closes connections that have
  not said Hello, or leave a started frame unfinished, for longer than it;
  each connection stops being read while its replies are not taken
  (``max_buffered_reply_bytes``) or its budget is spent
  (``max_outstanding_bytes``).  Closures are counted on ``/metrics`` by
  reason (``quire_segmentstore_connections_refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from quire.errors import ConfigError
from quire.security import ServerTls
from quire.segmentserver.auth import WireAuth
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.connection import WireConnection
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import ClientConnection
from quire.segmentstore import SegmentStore

log = logging.getLogger("quire.segmentserver")


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
        self._server: asyncio.Server | None = None
        self._connections: set[WireConnection] = set()
        self._per_peer: Counter[str] = Counter()
        self._appenders: dict[tuple[int, str], ClientConnection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.host = ""
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (port 0: any free one; :attr:`port` says which)."""
        if self._server is not None:
            raise ConfigError("the segment server is started already")
        loop = asyncio.get_running_loop()
        idle_s = self.config.idle_timeout_ms / 1000
        if self.tls is not None:
            self._server = await loop.create_server(self._connection, host, port,
                                                    ssl=self.tls.context,
                                                    ssl_handshake_timeout=idle_s)
        else:
            self._server = await loop.create_server(self._connection, host, port)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        self._sweeper = loop.create_task(self._sweep(), name="segment-server-idle-sweep")

    def _connection(self) -> WireConnection:
        return WireConnection(self.store, self.config, self._lost, self._appenders,
                              self.metrics, auth=self.auth, admit=self._admit)

    def _admit(self, connection: WireConnection) -> str | None:
        """Take ``connection`` on, or the limit it is over (it is then closed)."""
        reason = None
        if len(self._connections) >= self.config.max_connections:
            reason = "max_connections"
        elif self._per_peer[connection.peer] >= self.config.max_connections_per_peer:
            reason = "max_connections_per_peer"
        if reason is not None:
            self._refused(reason)
            log.warning("refusing a connection from %s: %s", connection.peer, reason)
            return reason
        self._connections.add(connection)
        self._per_peer[connection.peer] += 1
        if self.metrics is not None:
            self.metrics.connections.inc()
        return None

    def _lost(self, connection: WireConnection) -> None:
        if connection not in self._connections:
            return  # refused when it was made
        self._connections.discard(connection)
        self._per_peer[connection.peer] -= 1
        if self._per_peer[connection.peer] <= 0:
            del self._per_peer[connection.peer]
        if self.metrics is not None:
            self.metrics.connections.dec()

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_refused.labels(reason).inc()

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
                    self._refused("idle_timeout")
                    connection.close(f"no Hello or an unfinished frame for over "
                                     f"{self.config.idle_timeout_ms} ms")

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
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        self._server.close()
        self.abort_connections()
        await self._server.wait_closed()
        self._server = None
