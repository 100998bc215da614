"""Who may call what on the controller: Pravega's resources per RPC, and delegation tokens.

Each served RPC needs one permission on one resource of
:mod:`quire.security.resources`, taken from its request (:data:`RULES`),
as Pravega's controller checks them (``ControllerServiceImpl``):

=========================================================  ===============================
RPC                                                        needs
=========================================================  ===============================
createScope                                                READ_UPDATE on ``prn::/``
deleteScope                                                READ_UPDATE on the scope
checkScopeExists, listStreamsInScope                       READ on the scope
createStream                                               READ_UPDATE on the scope
checkStreamExists, getStreamConfiguration, getURI,         READ on the stream
getCurrentSegments, getEpochSegments, getSegments,
getSegmentsImmediatelyFollowing, checkScale,
checkTransactionState, getDelegationToken
updateStream, sealStream, truncateStream, deleteStream,    READ_UPDATE on the stream
scale, createTransaction, pingTransaction,
commitTransaction, abortTransaction
listScopes                                                 nothing (the answer lists only
                                                           the scopes the caller may READ)
=========================================================  ===============================

"The stream" is :func:`~quire.security.stream_info_resource` of the
request's ``StreamInfo``: a reader group's state stream (``<G>_kvtable``)
is the reader group's, so a reader with READ on a stream and READ_UPDATE
on its reader group can read; a scope starting with ``_`` is internal
(no user reaches it).  ``listStreamsInScope`` answers only the streams the
caller may READ.

``getDelegationToken`` answers a token (:class:`~quire.security.TokenSigner`)
granting the stream's resource with the permission the caller **holds**
there (READ or READ_UPDATE, whatever the request's ``accessOperation``
asks: the official client asks UNSPECIFIED), valid ``token_ttl_ms``: at
least the longest transaction lease, so a token fetched when a
transaction opens outlives it.  The caller's principal reaches the
service through :data:`CURRENT_PRINCIPAL`, set by the interceptor for the
call's task.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any

from quire.controller_api import Controller_pb2 as pb
from quire.errors import ConfigError, PermissionDeniedError
from quire.security import (
    CLUSTER_RESOURCE,
    Acl,
    Permission,
    Principal,
    TokenSigner,
    scope_resource,
    stream_info_resource,
)

CURRENT_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "quire_controller_principal", default=None)
"""The authenticated caller of the RPC being served (None: auth is off)."""

Resource = Callable[[Any], str]


def _scope_of(request: Any) -> str:
    return scope_resource(request.scope or "_")


def _stream(info: Any) -> str:
    return stream_info_resource(info.scope, info.stream)


def _stream_of(request: Any) -> str:
    return _stream(request)


def _nested_stream_of(request: Any) -> str:
    return _stream(request.streamInfo)


def _cluster(_request: Any) -> str:
    return CLUSTER_RESOURCE


_READ, _UPDATE = Permission.READ, Permission.READ_UPDATE
RULES: Mapping[str, tuple[Resource, Permission] | None] = {
    "createScope": (_cluster, _UPDATE),
    "deleteScope": (_scope_of, _UPDATE),
    "checkScopeExists": (_scope_of, _READ),
    "listScopes": None,
    "listStreamsInScope": (lambda r: _scope_of(r.scope), _READ),
    "createStream": (lambda r: scope_resource(r.streamInfo.scope or "_"), _UPDATE),
    "checkStreamExists": (_stream_of, _READ),
    "getStreamConfiguration": (_stream_of, _READ),
    "updateStream": (_nested_stream_of, _UPDATE),
    "sealStream": (_stream_of, _UPDATE),
    "truncateStream": (_nested_stream_of, _UPDATE),
    "deleteStream": (_stream_of, _UPDATE),
    "getCurrentSegments": (_stream_of, _READ),
    "getEpochSegments": (_nested_stream_of, _READ),
    "getSegments": (_nested_stream_of, _READ),
    "getSegmentsImmediatelyFollowing": (_nested_stream_of, _READ),
    "getURI": (_nested_stream_of, _READ),
    "getDelegationToken": (_stream_of, _READ),
    "scale": (_nested_stream_of, _UPDATE),
    "checkScale": (_nested_stream_of, _READ),
    "createTransaction": (_nested_stream_of, _UPDATE),
    "pingTransaction": (_nested_stream_of, _UPDATE),
    "commitTransaction": (_nested_stream_of, _UPDATE),
    "abortTransaction": (_nested_stream_of, _UPDATE),
    "checkTransactionState": (_nested_stream_of, _READ),
}
"""Each served RPC: the resource its request names and the permission it
needs (None: any authenticated caller; the answer is filtered)."""


def check(method: str, request: Any, principal: Principal) -> None:
    """PermissionDeniedError unless ``principal`` may call ``method`` with
    ``request``; an RPC missing from :data:`RULES` is refused to all but
    the internal identity (a new RPC is closed until it has a rule)."""
    if method not in RULES:
        if not principal.internal:
            raise PermissionDeniedError(f"{method} has no access rule: refused")
        return
    rule = RULES[method]
    if rule is not None:
        resource, needed = rule
        principal.require(resource(request), needed)


def filter_answer(method: str, answer: Any, principal: Principal) -> Any:
    """``answer`` with what ``principal`` may not READ left out (listings)."""
    if method == "listScopes":
        kept = [s for s in answer.scopes if principal.allows(scope_resource(s), _READ)]
        del answer.scopes[:]
        answer.scopes.extend(kept)
    elif method == "listStreamsInScope":
        kept = [s for s in answer.streams if principal.allows(_stream(s), _READ)]
        del answer.streams[:]
        answer.streams.extend(kept)
    return answer


class TokenIssuer:
    """Issues the delegation tokens ``getDelegationToken`` answers (module
    docstring); ConfigError if ``ttl_ms`` is shorter than the longest
    transaction lease."""

    def __init__(self, signer: TokenSigner, ttl_ms: int, longest_lease_ms: int) -> None:
        if ttl_ms < longest_lease_ms:
            raise ConfigError(f"delegation_token_ttl_ms ({ttl_ms}) must be at least the "
                              f"longest transaction lease ({longest_lease_ms} ms)")
        self.signer = signer
        self.ttl_s = max(1, -(-ttl_ms // 1000))

    def issue(self, info: pb.StreamInfo) -> str:
        """A token of the current caller for the stream of ``info`` ("" when
        auth is off: no caller)."""
        principal = CURRENT_PRINCIPAL.get()
        if principal is None:
            return ""
        if principal.internal:
            return self.signer.internal_token(self.ttl_s)
        resource = _stream(info)
        held = principal.permission(resource)
        return self.signer.issue(principal.name, Acl.of({resource: held}), self.ttl_s)
