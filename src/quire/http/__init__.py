"""The one HTTP server of every Quire process (rank 2: over
:mod:`quire.security`; it takes an :class:`~quire.security.Authenticator`
and never imports :mod:`quire.auth`).  See :mod:`quire.http.server`."""

from quire.http.server import (
    HEALTH_PATH,
    METRICS_PATH,
    HttpServer,
    Route,
    json_response,
    json_route,
    principal_of,
)

__all__ = [
    "HEALTH_PATH",
    "METRICS_PATH",
    "HttpServer",
    "Route",
    "json_response",
    "json_route",
    "principal_of",
]
