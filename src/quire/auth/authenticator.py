"""The authenticator of Quire's servers: ``authorization`` headers against the user database.

:class:`UserAuthenticator` is the :class:`quire.security.Authenticator` the
HTTP server and the controller use: ``Basic`` credentials are checked
against :class:`~quire.auth.users.UserDatabase`, ``Bearer`` tokens with the
cluster's :class:`~quire.security.TokenSigner` (when the server has the
cluster secret).

The cache.  A scrypt check costs tens of milliseconds of CPU by design, and
a client sends the same header on every request, so a **successful** Basic
check is remembered for ``cache_ttl_ms`` (10 s by default):

* keyed by an HMAC-SHA256 of the whole header under a random per-process
  key, so the cache holds neither passwords nor anything that can be
  checked against a guess outside this process;
* bounded (``cache_max_entries``, least recently used out first);
* failures are never cached (a client that just got its password fixed
  is not refused from memory, and a guesser keeps paying full price);
* concurrent checks of one header wait for one scrypt run, not N;
* the price: a password change, an ACL change or a deleted user takes
  effect on a server within ``cache_ttl_ms``.

Tokens are not cached: their check is one HMAC.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import os
import time
from collections.abc import Callable

from quire.auth.users import UserDatabase
from quire.errors import AuthenticationError
from quire.security import BearerToken, Principal, TokenSigner, parse_authorization


class UserAuthenticator:
    """See the module docstring; ``clock`` is monotonic seconds."""

    def __init__(self, users: UserDatabase, tokens: TokenSigner | None = None, *,
                 cache_ttl_ms: int = 10_000, cache_max_entries: int = 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.users = users
        self.tokens = tokens
        self._ttl_s = cache_ttl_ms / 1000
        self._max_entries = cache_max_entries
        self._clock = clock
        self._key = os.urandom(32)
        self._cache: collections.OrderedDict[bytes, tuple[float, Principal]] = \
            collections.OrderedDict()
        self._checking: dict[bytes, asyncio.Future[Principal]] = {}
        """The scrypt check running for each header, awaited by every caller."""

    async def authenticate(self, authorization: str | None) -> Principal:
        credentials = parse_authorization(authorization)
        if isinstance(credentials, BearerToken):
            if self.tokens is None:
                raise AuthenticationError("bearer tokens are not accepted here")
            return self.tokens.verify(credentials.token).principal()
        assert authorization is not None
        key = hmac.new(self._key, authorization.encode(), hashlib.sha256).digest()
        cached = self._cache.get(key)
        now = self._clock()
        if cached is not None:
            if cached[0] > now:
                self._cache.move_to_end(key)
                return cached[1]
            del self._cache[key]
        check = self._checking.get(key)
        if check is None:  # one scrypt run per header at a time, whoever is waiting
            check = asyncio.ensure_future(self.users.authenticate(credentials.username,
                                                                  credentials.password))
            self._checking[key] = check
            check.add_done_callback(lambda done: self._checked(key, done))
        return await asyncio.shield(check)

    def _checked(self, key: bytes, check: asyncio.Future[Principal]) -> None:
        del self._checking[key]
        if not check.cancelled() and check.exception() is None:
            self._remember(key, check.result())

    def _remember(self, key: bytes, principal: Principal) -> None:
        if self._ttl_s <= 0 or self._max_entries <= 0:
            return
        self._cache[key] = (self._clock() + self._ttl_s, principal)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)

    def forget(self) -> None:
        """Drop every cached check (the next request of each client is
        checked against the database again)."""
        self._cache.clear()
