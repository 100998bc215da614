"""The controller process's service: :class:`Controller` serves
``ControllerService`` on grpc.aio and sweeps transaction leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from quire.controller.core import ControllerConfig, ControllerCore
from quire.controller.service import ControllerService, NodeAddress
from quire.controller.state import ControllerSegmentStore
from quire.errors import ConfigError

log = logging.getLogger(__name__)


class Controller:
    """A Pravega-compatible controller over a segment store.

    ``store`` holds the segments and the controller's own tables (the seam
    :class:`~quire.controller.state.ControllerSegmentStore`);
    ``segment_store_uri()`` gives the ``(host, port)`` getURI answers for
    every segment.  :meth:`start` binds, recovers the transactions' leases
    and starts serving; :meth:`close` stops.
    """

    def __init__(self, store: ControllerSegmentStore, config: ControllerConfig,
                 segment_store_uri: Callable[[], NodeAddress]) -> None:
        self.core = ControllerCore(store, config)
        self.service = ControllerService(self.core, segment_store_uri)
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.port: int | None = None
        """The bound port once started."""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve on ``host:port`` (0: any free port); the port bound."""
        if self._server is not None:
            raise ConfigError("the controller is started already")
        await self.core.start()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self.service.handler(),))
        bound: int = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise ConfigError(f"controller: cannot listen on {host}:{port}")
        await server.start()
        self._server = server
        self.port = bound
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="controller-sweeper")
        log.info("controller serving on %s:%d", host, bound)
        return bound

    async def _sweep_forever(self) -> None:
        interval_s = self.core.config.txn_sweep_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)  # a period, not a wait for something
            try:
                await self.core.sweep()
            except Exception:  # the next pass retries; the sweeper must live on
                log.exception("controller: transaction sweep failed")

    async def close(self, grace_s: float = 1.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
