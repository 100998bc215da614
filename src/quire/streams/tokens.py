"""Delegation tokens for segment-store requests: the :class:`TokenSource` seam.

A segment store with ``auth_enabled`` checks the token every request that
names a segment carries (:mod:`quire.segmentserver.auth`).  A client holds
one token per stream (the first two parts of a segment's name,
:func:`stream_key`: a stream's segments, its transaction segments and a
reader group's ``<G>_kvtable`` table are each one stream's) and asks its
:class:`TokenSource` for it before each request (``SetupAppend`` for a
writer: appends carry none).

* :data:`NO_TOKENS`: ``""`` for every segment (auth off);
* :class:`InternalTokens`: the internal identity's token, minted from the
  cluster secret (controllers and segment stores; see
  :mod:`quire.security.tokens`);
* :class:`~quire.streams.credentials.ControllerTokens`: tokens from the
  controller's ``getDelegationToken`` (users).

A token is used until ``REFRESH_MARGIN_S`` before its ``exp`` (read from
its body, as the Pravega client does), or until the store answers
``AuthTokenCheckFailed`` with code 1 (TOKEN_EXPIRED): the caller then says
:meth:`TokenSource.expired` and asks again once.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Protocol

from quire.security import TokenSigner

REFRESH_MARGIN_S = 5
"""A token this close to its expiry is fetched again (the client's margin)."""
TOKEN_EXPIRED_CODE = 1
"""``AuthTokenCheckFailed.error_code`` of an expired token."""


def stream_key(segment: str) -> tuple[str, str]:
    """``(scope, stream)`` whose token a request on ``segment`` carries."""
    scope, _, rest = segment.partition("/")
    return scope, rest.partition("/")[0]


def token_expiry(token: str) -> float | None:
    """The ``exp`` (Unix seconds) in a token's body, None if it has none
    (``""``: a token that never expires) or does not parse."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        body = json.loads(base64.b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        exp = body["exp"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        return None
    return float(exp) if isinstance(exp, int | float) else None


class TokenSource(Protocol):
    """Tokens for segment-store requests.

    Contract: ``await token(segment)`` answers the token to send with a
    request on ``segment`` (``""`` when none is needed), reusing one while
    it is valid for more than :data:`REFRESH_MARGIN_S`; ``expired(segment,
    token)`` says the store refused ``token`` as expired, so the next
    ``token(segment)`` fetches a new one.  Failures to get a token raise
    the source's own errors (a controller's PermissionDeniedError, say).
    """

    async def token(self, segment: str) -> str: ...

    def expired(self, segment: str, token: str) -> None: ...


class NoTokens:
    """``""`` for every segment: a cluster without auth."""

    async def token(self, segment: str) -> str:
        return ""

    def expired(self, segment: str, token: str) -> None:
        pass


NO_TOKENS = NoTokens()


class InternalTokens:
    """The internal identity's token (every resource, ``_system`` too),
    minted from the cluster secret for ``ttl_s`` and minted again before
    it expires.  ``clock`` gives Unix seconds."""

    def __init__(self, signer: TokenSigner, ttl_s: int = 3600,
                 clock: Callable[[], float] = time.time) -> None:
        self._signer = signer
        self._ttl_s = ttl_s
        self._clock = clock
        self._token = ""
        self._expires_at = 0.0

    async def token(self, segment: str) -> str:
        if self._clock() + REFRESH_MARGIN_S >= self._expires_at:
            self._token = self._signer.internal_token(self._ttl_s)
            self._expires_at = token_expiry(self._token) or 0.0
        return self._token

    def expired(self, segment: str, token: str) -> None:
        if token == self._token:
            self._expires_at = 0.0
