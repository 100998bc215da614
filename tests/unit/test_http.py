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
