"""Who a request comes from, and how a server learns it from an ``authorization`` header.

A :class:`Principal` is a name and the ACL that applies to it; servers ask
it whether a resource allows a permission.  An :class:`Authenticator` turns
the value of an HTTP or gRPC ``authorization`` header into a principal
(``Basic`` against the user database, ``Bearer`` for a token Quire issued:
:class:`quire.auth.UserAuthenticator`), so that the HTTP server
(:mod:`quire.http`, below :mod:`quire.auth`) and the gRPC controller share
one seam.

The internal identity (:data:`quire.security.tokens.INTERNAL_SUBJECT`, the
controllers and segment stores) is the only principal that reaches internal
resources (``_system``, see :mod:`quire.security.resources`): that rule is
here, in :meth:`Principal.permission`, once.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Protocol

from quire.errors import AuthenticationError, PermissionDeniedError
from quire.security.acl import Acl, Permission
from quire.security.resources import is_internal_resource


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its ``name`` (a user, or a token's subject),
    its ACL, and whether it is the internal identity."""

    name: str
    acl: Acl
    internal: bool = False

    def permission(self, resource: str) -> Permission:
        """What this principal may do on ``resource``: READ_UPDATE on an
        internal resource for the internal identity and NONE for anyone
        else, otherwise what its ACL says."""
        if is_internal_resource(resource):
            return Permission.READ_UPDATE if self.internal else Permission.NONE
        return self.acl.permission(resource)

    def allows(self, resource: str, needed: Permission) -> bool:
        return self.permission(resource) >= needed

    def require(self, resource: str, needed: Permission) -> None:
        """PermissionDeniedError unless this principal has ``needed`` on ``resource``."""
        if not self.allows(resource, needed):
            raise PermissionDeniedError(
                f"{self.name} may not {needed.name} {resource}")


class Authenticator(Protocol):
    """Turns an ``authorization`` header into a principal.

    Contract: ``authenticate(value)`` answers the principal the header
    proves, or raises :class:`~quire.errors.AuthenticationError` (no header,
    a malformed one, an unknown scheme, wrong credentials: one message for
    an unknown user and a wrong password) or one of its
    :class:`~quire.errors.TokenError` subclasses for a refused token
    (``TokenExpiredError`` apart from ``TokenInvalidError``).  It never
    answers a principal for credentials it did not check, may cache a
    successful check for a bounded time, and never blocks the event loop
    for long (slow hashing runs on a worker thread).
    """

    async def authenticate(self, authorization: str | None) -> Principal: ...


@dataclass(frozen=True)
class BasicCredentials:
    """The user and password of a ``Basic`` header."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"BasicCredentials(username={self.username!r}, password=<hidden>)"


@dataclass(frozen=True)
class BearerToken:
    """The token of a ``Bearer`` header."""

    token: str

    def __repr__(self) -> str:
        return "BearerToken(<hidden>)"


def basic_authorization(username: str, password: str) -> str:
    """The ``authorization`` header value ``Basic base64(user:password)``."""
    if ":" in username:
        raise ValueError("a user name may not contain ':' (Basic authentication splits there)")
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def bearer_authorization(token: str) -> str:
    """The ``authorization`` header value ``Bearer <token>``."""
    return f"Bearer {token}"


def parse_authorization(value: str | None) -> BasicCredentials | BearerToken:
    """The credentials in an ``authorization`` header value (schemes are
    case-insensitive); AuthenticationError for none, an unknown scheme or
    a malformed value."""
    if not value or not value.strip():
        raise AuthenticationError("no credentials (an authorization header is needed)")
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "bearer" and rest:
        return BearerToken(rest)
    if scheme.lower() != "basic":
        raise AuthenticationError(f"unsupported authorization scheme {scheme[:20]!r} "
                                  "(Basic or Bearer)")
    try:
        decoded = base64.b64decode(rest, validate=True).decode()
    except (binascii.Error, ValueError):
        raise AuthenticationError("malformed Basic credentials") from None
    username, colon, password = decoded.partition(":")
    if not colon or not username:
        raise AuthenticationError("malformed Basic credentials")
    return BasicCredentials(username, password)
