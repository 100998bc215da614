"""The controller's gRPC gate: a cap on calls in flight, authentication, authorization.

:class:`ControllerInterceptor` wraps every served RPC (a grpc.aio server
interceptor) and, in this order:

1. refuses a call while ``max_concurrent_rpcs`` are in flight, with
   RESOURCE_EXHAUSTED (gRPC has no connection cap; grpcio's idle and age
   options, :class:`ControllerRpcConfig`, bound how long connections
   live);
2. with an authenticator, reads the ``authorization`` metadata (Basic
   against the user database, Bearer for a token Quire issued) and
   checks the RPC's rule (:mod:`quire.controller.access`);
3. serves it with the caller in :data:`~quire.controller.access.CURRENT_PRINCIPAL`,
   and filters listings to what the caller may READ.

Refusals, each counted on ``/metrics``
(``quire_controller_refusals_total{reason}``):

* missing or wrong credentials: **PERMISSION_DENIED**, not
  UNAUTHENTICATED.  Decision: the official Rust client retries an
  UNAUTHENTICATED answer for about 61 s (11 attempts; Java Pravega answers
  bad credentials that way) and fails a PERMISSION_DENIED one at once, with
  the message; a wrong password must fail fast and say why
  (``../shared/notes/pravega-client-tls-auth.md``).  The message says
  "authentication failed" so the two causes stay apart for a person;
  ``reason="unauthenticated"`` on ``/metrics``.
* a caller without the permission: PERMISSION_DENIED naming the resource
  (``reason="forbidden"``);
* too many calls in flight: RESOURCE_EXHAUSTED (``reason="too_many_calls"``);
* the user database unreachable: UNAVAILABLE (the client retries).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter

from quire.controller import access
from quire.errors import (
    AuthenticationError,
    ConfigError,
    MetadataError,
    PermissionDeniedError,
    SecurityError,
)
from quire.security import Authenticator, Principal

log = logging.getLogger("quire.controller")

REFUSAL_REASONS = ("unauthenticated", "forbidden", "too_many_calls")


@dataclass(frozen=True)
class ControllerRpcConfig:
    """The controller's gRPC limits and its delegation tokens' life."""

    max_concurrent_rpcs: int = 1_000
    """Calls served at once; one more is refused with RESOURCE_EXHAUSTED."""
    grpc_max_connection_idle_ms: int = 600_000
    """A client connection with no call for this long is closed (GOAWAY;
    clients reconnect on their next call)."""
    grpc_max_connection_age_ms: int = 0
    """A client connection is closed after this long, whatever it does
    (0: never), after ``grpc_max_connection_age_grace_ms`` for its calls."""
    grpc_max_connection_age_grace_ms: int = 30_000
    delegation_token_ttl_ms: int = 600_000
    """How long a delegation token is valid; at least the longest
    transaction lease (``txn_max_lease_ms``)."""

    def __post_init__(self) -> None:
        for name in ("max_concurrent_rpcs", "grpc_max_connection_idle_ms",
                     "delegation_token_ttl_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"controller: {name} must be positive")
        if self.grpc_max_connection_age_ms < 0 or self.grpc_max_connection_age_grace_ms < 0:
            raise ConfigError("controller: grpc_max_connection_age_ms and its grace must not "
                              "be negative")

    def server_options(self) -> list[tuple[str, int]]:
        """grpcio's server options for these limits."""
        options = [("grpc.max_connection_idle_ms", self.grpc_max_connection_idle_ms)]
        if self.grpc_max_connection_age_ms:
            options += [("grpc.max_connection_age_ms", self.grpc_max_connection_age_ms),
                        ("grpc.max_connection_age_grace_ms",
                         self.grpc_max_connection_age_grace_ms)]
        return options


def _metadata_value(metadata: Any, key: str) -> str | None:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k == key:
            return v if isinstance(v, str) else bytes(v).decode("latin-1")
    return None


Behaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class ControllerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See the module docstring; ``authenticator`` None: no authentication."""

    def __init__(self, authenticator: Authenticator | None, max_concurrent_rpcs: int,
                 registry: CollectorRegistry) -> None:
        self.authenticator = authenticator
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.in_flight = 0
        self.refusals = Counter("quire_controller_refusals",
                                "Controller calls refused, by reason", ["reason"],
                                registry=registry)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason)
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        wrapped = self._wrapped.get(details.method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = details.method.rsplit("/", 1)[-1]
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._gate(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
        self._wrapped[details.method] = wrapped
        return wrapped

    def _gate(self, method: str, serve: Behaviour) -> Behaviour:
        async def gated(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self.in_flight >= self.max_concurrent_rpcs:
                self.refusals.labels("too_many_calls").inc()
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"the controller serves {self.max_concurrent_rpcs} calls "
                                    "at once; try again")
            self.in_flight += 1
            try:
                if self.authenticator is None:
                    return await serve(request, context)
                principal = await self._authorize(method, request, context)
                reset = access.CURRENT_PRINCIPAL.set(principal)
                try:
                    answer = await serve(request, context)
                finally:
                    access.CURRENT_PRINCIPAL.reset(reset)
                return access.filter_answer(method, answer, principal)
            finally:
                self.in_flight -= 1
        return gated

    async def _authorize(self, method: str, request: Any,
                         context: grpc.aio.ServicerContext) -> Principal:
        assert self.authenticator is not None
        header = _metadata_value(context.invocation_metadata(), "authorization")
        try:
            principal = await self.authenticator.authenticate(header)
        except AuthenticationError as e:
            self.refusals.labels("unauthenticated").inc()
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"authentication failed: {e}")
            raise AssertionError("unreachable") from None
        except (MetadataError, SecurityError) as e:  # the user database unreachable
            log.warning("controller: cannot check credentials: %s", e)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot check credentials: {e}")
            raise AssertionError("unreachable") from None
        try:
            access.check(method, request, principal)
        except PermissionDeniedError as e:
            self.refusals.labels("forbidden").inc()
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))
        return principal
