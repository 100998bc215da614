"""The HTTP server of every Quire process: ``/metrics``, ``/health`` and a process's own routes.

One server per process (the bookie's metrics port with ``POST /admin/gc``,
the segment store's and the controller's metrics ports), on aiohttp, on the
process's event loop:

* ``GET /metrics``: Prometheus text (or OpenMetrics, by the ``Accept``
  header) of the registry it was given;
* ``GET /health``: ``{"status": "ok"}``, never authenticated (a load
  balancer's or supervisor's probe), and saying nothing else (a process
  that gives a ``health`` callable has it say the status word, e.g. a
  segment store's ``"degraded"`` while a container is not ok; what and
  why is on the process's own authenticated routes);
* ``GET /ready``: ``200 {"status": "ready"}`` once the process finished
  starting and holds what it needs (the ``ready`` callable it was given
  says; without one, as soon as it serves), else ``503 {"status": "not
  ready", "reason": ...}``; never authenticated either;
* the caller's :class:`Route` s (e.g. :func:`json_route`).

**TLS** when given a :class:`~quire.security.ServerTls` (its context, so
certificates reload as the files change).  A plaintext client or garbage
on the TLS port closes that connection only.

**Authentication** when given an :class:`~quire.security.Authenticator`:
every request but ``/health`` must carry an ``authorization`` header it
accepts (Basic against the user database, or Bearer), else ``401`` with
``WWW-Authenticate: Basic realm="quire"``.  **Authorization** treats the
cluster as the resource (``prn::/``): ``GET`` and ``HEAD`` need ``READ``,
any other method ``READ_UPDATE`` (a route may ask for another permission),
else ``403``.  So Prometheus scrapes with a user whose ACL is
``prn::/,READ``, and ``quire bookie gc --now`` needs ``prn::/,READ_UPDATE``.
Every refusal answers a JSON ``{"error": ...}`` and is counted on
``/metrics`` (``quire_http_refusals_total{reason="unauthenticated"|"forbidden"}``);
so do 404, 405 and 400 (a route raising
:class:`~quire.errors.HttpRequestError` answers its status and message;
:func:`read_json` refuses a body that is not a JSON object that way).
Without an authenticator the server is open, as before this module existed.
A route marked ``public`` is never authenticated (a login form, its
static files).  **Browser sessions** (:mod:`quire.http.sessions`) when
given a :class:`~quire.http.sessions.SessionStore`: a session cookie
stands for the ``authorization`` header, and a change made with it needs
the session's CSRF token.

Decisions:

* aiohttp on the process's own event loop, not a thread per request
  (prometheus_client's server, used before): the collectors read the
  process's state where it changes (no cross-thread reads of dicts the
  loop mutates), and an admin route awaits the process's own coroutines.
  A scrape costs the loop what generating the text costs (a few ms for a
  bookie's registry); the password checks it may trigger run on a worker
  thread (:mod:`quire.auth`).
* aiohttp is imported when a server starts, not when this module is: a
  process that serves no HTTP (``metrics_port = -1``, most test processes)
  does not pay its import (about a third of a second).
* One server per registry: it registers its refusal counter there.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

from quire.errors import (
    AuthenticationError,
    ConfigError,
    HttpRequestError,
    MetadataError,
    SecurityError,
)
from quire.http.sessions import COOKIE_NAME, CSRF_HEADER, SessionStore
from quire.security import (
    CLUSTER_RESOURCE,
    Authenticator,
    Permission,
    Principal,
    ServerTls,
)

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("quire.http")

METRICS_PATH = "/metrics"
HEALTH_PATH = "/health"
READY_PATH = "/ready"
UNGUARDED_PATHS = frozenset({HEALTH_PATH, READY_PATH})
QUIET_HEADER = "X-Quire-Page"
"""A page's own requests send it: a 401 then has no ``WWW-Authenticate``,
so the browser shows the page's login form rather than its own dialog."""
READ_METHODS = frozenset({"GET", "HEAD"})

Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]
Readiness = Callable[[], tuple[bool, str]]
"""Whether the process is ready, and if not why (``/ready``)."""


@dataclass(frozen=True)
class Route:
    """A caller's route; ``permission`` on the cluster resource it needs
    (None: READ for GET and HEAD, READ_UPDATE otherwise)."""

    method: str
    path: str
    handler: Handler
    permission: Permission | None = None
    public: bool = False
    """Served to anyone, never authenticated (a login form and its files)."""

    def needs(self) -> Permission:
        if self.permission is not None:
            return self.permission
        return Permission.READ if self.method.upper() in READ_METHODS else \
            Permission.READ_UPDATE


@functools.cache
def _principal_key() -> web.RequestKey[Principal]:
    from aiohttp import web

    return web.RequestKey("quire_principal", Principal)


def principal_of(request: web.Request) -> Principal | None:
    """The principal a request was authenticated as (None when the server
    has no authenticator, or on ``/health``)."""
    return request.get(_principal_key())


def json_response(status: int, body: Any, headers: dict[str, str] | None = None
                  ) -> web.Response:
    """A JSON answer (``{"error": ...}`` for refusals and failures)."""
    from aiohttp import web

    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers=headers)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object; HttpRequestError 400 saying what
    is wrong otherwise."""
    try:
        body = await request.json(loads=json.loads)
    except ValueError as e:
        raise HttpRequestError(400, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise HttpRequestError(400, "the body must be a JSON object")
    return body


def json_route(method: str, path: str, action: Callable[[], Awaitable[dict[str, Any]]],
               permission: Permission | None = None) -> Route:
    """A route answering ``200`` with what ``action()`` returns as JSON, or
    ``500`` with ``{"error": "<type>: <message>"}`` if it raises (the
    server goes on)."""

    async def handler(_request: web.Request) -> web.StreamResponse:
        try:
            body = await action()
        except Exception as e:  # the answer says what failed
            log.exception("%s %s failed", method, path)
            return json_response(500, {"error": f"{type(e).__name__}: {e}"})
        return json_response(200, body)

    return Route(method, path, handler, permission)


class HttpServer:
    """See the module docstring: start with :meth:`start`, stop with :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, routes: Sequence[Route] = (), *,
                 tls: ServerTls | None = None,
                 authenticator: Authenticator | None = None,
                 ready: Readiness | None = None,
                 sessions: SessionStore | None = None,
                 health: Callable[[], str] | None = None) -> None:
        self.registry = registry
        self.routes = tuple(routes)
        self.tls = tls
        self.authenticator = authenticator
        self.ready = ready
        self.sessions = sessions
        self.health = health
        self.refusals = Counter("quire_http_refusals", "HTTP requests refused, by reason",
                                ["reason"], registry=registry)
        for reason in ("unauthenticated", "forbidden", "not_found", "method_not_allowed",
                       "bad_request"):
            self.refusals.labels(reason)
        self._needs = {(r.method.upper(), r.path): r.needs() for r in self.routes}
        self._public = {(r.method.upper(), r.path) for r in self.routes if r.public}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        """The bound port once started."""

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); the port bound."""
        from aiohttp import web

        if self._runner is not None:
            raise ConfigError("the HTTP server is started already")
        app = web.Application(middlewares=self._middlewares())
        app.router.add_get(METRICS_PATH, self._metrics)
        app.router.add_get(HEALTH_PATH, self._health)
        app.router.add_get(READY_PATH, self._ready)
        for route in self.routes:
            app.router.add_route(route.method.upper(), route.path, route.handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True,
                           ssl_context=self.tls.context if self.tls is not None else None)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise ConfigError(f"HTTP: cannot listen on {host}:{port}: {e}") from None
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        """Stop listening and close the connections (idempotent)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # --- request handling -----------------------------------------------------------

    def _route_key(self, request: web.Request) -> tuple[str, str]:
        """(method, path pattern) of the route a request matched."""
        resource = request.match_info.route.resource
        canonical = resource.canonical if resource is not None else request.path
        return request.method, canonical

    def _needs_for(self, request: web.Request) -> Permission:
        needed = self._needs.get(self._route_key(request))
        if needed is not None:
            return needed
        return Permission.READ if request.method in READ_METHODS else Permission.READ_UPDATE

    def _middlewares(self) -> list[Any]:
        """Errors as JSON (outside), then authentication and authorization."""
        from aiohttp import web

        @web.middleware
        async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPException as e:  # routing's 404 and 405, as JSON
                self._count(e.status)
                headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
                return json_response(e.status, {"error": e.reason}, headers)
            except HttpRequestError as e:
                self._count(e.http_status)
                return json_response(e.http_status, {"error": str(e)})

        @web.middleware
        async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.authenticator is None or request.path in UNGUARDED_PATHS or \
                    self._route_key(request) in self._public:
                return await handler(request)
            authorization = request.headers.get("Authorization")
            session = None
            if authorization is None and self.sessions is not None:
                session = self.sessions.get(request.cookies.get(COOKIE_NAME))
            if session is not None:
                principal: Principal = session.principal
                if request.method not in READ_METHODS and \
                        not session.csrf_matches(request.headers.get(CSRF_HEADER)):
                    self.refusals.labels("forbidden").inc()
                    return json_response(403, {"error": "a change needs the session's CSRF "
                                                        f"token in {CSRF_HEADER}"})
            else:
                try:
                    principal = await self.authenticator.authenticate(authorization)
                except AuthenticationError as e:
                    self.refusals.labels("unauthenticated").inc()
                    headers = {} if QUIET_HEADER in request.headers else {
                        "WWW-Authenticate": 'Basic realm="quire", charset="UTF-8"'}
                    return json_response(401, {"error": str(e)}, headers)
                except (MetadataError, SecurityError) as e:  # the user database unreachable
                    log.warning("HTTP: cannot check credentials: %s", e)
                    return json_response(503, {"error": f"cannot check credentials: {e}"})
            needed = self._needs_for(request)
            if not principal.allows(CLUSTER_RESOURCE, needed):
                self.refusals.labels("forbidden").inc()
                return json_response(403, {"error": f"{principal.name} may not "
                                                    f"{needed.name} {CLUSTER_RESOURCE}"})
            request[_principal_key()] = principal
            return await handler(request)

        return [answer_errors, authorize]

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self.registry), headers={"Content-Type": content_type})

    def _count(self, status: int) -> None:
        reason = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(status)
        if reason is not None:
            self.refusals.labels(reason).inc()

    async def _health(self, _request: web.Request) -> web.StreamResponse:
        return json_response(200, {"status": "ok" if self.health is None else self.health()})

    async def _ready(self, _request: web.Request) -> web.StreamResponse:
        ready, reason = (True, "") if self.ready is None else self.ready()
        if ready:
            return json_response(200, {"status": "ready"})
        return json_response(503, {"status": "not ready", "reason": reason})
