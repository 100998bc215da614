"""The controller's gRPC security over a real TLS port and Quire's own client:
authentication answering PERMISSION_DENIED, per-RPC rules in Pravega's
resources, listings filtered, delegation tokens of the permission held, the
cap on calls in flight; and the client side's token handling."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from quire.auth import ServerSecurity
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.controller.access import TokenIssuer
from quire.controller.interceptor import ControllerInterceptor, ControllerRpcConfig
from quire.errors import ConfigError, PermissionDeniedError
from quire.metadata import open_store
from quire.pravega_wire import AuthTokenCheckFailed, KeepAlive, WireCommand
from quire.security import (
    Acl,
    Credentials,
    Permission,
    Principal,
    ServerTls,
    TokenSigner,
    basic_authorization,
)
from quire.security.certificates import issue_certificate, make_ca
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.streams import ControllerClient, ControllerTokens, InternalTokens, RemoteSegmentStore
from quire.streams.tokens import token_expiry
from quire.testing.auth import StaticAuthenticator
from quire.testing.memory_data_log import MemoryDataLogs

SECRET = b"0123456789abcdef0123456789abcdef"
ADMIN = Credentials("admin", "pw-admin")
ALICE = Credentials("alice", "pw-alice")
ALICE_ACL = Acl.parse("prn::/scope:sc,READ_UPDATE;prn::/scope:sc/stream:mine,READ_UPDATE;"
                      "prn::/scope:sc/*,READ")


@dataclass
class Served:
    controller: Controller
    uri: str
    ca: Path

    def client(self, credentials: Credentials | None) -> ControllerClient:
        return ControllerClient(self.uri, 5_000, tls_ca=self.ca, credentials=credentials)

    def refusals(self, reason: str) -> float:
        return self.controller.core.metrics.registry.get_sample_value(
            "quire_controller_refusals_total", {"reason": reason}) or 0.0


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ca = make_ca(tmp_path)
    leaf = issue_certificate(ca, tmp_path, "controller")
    logs = MemoryDataLogs()
    metadata = await open_store("memory://controller-security")
    store = await SegmentStore.open(None, range(2), metadata_store=metadata,
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=2))
    authenticator = StaticAuthenticator({
        basic_authorization(ADMIN.username, ADMIN.password):
            Principal("admin", Acl.of({"prn::*": Permission.READ_UPDATE})),
        basic_authorization(ALICE.username, ALICE.password): Principal("alice", ALICE_ACL)})
    controller = Controller(store, ControllerConfig(), fixed_locator(("localhost", 1)),
                            security=ServerSecurity(ServerTls(leaf.cert_file, leaf.key_file),
                                                    authenticator),
                            tokens=TokenSigner(SECRET))
    port = await controller.start("127.0.0.1", 0)
    yield Served(controller, f"tls://localhost:{port}", ca.cert_file)
    await controller.close()
    await store.close()


async def test_missing_or_wrong_credentials_are_permission_denied(served: Served) -> None:
    for credentials in (None, Credentials("admin", "wrong"), Credentials("nobody", "x")):
        client = served.client(credentials)
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError, match="PERMISSION_DENIED: authentication "
                                                        "failed"):
            await client.create_scope("sc")
        assert time.monotonic() - started < 2.0
        await client.close()
    assert served.refusals("unauthenticated") == 3


async def test_each_rpc_needs_its_permission_and_listings_are_filtered(served: Served) -> None:
    admin, alice = served.client(ADMIN), served.client(ALICE)
    try:
        for scope in ("sc", "other"):
            assert await admin.create_scope(scope)
        await admin.create_stream("other", "x", 1)
        with pytest.raises(PermissionDeniedError, match=r"alice may not READ_UPDATE prn::/$"):
            await alice.create_scope("mine")
        assert await alice.create_stream("sc", "mine", 1)  # READ_UPDATE on the scope
        assert await admin.create_stream("sc", "theirs", 1)
        with pytest.raises(PermissionDeniedError,
                           match="may not READ_UPDATE prn::/scope:sc/stream:theirs"):
            await alice.seal_stream("sc", "theirs")  # READ only there
        assert len(await alice.current_segments("sc", "theirs")) == 1
        with pytest.raises(PermissionDeniedError):
            await alice.stream_config("other", "x")
        await alice.seal_stream("sc", "mine")
        assert await alice.list_scopes() == ["sc"]
        assert sorted(await alice.list_streams("sc")) == ["mine", "theirs"]
        assert await admin.list_scopes() == ["other", "sc"]
        assert served.refusals("forbidden") == 3
    finally:
        await admin.close()
        await alice.close()


async def test_a_delegation_token_carries_the_permission_held(served: Served) -> None:
    admin, alice = served.client(ADMIN), served.client(ALICE)
    try:
        await admin.create_scope("sc")
        for stream in ("mine", "theirs"):
            await admin.create_stream("sc", stream, 1)
        before = int(time.time())
        for stream, held in (("mine", "READ_UPDATE"), ("theirs", "READ")):
            token = await alice.delegation_token("sc", stream)
            _, body, _ = token.split(".")
            claims = json.loads(base64.b64decode(body))  # standard base64, as the client needs
            assert claims["acl"] == f"prn::/scope:sc/stream:{stream},{held}"
            assert claims["exp"] - before >= ControllerConfig().txn_max_lease_ms // 1000
            principal = TokenSigner(SECRET).verify(token).principal()
            assert principal.name == "alice"
        group = await alice.delegation_token("sc", "g_kvtable")  # a reader group's state
        assert "prn::/scope:sc/reader-group:g,READ" in base64.b64decode(
            group.split(".")[1]).decode()
    finally:
        await admin.close()
        await alice.close()


def test_tokens_outlive_the_longest_transaction_lease() -> None:
    with pytest.raises(ConfigError, match="at least the longest transaction lease"):
        TokenIssuer(TokenSigner(SECRET), 60_000, 120_000)
    assert ControllerRpcConfig(grpc_max_connection_age_ms=5_000).server_options() == [
        ("grpc.max_connection_idle_ms", 600_000), ("grpc.max_connection_age_ms", 5_000),
        ("grpc.max_connection_age_grace_ms", 30_000)]


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)


async def test_calls_over_the_cap_are_refused_while_others_are_in_flight() -> None:
    interceptor = ControllerInterceptor(None, 2, CollectorRegistry())
    release = asyncio.Event()

    async def slow(_request: Any, _context: Any) -> str:
        await release.wait()
        return "done"

    async def continuation(_details: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(slow)

    details: Any = type("Details", (), {"method": "/svc/checkScopeExists",
                                        "invocation_metadata": ()})()
    handler = await interceptor.intercept_service(continuation, details)
    calls = [asyncio.ensure_future(handler.unary_unary(None, _Context())) for _ in range(2)]
    await asyncio.sleep(0)  # the two calls are in flight
    refused = _Context()
    with pytest.raises(_Aborted):
        await handler.unary_unary(None, refused)
    assert refused.aborted is not None and \
        refused.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    assert await asyncio.gather(*calls) == ["done", "done"]
    assert interceptor.in_flight == 0
    assert interceptor.refusals.labels("too_many_calls")._value.get() == 1


# --- the client side ---------------------------------------------------------------------


def test_a_tokens_expiry_is_read_from_its_body() -> None:
    token = TokenSigner(SECRET, clock=lambda: 1000.0).issue("alice",
                                                             {"prn::*": Permission.READ}, 60)
    assert token_expiry(token) == 1060
    assert token_expiry("") is None and token_expiry("a.!!!.c") is None


async def test_controller_tokens_are_fetched_once_per_stream_and_again_when_expired() -> None:
    now = [1000.0]
    signer = TokenSigner(SECRET, clock=lambda: now[0])
    fetched: list[tuple[str, str]] = []

    class Controller:
        async def delegation_token(self, scope: str, stream: str) -> str:
            fetched.append((scope, stream))
            await asyncio.sleep(0)
            return signer.issue("alice", {f"prn::/scope:{scope}/stream:{stream}":
                                          Permission.READ}, 60)

    tokens = ControllerTokens(Controller(), clock=lambda: now[0])  # type: ignore[arg-type]
    first, again = await asyncio.gather(tokens.token("sc/st/0.#epoch.0"),
                                        tokens.token("sc/st/1.#epoch.0#transaction.ab"))
    assert first == again and fetched == [("sc", "st")]
    await tokens.token("sc/g_kvtable/0.#epoch.0")
    assert fetched[-1] == ("sc", "g_kvtable")
    now[0] += 56  # within the refresh margin of its expiry
    assert await tokens.token("sc/st/0.#epoch.0") != first
    renewed = await tokens.token("sc/st/0.#epoch.0")
    tokens.expired("sc/st/0.#epoch.0", renewed)
    await tokens.token("sc/st/0.#epoch.0")
    assert fetched.count(("sc", "st")) == 3


async def test_an_expired_token_is_replaced_once_and_internal_tokens_renew() -> None:
    now = [1000.0]
    internal = InternalTokens(TokenSigner(SECRET, clock=lambda: now[0]), ttl_s=60,
                              clock=lambda: now[0])
    first = await internal.token("_system/x")
    assert await internal.token("_system/y") == first
    now[0] += 1
    internal.expired("_system/x", first)
    second = await internal.token("_system/x")
    assert second != first

    class Counting:
        def __init__(self) -> None:
            self.given = 0
            self.expired_ones: list[str] = []

        async def token(self, segment: str) -> str:
            self.given += 1
            return f"t{self.given}"

        def expired(self, segment: str, token: str) -> None:
            self.expired_ones.append(token)

    counting = Counting()
    store = RemoteSegmentStore(lambda _: asyncio.sleep(0, "a:1"), tokens=counting)  # type: ignore[arg-type, return-value]
    sent: list[str] = []

    async def send(token: str) -> WireCommand:
        sent.append(token)
        return AuthTokenCheckFailed(1, "expired", 1) if len(sent) < 3 else KeepAlive()

    reply = await store.authorized("sc/st/0.#epoch.0", send)
    assert isinstance(reply, AuthTokenCheckFailed)  # once more with a new token, no loop
    assert sent == ["t1", "t2"] and counting.expired_ones == ["t1"]
    assert await store.authorized("sc/st/0.#epoch.0", send) == KeepAlive()
