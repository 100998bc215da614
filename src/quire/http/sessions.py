"""Browser sessions of the HTTP server: a login sets a cookie, every change carries a CSRF token.

A page (the controller's cluster page) cannot keep a password; after a
login checked against the user database (:class:`~quire.security.Authenticator`,
as Basic would be), the server keeps a :class:`Session` in memory and
sets the cookie :data:`COOKIE_NAME`: ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no other site's page sends it) and ``Secure`` when the
server speaks TLS.  A request with that cookie and no ``authorization``
header is the session's principal; one that changes anything (any method
but GET and HEAD) must also carry the session's CSRF token in the header
:data:`CSRF_HEADER`, which the page reads from the login's answer (a
cross-site form cannot set a header, and cannot read the token).  Basic
and Bearer keep working for API clients, with no cookie and no token.

Decisions: sessions live in the process (a restart or another controller
asks for a login again: no session secret to share or rotate); a session
ends ``idle_timeout_s`` after its last request, and at most
``max_age_s`` after the login; at most ``max_sessions`` are kept (the
least recently used goes).  Ids and tokens are 256-bit random, compared in
constant time.
"""

from __future__ import annotations

import collections
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from quire.security import Principal

COOKIE_NAME = "quire_session"
CSRF_HEADER = "X-CSRF-Token"


@dataclass
class Session:
    """One login: its principal, its CSRF token and when it ends."""

    id: str = field(repr=False)
    principal: Principal
    csrf_token: str = field(repr=False)
    started_at: float
    last_used_at: float

    def csrf_matches(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(),
                                                         self.csrf_token.encode())


class SessionStore:
    """The sessions of one server (module docstring); ``clock`` is monotonic seconds."""

    def __init__(self, *, idle_timeout_s: float = 1800.0, max_age_s: float = 12 * 3600.0,
                 max_sessions: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.max_age_s = max_age_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def create(self, principal: Principal) -> Session:
        now = self._clock()
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32),
                          now, now)
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of that id (its idle time restarts), or None."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used_at > self.idle_timeout_s or \
                now - session.started_at > self.max_age_s:
            del self._sessions[session_id]
            return None
        session.last_used_at = now
        self._sessions.move_to_end(session_id)
        return session

    def delete(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)
