"""The bookie's admin requests, served beside ``/metrics`` over HTTP.

One request so far: ``POST /admin/gc`` runs GC and a major compaction now
(:meth:`~quire.bookie.services.BackgroundServices.gc_now`) and answers, once
it is done, ``200`` with a JSON object of what it did (``ledgers_dropped``,
``entry_logs_removed``, ``compaction`` and ``compaction_stats``), or ``500``
with ``{"error": ...}``.  ``quire bookie gc --now`` sends it to the
metrics address each bookie registers.  Any other path is the metrics
endpoint's.

Why HTTP on the metrics server rather than a protocol op: an admin request
is rare, slow (a compaction may take minutes) and answered by a JSON
report, none of which fits the ledger protocol's binary frames, timeouts
and status codes; a new op would also be a wire-format change every client
and codec would carry (golden bytes, fuzzing) for the sake of an operator's
tool.  The metrics server already listens on an operator-facing port, runs
each request on a thread of its own (so a long GC holds no event loop and
no scrape), and is off unless configured (``metrics_port``), so this opens
nothing new.  What the request can do is only what the GC timer does
anyway, on demand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from quire.bookie.services import BackgroundServices
from quire.errors import AdminRequestError

log = logging.getLogger("quire.bookie")

GC_PATH = "/admin/gc"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class AdminActions(Protocol):
    """What the admin endpoint can ask of a bookie.  Called on one of the
    HTTP server's threads; blocks until the action is done."""

    def gc_now(self) -> dict[str, Any]:
        """Run GC and a major compaction now; a JSON-ready report."""
        ...


class LoopAdminActions:
    """:class:`AdminActions` run on the bookie's event loop (from the HTTP
    server's thread)."""

    def __init__(self, services: BackgroundServices, loop: asyncio.AbstractEventLoop) -> None:
        self._services = services
        self._loop = loop

    def gc_now(self) -> dict[str, Any]:
        report = asyncio.run_coroutine_threadsafe(self._services.gc_now(), self._loop).result()
        return dataclasses.asdict(report)


def admin_app(registry: CollectorRegistry, actions: AdminActions
              ) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """A WSGI app: the admin requests, and ``registry``'s metrics for every
    other path."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != GC_PATH:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if environ.get("REQUEST_METHOD") != "POST":
            return _json(start_response, "405 Method Not Allowed",
                         {"error": f"{GC_PATH} takes POST"})
        try:
            report = actions.gc_now()
        except Exception as e:  # the answer says what failed; the server goes on
            log.exception("admin gc failed")
            return _json(start_response, "500 Internal Server Error",
                         {"error": f"{type(e).__name__}: {e}"})
        return _json(start_response, "200 OK", report)

    return app


def _json(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
    return [data]


def request_gc(metrics_address: str, *, timeout_s: float) -> dict[str, Any]:
    """Send ``POST /admin/gc`` to the bookie whose metrics endpoint is
    ``metrics_address`` (``host:port``) and return its report once it is
    done (:class:`~quire.errors.AdminRequestError` if it cannot be asked or
    answers an error)."""
    url = f"http://{metrics_address}{GC_PATH}"
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            body: dict[str, Any] = json.loads(answer.read())
            return body
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read()).get("error", e.reason)
        except ValueError:
            reason = e.reason
        raise AdminRequestError(f"{url}: {reason}") from None
    except (OSError, ValueError) as e:
        raise AdminRequestError(f"{url}: {e}") from None


def serve_admin(registry: CollectorRegistry, actions: AdminActions, host: str,
                port: int) -> ThreadingWSGIServer:
    """Start the metrics and admin endpoint on a daemon thread; the server
    (``server_port`` is the port it listens on)."""
    server = make_server(host, port, admin_app(registry, actions), ThreadingWSGIServer,
                         handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, name="quire-metrics", daemon=True).start()
    return server
