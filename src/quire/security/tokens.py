"""Delegation tokens: what the controller gives a client for the segment stores.

Layout (three ``.``-separated parts, each **standard** base64 with padding)::

    <header>.<body>.<signature>
    header     base64 of {"alg":"HS512","typ":"JWT"} (always these bytes)
    body       base64 of the claims as compact JSON, keys sorted:
               {"acl":"<ACL text>","exp":<s>,"iat":<s>,"sub":"<subject>"}
    signature  base64 of HMAC-SHA512(token key, "<header>.<body>")

Why this shape: the official Rust client (``pravega`` 0.3.8) refuses any
other (``../shared/notes/pravega-client-tls-auth.md``): exactly three parts,
the middle one decoded with the *standard* base64 alphabet (a JWT's
base64url ``-``/``_`` make it panic), matching ``"exp":\\s?<digits>`` (so
the JSON is compact and ``exp`` an integer of seconds).  It never reads the
header or the signature.  The standard alphabet has no ``-`` or ``_``, so
no body can trip it.

Claims: the subject (a user name, or :data:`INTERNAL_SUBJECT`), issue and
expiry times (Unix seconds), and what the token grants as an ACL text
(:mod:`quire.security.acl`, usually one entry such as
``prn::/scope:S/stream:T,READ_UPDATE``), so a segment store checks a token
with the same rule as a user's ACL.

Verification (:meth:`TokenSigner.verify`): the header must be this
header's exact text; the signature is compared in constant time
(``hmac.compare_digest``) before the body is even parsed; then the expiry.
A token that does not verify raises :class:`~quire.errors.TokenInvalidError`
(the wire's TOKEN_CHECK_FAILED, code 0); a genuine one past ``exp``
raises :class:`~quire.errors.TokenExpiredError` (TOKEN_EXPIRED, code 1:
the client fetches a new one).  A token is expired from its ``exp``
second on.

The key: HMAC-SHA512 keyed with HMAC-SHA256(cluster secret,
"quire delegation token v1"), so the cluster secret (a file shared by the
controllers and segment stores, :mod:`quire.security.secrets`) may key
other things later without a token ever meaning anything else.

**The internal identity.** Decision: controllers and segment stores prove
who they are to each other with a token of the reserved subject
:data:`INTERNAL_SUBJECT` (``_internal``) granting ``prn::*,READ_UPDATE``,
which each mints for itself from the cluster secret
(:meth:`TokenSigner.internal_token`), rather than with credentials of their
own in another file.  They must hold the cluster secret anyway (to issue
and to check users' tokens), and anyone who holds it can forge any token,
so separate internal credentials would protect nothing more while adding a
file to distribute and rotate.  Only the internal identity reaches internal
resources (``_system``); :meth:`TokenSigner.issue` refuses subjects that
start with ``_``, and the user database refuses such user names, so no user
can be, or be given a token as, the internal identity.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quire.errors import ConfigError, TokenExpiredError, TokenInvalidError
from quire.security.acl import Acl, Permission
from quire.security.principal import Principal
from quire.security.secrets import read_secret

INTERNAL_SUBJECT = "_internal"
"""The subject of the controllers' and segment stores' own tokens."""
MIN_SECRET_BYTES = 16
MAX_TOKEN_CHARS = 16_384
"""Longer text is refused before any work (a token is a few hundred bytes)."""
_HEADER = base64.b64encode(b'{"alg":"HS512","typ":"JWT"}').decode("ascii")
_KEY_LABEL = b"quire delegation token v1"


@dataclass(frozen=True)
class TokenClaims:
    """What a verified token says."""

    subject: str
    issued_at_s: int
    expires_at_s: int
    acl: Acl

    @property
    def internal(self) -> bool:
        return self.subject == INTERNAL_SUBJECT

    def principal(self) -> Principal:
        """The principal the token's bearer acts as (its grants as its ACL)."""
        return Principal(self.subject, self.acl, internal=self.internal)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class TokenSigner:
    """Issues and verifies tokens with one cluster secret (module docstring).

    ``clock`` gives Unix seconds (``time.time``).
    """

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the token secret must be at least {MIN_SECRET_BYTES} bytes")
        self._key = hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()
        self._clock = clock

    @classmethod
    def from_file(cls, path: Path | str, clock: Callable[[], float] = time.time
                  ) -> TokenSigner:
        """A signer with the secret of ``path`` (a secret file, 0600)."""
        return cls(read_secret(path), clock)

    def _sign(self, signed: str) -> bytes:
        return hmac.new(self._key, signed.encode("ascii"), hashlib.sha512).digest()

    def _mint(self, subject: str, acl: Acl, ttl_s: int) -> str:
        if ttl_s <= 0:
            raise ValueError("a token's time to live must be positive")
        now = int(self._clock())
        body = json.dumps({"acl": str(acl), "exp": now + ttl_s, "iat": now, "sub": subject},
                          separators=(",", ":"), sort_keys=True)
        signed = f"{_HEADER}.{_b64(body.encode())}"
        return f"{signed}.{_b64(self._sign(signed))}"

    def issue(self, subject: str, grants: Acl | Mapping[str, Permission], ttl_s: int) -> str:
        """A token for ``subject`` (a user, never a name starting with
        ``_``) granting ``grants`` for ``ttl_s`` seconds from now."""
        if not subject or subject.startswith("_"):
            raise ValueError(f"a token's subject may not be empty or start with '_': "
                             f"{subject!r}")
        return self._mint(subject, grants if isinstance(grants, Acl) else Acl.of(grants), ttl_s)

    def internal_token(self, ttl_s: int) -> str:
        """A token of the internal identity (every resource, ``_system``
        included), valid ``ttl_s`` seconds from now."""
        return self._mint(INTERNAL_SUBJECT, Acl.of({"prn::*": Permission.READ_UPDATE}), ttl_s)

    def verify(self, token: str) -> TokenClaims:
        """The claims of a token this secret signed and that has not
        expired; TokenInvalidError or TokenExpiredError otherwise."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise TokenInvalidError("not a Quire token")
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != _HEADER:
            raise TokenInvalidError("not a Quire token")
        try:
            signature = base64.b64decode(parts[2], validate=True)
        except (binascii.Error, ValueError):
            raise TokenInvalidError("not a Quire token") from None
        if not hmac.compare_digest(self._sign(f"{parts[0]}.{parts[1]}"), signature):
            raise TokenInvalidError("the token's signature does not verify")
        claims = _claims(parts[1])
        if int(self._clock()) >= claims.expires_at_s:
            raise TokenExpiredError(f"the token of {claims.subject} expired")
        return claims


def _claims(body: str) -> TokenClaims:
    """The claims of a body whose signature verified (so written by a
    signer: anything malformed is an invalid token, never a crash)."""
    try:
        doc: Any = json.loads(base64.b64decode(body, validate=True))
        subject, issued, expires, acl = doc["sub"], doc["iat"], doc["exp"], doc["acl"]
        if not (isinstance(subject, str) and type(issued) is int and type(expires) is int
                and isinstance(acl, str)):
            raise TypeError("claim types")
        return TokenClaims(subject, issued, expires, Acl.parse(acl))
    except Exception:  # signed by this secret, yet not claims: refuse it, say so
        raise TokenInvalidError("the token's claims do not parse") from None
