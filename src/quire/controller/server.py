"""The controller process's service: :class:`Controller` serves
``ControllerService`` (and Quire's ``Admin``) on grpc.aio, and runs the
leader's duties when it leads: the sweep (transaction leases, workflows
left by dead controllers), retention and auto-scaling's requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc

from quire.auth import ServerSecurity
from quire.clock import SYSTEM_CLOCK, Clock
from quire.controller.access import TokenIssuer
from quire.controller.admin import AdminService
from quire.controller.cluster import ControllerCluster
from quire.controller.core import ControllerConfig, ControllerCore
from quire.controller.interceptor import ControllerInterceptor, ControllerRpcConfig
from quire.controller.reader_groups import ReaderGroups
from quire.controller.rest import ControllerRest
from quire.controller.service import ControllerService, SegmentLocator
from quire.controller.state import ControllerSegmentStore
from quire.errors import ConfigError
from quire.http import HttpServer, Route, SessionStore
from quire.security import TokenSigner
from quire.segmentstore.scale_requests import ScaleRequests

log = logging.getLogger(__name__)


class Controller:
    """A Pravega-compatible controller over a segment store.

    ``store`` holds the segments and the controller's own tables (the seam
    :class:`~quire.controller.state.ControllerSegmentStore`);
    ``locate`` gives the ``(host, port)`` getURI answers for each segment;
    ``clock`` the wall clock of leases and retention; ``cluster`` the other
    controllers (None: this is the only one); ``requests`` where the
    segment stores post auto-scaling requests (None: no auto-scaling);
    ``security`` the TLS and authenticator of the gRPC port and the HTTP
    endpoints (none: plain and open); ``tokens`` signs the delegation
    tokens ``getDelegationToken`` answers (with an authenticator; none:
    ""); ``rpc`` the gRPC limits (:mod:`quire.controller.interceptor`).
    :meth:`start` binds and starts serving and the duties' loops;
    :meth:`close` stops.
    """

    def __init__(self, store: ControllerSegmentStore, config: ControllerConfig,
                 locate: SegmentLocator, clock: Clock = SYSTEM_CLOCK,
                 cluster: ControllerCluster | None = None,
                 requests: ScaleRequests | None = None,
                 security: ServerSecurity | None = None,
                 tokens: TokenSigner | None = None,
                 rpc: ControllerRpcConfig | None = None) -> None:
        self.security = security or ServerSecurity()
        self.rpc = rpc or ControllerRpcConfig()
        self.core = ControllerCore(store, config, clock, cluster=cluster, requests=requests)
        self.service = ControllerService(self.core, locate)
        if tokens is not None and self.security.authenticator is not None:
            self.service.tokens = TokenIssuer(tokens, self.rpc.delegation_token_ttl_ms,
                                              config.txn_max_lease_ms)
        self.interceptor = ControllerInterceptor(self.security.authenticator,
                                                 self.rpc.max_concurrent_rpcs,
                                                 self.core.metrics.registry)
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        """The transaction sweeper and the retention pass, while serving."""
        self.port: int | None = None
        """The bound port once started."""
        self._metrics_server: HttpServer | None = None
        self.metrics_port: int | None = None
        """The port of ``/metrics`` once started, if it is served."""
        self.reader_groups = ReaderGroups(store)
        """The REST API's reader groups (a host sets its ``lister``)."""
        self.http_routes: list[Route] = []
        self.sessions: SessionStore | None = None
        """More routes for the HTTP port (the cluster page) and its browser
        sessions: set before :meth:`start`.  The REST API (:mod:`quire.controller.rest`)
        is always served there."""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve on ``host:port`` (0: any free port); the port bound."""
        if self._server is not None:
            raise ConfigError("the controller is started already")
        await self.core.start()
        server = grpc.aio.server(interceptors=(self.interceptor,),
                                 options=self.rpc.server_options())
        server.add_generic_rpc_handlers((self.service.handler(),
                                         AdminService(self.core).handler()))
        tls = self.security.tls
        bound: int = (server.add_secure_port(f"{host}:{port}", tls.grpc_credentials())
                      if tls is not None else server.add_insecure_port(f"{host}:{port}"))
        if bound == 0:
            raise ConfigError(f"controller: cannot listen on {host}:{port}")
        config = self.core.config
        if config.metrics_port >= 0:
            routes = [*ControllerRest(self.core, self.reader_groups).routes(), *self.http_routes]
            self._metrics_server = HttpServer(
                self.core.metrics.registry, routes, tls=self.security.tls,
                authenticator=self.security.authenticator, sessions=self.sessions,
                ready=lambda: (True, "") if self._server is not None else (False, "starting"))
            self.metrics_port = await self._metrics_server.start(host, config.metrics_port)
        await server.start()
        self._server = server
        self.port = bound
        self._tasks = [
            asyncio.create_task(self._every(config.txn_sweep_interval_ms, self._sweep,
                                            "sweep"), name="controller-sweeper"),
            asyncio.create_task(self._every(config.retention_interval_ms, self.core.retain,
                                            "retention"), name="controller-retention"),
            asyncio.create_task(self._every(config.autoscale_interval_ms, self.core.autoscale,
                                            "auto-scaling"), name="controller-autoscale")]
        log.info("controller serving on %s:%d", host, bound)
        return bound

    async def _sweep(self) -> None:
        self.core.metrics.leader.set(1 if self.core.cluster.is_leader else 0)
        await self.core.sweep()

    async def _every(self, interval_ms: int, work: Callable[[], Awaitable[None]],
                     what: str) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)  # a period, not a wait for something
            try:
                await work()
            except Exception:  # the next pass retries; the task must live on
                log.exception("controller: %s failed", what)

    async def close(self, grace_s: float = 1.0) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        await self.core.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()
            self._metrics_server = None
