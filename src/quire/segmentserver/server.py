"""The wire server: listens, and serves each client connection with a
:class:`~quire.segmentserver.connection.WireConnection` over one
:class:`~quire.segmentstore.SegmentStore` (behaviour in :mod:`quire.segmentserver`)."""

from __future__ import annotations

import asyncio

from quire.errors import ConfigError
from quire.segmentserver.config import SegmentServerConfig
from quire.segmentserver.connection import WireConnection
from quire.segmentserver.metrics import SegmentServerMetrics
from quire.segmentserver.replies import ClientConnection
from quire.segmentstore import SegmentStore


class SegmentServer:
    """Serves one :class:`~quire.segmentstore.SegmentStore` on a TCP port."""

    def __init__(self, store: SegmentStore, config: SegmentServerConfig | None = None,
                 metrics: SegmentServerMetrics | None = None) -> None:
        self.metrics = metrics
        self.store = store
        self.config = config or SegmentServerConfig()
        self._server: asyncio.Server | None = None
        self._connections: set[WireConnection] = set()
        self._appenders: dict[tuple[int, str], ClientConnection] = {}
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
