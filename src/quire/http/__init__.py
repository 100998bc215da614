"""The one HTTP server of every Quire process (rank 2: over
:mod:`quire.security`; it takes an :class:`~quire.security.Authenticator`
and never imports :mod:`quire.auth`).  See :mod:`quire.http.server`."""

from quire.http.server import (
    HEALTH_PATH,
    METRICS_PATH,
    QUIET_HEADER,
    READY_PATH,
    HttpServer,
    Readiness,
    Route,
    json_response,
    json_route,
    principal_of,
    read_json,
)
from quire.http.sessions import COOKIE_NAME, CSRF_HEADER, Session, SessionStore

__all__ = [
    "COOKIE_NAME",
    "CSRF_HEADER",
    "HEALTH_PATH",
    "METRICS_PATH",
    "QUIET_HEADER",
    "READY_PATH",
    "HttpServer",
    "Readiness",
    "Route",
    "Session",
    "SessionStore",
    "json_response",
    "json_route",
    "principal_of",
    "read_json",
]
