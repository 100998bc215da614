"""quire.http on loopback: /metrics, /health and a caller's routes, plain and
open as before, then over TLS with Basic authentication and the cluster's
permissions (401, 403), and refusals counted."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from quire.auth import UserAuthenticator, UserDatabase
from quire.errors import ConfigError, MetadataError
from quire.http import HttpServer, Route, json_response, json_route, principal_of
from quire.metadata import open_store
from quire.security import (
    Acl,
    Permission,
    Principal,
    ServerTls,
    basic_authorization,
    client_context,
)
from quire.security.certificates import issue_certificate, make_ca
from quire.testing.auth import StaticAuthenticator


def registry_with_a_counter() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("quire_test_things", "Things", registry=registry).inc(3)
    return registry


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


async def call(url: str, method: str = "GET", *, authorization: str | None = None,
               context: ssl.SSLContext | None = None) -> Answer:
    headers = {"Authorization": authorization} if authorization else {}
    async with aiohttp.ClientSession() as session, session.request(
            method, url, headers=headers, ssl=context if context is not None else False,
            timeout=aiohttp.ClientTimeout(total=30)) as response:
        text = await response.text()
        body: Any = text
        if response.content_type == "application/json":
            body = await response.json()
        return Answer(response.status, body, dict(response.headers))


async def test_plain_and_open_as_before() -> None:
    registry = registry_with_a_counter()
    calls: list[str] = []

    async def gc() -> dict[str, Any]:
        calls.append("gc")
        if len(calls) > 1:
            raise RuntimeError("disk on fire")
        return {"done": True}

    async def echo(request: Any) -> Any:
        return json_response(200, {"method": request.method})

    server = HttpServer(registry, [json_route("POST", "/admin/gc", gc),
                                   Route("GET", "/echo", echo)])
    port = await server.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        assert server.scheme == "http"
        metrics = await call(f"{base}/metrics")
        assert metrics.status == 200 and "quire_test_things_total 3.0" in metrics.body
        assert metrics.headers["Content-Type"].startswith("text/plain")
        assert (await call(f"{base}/metrics", "HEAD")).status == 200
        assert (await call(f"{base}/health")).body == {"status": "ok"}
        assert (await call(f"{base}/echo")).body == {"method": "GET"}
        assert (await call(f"{base}/admin/gc", "POST")).body == {"done": True}
        failed = await call(f"{base}/admin/gc", "POST")
        assert failed.status == 500 and failed.body == {"error": "RuntimeError: disk on fire"}
        wrong_method = await call(f"{base}/admin/gc")
        assert wrong_method.status == 405 and "error" in wrong_method.body
        assert wrong_method.headers["Allow"] == "POST"
        missing = await call(f"{base}/nothing")
        assert missing.status == 404 and missing.body == {"error": "Not Found"}
        text = (await call(f"{base}/metrics")).body
        assert 'quire_http_refusals_total{reason="not_found"} 1.0' in text
        assert 'quire_http_refusals_total{reason="method_not_allowed"} 1.0' in text
        with pytest.raises(ConfigError, match="started already"):
            await server.start("127.0.0.1", 0)
    finally:
        await server.close()
        await server.close()  # idempotent


@dataclass
class Secure:
    base: str
    context: ssl.SSLContext
    server: HttpServer


READER = basic_authorization("prometheus", "scrape-pw")
ADMIN = basic_authorization("admin", "admin-pw")
SCOPED = basic_authorization("app", "app-pw")


@pytest.fixture
async def secure(tmp_path: Path) -> AsyncIterator[Secure]:
    ca = make_ca(tmp_path)
    cert = issue_certificate(ca, tmp_path, "server", ip_addresses=("127.0.0.1",))
    store = await open_store("memory://")
    users = UserDatabase(store)
    await users.add("prometheus", "scrape-pw", Acl.parse("prn::/,READ"))
    await users.add("admin", "admin-pw", Acl.parse("prn::*,READ_UPDATE"))
    await users.add("app", "app-pw", Acl.parse("prn::/scope:S,READ_UPDATE;prn::/scope:S/*,READ"))

    async def gc() -> dict[str, Any]:
        return {"done": True}

    async def whoami(request: Any) -> Any:
        principal = principal_of(request)
        return json_response(200, {"name": principal.name if principal else None})

    server = HttpServer(registry_with_a_counter(), [json_route("POST", "/admin/gc", gc),
                                                    Route("GET", "/whoami", whoami)],
                        tls=ServerTls(cert.cert_file, cert.key_file),
                        authenticator=UserAuthenticator(users))
    port = await server.start("127.0.0.1", 0)
    try:
        yield Secure(f"https://127.0.0.1:{port}", client_context(ca.cert_file), server)
    finally:
        await server.close()
        await store.close()


async def test_tls_and_basic_auth_with_the_cluster_as_resource(secure: Secure) -> None:
    base, context = secure.base, secure.context
    assert secure.server.scheme == "https"
    anonymous = await call(f"{base}/metrics", context=context)
    assert anonymous.status == 401 and "no credentials" in anonymous.body["error"]
    assert anonymous.headers["WWW-Authenticate"].startswith('Basic realm="quire"')
    wrong = await call(f"{base}/metrics", authorization=basic_authorization(
        "prometheus", "nope"), context=context)
    unknown = await call(f"{base}/metrics", authorization=basic_authorization(
        "nobody", "scrape-pw"), context=context)
    assert wrong.status == unknown.status == 401 and wrong.body == unknown.body
    assert (await call(f"{base}/nothing", context=context)).status == 401  # no route hints
    scraped = await call(f"{base}/metrics", authorization=READER, context=context)
    assert scraped.status == 200 and "quire_test_things_total 3.0" in scraped.body
    refused = await call(f"{base}/admin/gc", "POST", authorization=READER, context=context)
    assert refused.status == 403
    assert refused.body == {"error": "prometheus may not READ_UPDATE prn::/"}
    assert (await call(f"{base}/admin/gc", "POST", authorization=ADMIN,
                       context=context)).body == {"done": True}
    scoped = await call(f"{base}/metrics", authorization=SCOPED, context=context)
    assert scoped.status == 403  # rights in a scope are none on the cluster
    assert (await call(f"{base}/health", context=context)).body == {"status": "ok"}
    assert (await call(f"{base}/whoami", authorization=ADMIN, context=context)).body == {
        "name": "admin"}
    text = (await call(f"{base}/metrics", authorization=ADMIN, context=context)).body
    assert 'quire_http_refusals_total{reason="unauthenticated"} 4.0' in text
    assert 'quire_http_refusals_total{reason="forbidden"} 2.0' in text


async def test_plaintext_on_the_tls_port_closes_that_connection_only(secure: Secure) -> None:
    host, port = secure.base.removeprefix("https://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, no answer
    writer.close()
    plain = await asyncio.open_connection(host, int(port))
    plain[1].write(b"\x00" * 64 + b"garbage\r\n\r\n")
    await plain[1].drain()
    assert await asyncio.wait_for(plain[0].read(), 10) == b""
    plain[1].close()
    assert (await call(f"{secure.base}/health", context=secure.context)).status == 200


async def test_a_route_may_ask_another_permission_and_an_unreachable_database_is_503(
        ) -> None:
    async def ping() -> dict[str, Any]:
        return {"pong": True}

    reader = Principal("reader", Acl.parse("prn::/,READ"))
    authenticator = StaticAuthenticator({"Basic reader": reader})
    server = HttpServer(CollectorRegistry(), [
        json_route("POST", "/ping", ping, permission=Permission.READ),
        json_route("GET", "/secret", ping, permission=Permission.READ_UPDATE)],
        authenticator=authenticator)
    base = f"http://127.0.0.1:{await server.start('127.0.0.1', 0)}"
    try:
        assert (await call(f"{base}/ping", "POST", authorization="Basic reader")).body == {
            "pong": True}
        assert (await call(f"{base}/secret", authorization="Basic reader")).status == 403
        authenticator.failure = MetadataError("store unreachable")
        down = await call(f"{base}/metrics", authorization="Basic reader")
        assert down.status == 503 and "store unreachable" in down.body["error"]
        assert (await call(f"{base}/health")).status == 200  # never asks
        assert authenticator.calls == 3
    finally:
        await server.close()


async def test_ready_public_routes_request_errors_and_json_bodies() -> None:
    """``/ready`` answers what the process says (503 with the reason until
    it is ready) and, like ``/health``, is never authenticated; a public
    route needs no credentials; HttpRequestError and a bad JSON body answer
    their status and message, counted."""
    from quire.errors import HttpRequestError
    from quire.http import read_json

    state = {"ready": False}
    operator = Principal("operator", Acl.parse("prn::/,READ_UPDATE"))

    async def echo(request: Any) -> Any:
        body = await read_json(request)
        if body.get("missing"):
            raise HttpRequestError(404, "no such thing")
        return json_response(200, body)

    async def page(_request: Any) -> Any:
        return json_response(200, {"page": True})

    server = HttpServer(CollectorRegistry(), [
        Route("POST", "/echo/{name}", echo), Route("GET", "/page", page, public=True)],
        authenticator=StaticAuthenticator({"Basic op": operator}),
        ready=lambda: (state["ready"], "containers are opening"))
    port = await server.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        answer = await call(f"{base}/ready")
        assert (answer.status, answer.body) == (
            503, {"status": "not ready", "reason": "containers are opening"})
        state["ready"] = True
        assert (await call(f"{base}/ready")).body == {"status": "ready"}
        assert (await call(f"{base}/page")).body == {"page": True}
        assert (await call(f"{base}/echo/x", "POST")).status == 401
        async with aiohttp.ClientSession() as session:
            for data, status, error in [(b"{nope", 400, "the body is not JSON"),
                                        (b"[1]", 400, "the body must be a JSON object"),
                                        (b'{"missing": 1}', 404, "no such thing")]:
                async with session.post(f"{base}/echo/x", data=data,
                                        headers={"Authorization": "Basic op"}) as response:
                    assert response.status == status
                    assert error in (await response.json())["error"]
            async with session.post(f"{base}/echo/x", data=b'{"a": 1}',
                                    headers={"Authorization": "Basic op"}) as response:
                assert await response.json() == {"a": 1}
        metrics = (await call(f"{base}/metrics", authorization="Basic op")).body
        assert 'quire_http_refusals_total{reason="bad_request"} 2.0' in metrics
    finally:
        await server.close()


async def test_a_session_cookie_stands_for_credentials_and_a_change_needs_its_csrf_token(
        ) -> None:
    from quire.http import COOKIE_NAME, CSRF_HEADER, QUIET_HEADER, SessionStore

    operator = Principal("operator", Acl.parse("prn::/,READ_UPDATE"))
    sessions = SessionStore()
    session = sessions.create(operator)

    async def who(request: Any) -> Any:
        principal = principal_of(request)
        return json_response(200, {"name": principal.name if principal else None})

    server = HttpServer(CollectorRegistry(), [Route("GET", "/who", who),
                                              Route("POST", "/change", who)],
                        authenticator=StaticAuthenticator({}), sessions=sessions)
    port = await server.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(cookies={COOKIE_NAME: session.id}) as browser:
            async with browser.get(f"{base}/who") as response:
                assert await response.json() == {"name": "operator"}
            async with browser.post(f"{base}/change") as response:
                assert response.status == 403
                assert CSRF_HEADER in (await response.json())["error"]
            async with browser.post(f"{base}/change",
                                    headers={CSRF_HEADER: "a guess"}) as response:
                assert response.status == 403
            async with browser.post(f"{base}/change",
                                    headers={CSRF_HEADER: session.csrf_token}) as response:
                assert await response.json() == {"name": "operator"}
        async with aiohttp.ClientSession(cookies={COOKIE_NAME: "forged"}) as stranger, \
                stranger.get(f"{base}/who", headers={QUIET_HEADER: "1"}) as response:
            assert response.status == 401  # the page's own request: no browser dialog
            assert "WWW-Authenticate" not in response.headers
        sessions.delete(session.id)
        answer = await call(f"{base}/who")
        assert answer.status == 401 and "WWW-Authenticate" in answer.headers
    finally:
        await server.close()


def test_sessions_end_when_idle_or_old_and_the_oldest_go_first() -> None:
    from quire.http import SessionStore

    now = [0.0]
    store = SessionStore(idle_timeout_s=10, max_age_s=25, max_sessions=2,
                         clock=lambda: now[0])
    alice = Principal("alice", Acl.parse(""))
    first = store.create(alice)
    now[0] = 9
    assert store.get(first.id) is first
    now[0] = 18
    assert store.get(first.id) is first  # used at 9: not idle for 10 s yet
    now[0] = 26
    assert store.get(first.id) is None  # 26 s after the login
    a, b, c = store.create(alice), store.create(alice), store.create(alice)
    assert store.get(a.id) is None and store.get(b.id) is b and store.get(c.id) is c
    now[0] = 40
    assert store.get(b.id) is None and len(store) == 1
