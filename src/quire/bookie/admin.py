"""The bookie's admin requests, served beside ``/metrics`` by :mod:`quire.http`.

One request so far: ``POST /admin/gc`` runs GC and a major compaction now
(:meth:`~quire.bookie.services.BackgroundServices.gc_now`) and answers, once
it is done, ``200`` with a JSON object of what it did (``ledgers_dropped``,
``entry_logs_removed``, ``compaction`` and ``compaction_stats``), or ``500``
with ``{"error": ...}``.  ``quire bookie gc --now`` sends it to the
metrics address each bookie registers (:func:`request_gc`).

Why HTTP on the metrics server rather than a protocol op: an admin request
is rare, slow (a compaction may take minutes) and answered by a JSON
report, none of which fits the ledger protocol's binary frames, timeouts
and status codes; a new op would also be a wire-format change every client
and codec would carry (golden bytes, fuzzing) for the sake of an operator's
tool.  The metrics server already listens on an operator-facing port, is
off unless configured (``metrics_port``), and, with ``auth_enabled``,
lets a change through only for a user with ``READ_UPDATE`` on the cluster
(``prn::/``), while a scraper's ``READ`` only looks (:mod:`quire.http`).
What the request can do is only what the GC timer does anyway, on demand.
The request is awaited on the bookie's loop like any of its coroutines;
the GC's slow parts run on worker threads, so scrapes and the ledger
protocol go on meanwhile.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from quire.bookie.services import BackgroundServices
from quire.http import HttpServer, Readiness, Route, json_route
from quire.http.client import request_json
from quire.security import Authenticator, ServerTls

GC_PATH = "/admin/gc"


class AdminActions(Protocol):
    """What the admin endpoint can ask of a bookie (awaited on its loop)."""

    async def gc_now(self) -> dict[str, Any]:
        """Run GC and a major compaction now; a JSON-ready report."""
        ...


class ServiceAdminActions:
    """:class:`AdminActions` of a bookie's background services."""

    def __init__(self, services: BackgroundServices) -> None:
        self._services = services

    async def gc_now(self) -> dict[str, Any]:
        return dataclasses.asdict(await self._services.gc_now())


def admin_routes(actions: AdminActions) -> list[Route]:
    """The admin requests as routes of the bookie's HTTP server."""
    return [json_route("POST", GC_PATH, actions.gc_now)]


async def serve_admin(registry: CollectorRegistry, actions: AdminActions, host: str, port: int,
                      *, tls: ServerTls | None = None,
                      authenticator: Authenticator | None = None,
                      extra_routes: Sequence[Route] = (),
                      ready: Readiness | None = None) -> HttpServer:
    """Start the metrics and admin endpoint (``port`` 0: any free one), with
    ``extra_routes`` (the node's admin API, :mod:`quire.node.admin_api`) and
    ``ready`` answering ``/ready``; the started server (``.port`` is the
    port it listens on)."""
    server = HttpServer(registry, [*admin_routes(actions), *extra_routes], tls=tls,
                        authenticator=authenticator, ready=ready)
    await server.start(host, port)
    return server


def request_gc(metrics_address: str, *, timeout_s: float, tls: ssl.SSLContext | None = None,
               authorization: str | None = None) -> dict[str, Any]:
    """Send ``POST /admin/gc`` to the bookie whose metrics endpoint is
    ``metrics_address`` (``host:port``; over HTTPS with ``tls``, with the
    ``authorization`` header if given) and return its report once it is
    done (:class:`~quire.errors.AdminRequestError` if it cannot be asked or
    answers an error, a refusal included)."""
    return request_json("POST", metrics_address, GC_PATH, timeout_s=timeout_s, tls=tls,
                        authorization=authorization)
