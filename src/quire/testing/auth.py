"""An in-memory twin of the :class:`~quire.security.Authenticator` seam.

:class:`StaticAuthenticator` knows a fixed set of principals by their
``authorization`` header value: no user database, no scrypt, so a test of
what sits on the seam (the HTTP server, the controller's gRPC checks) runs
in microseconds.  The contract is the seam's: an unknown or missing header
is an :class:`~quire.errors.AuthenticationError`, and ``failure`` (if set)
is raised instead of any answer (a user database that cannot be reached).
"""

from __future__ import annotations

from collections.abc import Mapping

from quire.errors import AuthenticationError
from quire.security import Principal


class StaticAuthenticator:
    def __init__(self, principals: Mapping[str, Principal]) -> None:
        self.principals = dict(principals)
        self.failure: Exception | None = None
        self.calls = 0

    async def authenticate(self, authorization: str | None) -> Principal:
        self.calls += 1
        if self.failure is not None:
            raise self.failure
        if not authorization:
            raise AuthenticationError("no credentials (an authorization header is needed)")
        principal = self.principals.get(authorization)
        if principal is None:
            raise AuthenticationError("wrong user name or password")
        return principal
