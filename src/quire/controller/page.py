"""The live cluster page at ``/ui/`` on the controller's HTTP port.

Routes (beside the REST API and ``/metrics``):

* ``GET /ui/``, ``GET /ui/static/{name}``: the page and its files (public:
  bundled in the package, ``quire/controller/ui/``; nothing is fetched
  from elsewhere);
* ``POST /ui/login`` (public): ``{"username", "password"}`` checked as
  Basic would be; sets the session cookie (``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` under TLS) and answers the CSRF token
  every change must carry (:mod:`quire.http.sessions`);
* ``GET /ui/api/session``: who is logged in, the CSRF token, whether the
  server authenticates at all;
* ``POST /ui/logout``;
* ``GET /ui/api/cluster``: :meth:`ClusterView.snapshot`, which the page
  polls every second.

The page's one change (sealing a stream) goes through the REST API with
the CSRF token.  Without authentication on the server the page is open.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from quire.controller.cluster_view import ClusterView
from quire.errors import AuthenticationError, HttpRequestError
from quire.http import (
    COOKIE_NAME,
    Route,
    SessionStore,
    json_response,
    principal_of,
    read_json,
)
from quire.security import Authenticator, basic_authorization

if TYPE_CHECKING:
    from aiohttp import web

STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}


def _static(name: str) -> bytes:
    return resources.files("quire.controller").joinpath("ui", name).read_bytes()


class ClusterPage:
    """The page's routes over a :class:`ClusterView`; ``authenticator`` and
    ``sessions`` as the HTTP server's (None: open)."""

    def __init__(self, view: ClusterView, authenticator: Authenticator | None,
                 sessions: SessionStore | None, secure_cookie: bool) -> None:
        self.view = view
        self.authenticator = authenticator
        self.sessions = sessions
        self.secure_cookie = secure_cookie

    def routes(self) -> list[Route]:
        return [Route("GET", "/ui", self._to_page, public=True),
                Route("GET", "/ui/", self._page, public=True),
                Route("GET", "/ui/static/{name}", self._file, public=True),
                Route("POST", "/ui/login", self._login, public=True),
                Route("POST", "/ui/logout", self._logout),
                Route("GET", "/ui/api/session", self._session),
                Route("GET", "/ui/api/cluster", self._cluster)]

    async def _to_page(self, _request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        raise web.HTTPFound("/ui/")

    async def _page(self, _request: web.Request) -> web.StreamResponse:
        return self._answer("index.html")

    async def _file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC or name == "index.html":
            raise HttpRequestError(404, f"no file {name}")
        return self._answer(name)

    @staticmethod
    def _answer(name: str) -> web.StreamResponse:
        from aiohttp import web

        return web.Response(body=_static(name), content_type=STATIC[name], headers={
            "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "style-src 'self'; script-src 'self'"})

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if self.authenticator is None or self.sessions is None:
            return json_response(200, {"user": None, "auth": False, "csrfToken": None})
        body = await read_json(request)
        username, password = body.get("username"), body.get("password")
        if not isinstance(username, str) or not isinstance(password, str):
            raise HttpRequestError(400, "username and password (strings) are required")
        try:
            principal = await self.authenticator.authenticate(
                basic_authorization(username, password))
        except AuthenticationError as e:
            return json_response(401, {"error": str(e)})
        session = self.sessions.create(principal)
        answer = json_response(200, {"user": principal.name, "auth": True,
                                     "csrfToken": session.csrf_token})
        answer.set_cookie(COOKIE_NAME, session.id, path="/", httponly=True,
                          secure=self.secure_cookie, samesite="Strict")
        return answer

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        if self.sessions is not None:
            self.sessions.delete(request.cookies.get(COOKIE_NAME))
        answer = json_response(200, {"user": None})
        answer.del_cookie(COOKIE_NAME, path="/")
        return answer

    async def _session(self, request: web.Request) -> web.StreamResponse:
        principal = principal_of(request)
        session = self.sessions.get(request.cookies.get(COOKIE_NAME)) \
            if self.sessions is not None else None
        body: dict[str, Any] = {"auth": self.authenticator is not None,
                                "user": principal.name if principal else None,
                                "csrfToken": session.csrf_token if session else None}
        return json_response(200, body)

    async def _cluster(self, _request: web.Request) -> web.StreamResponse:
        return json_response(200, self.view.snapshot())
