"""Password hashes: scrypt with a random salt, in a self-describing text.

A stored hash reads ``scrypt$<N>$<r>$<p>$<salt>$<hash>`` (salt and hash in
standard base64), so the cost can be raised later without breaking the
hashes already stored: :func:`verify_password` takes the parameters from
the text it checks.  Quire never stores a password, only this.

Decisions:

* scrypt (``hashlib.scrypt``, OpenSSL's) rather than argon2: it is in the
  standard library, memory-hard, and needs no new dependency.
* Cost N = 2**14, r = 8, p = 1 (16 MiB, about 30-60 ms of one core): a
  login is not a hot path, and Quire's servers cache a successful check
  (:mod:`quire.auth`), so the cost is paid about once per client and
  cache period, while a guesser pays it on every try.  ``hashlib.scrypt``
  releases the GIL; servers still run it on a worker thread
  (``asyncio.to_thread``) so the event loop is never held.
* A wrong password costs exactly what a right one does (the same
  derivation, then ``hmac.compare_digest``); an unknown user is checked
  against :data:`DUMMY_HASH` by the user database, so neither the answer's
  time nor its text tells an unknown user from a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SCRYPT_N = 1 << 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
_MAX_N = 1 << 20
"""Refused above this: a stored text cannot make a check take seconds and a GiB."""
_PREFIX = "scrypt"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _derive(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=length,
                          maxmem=128 * r * n * p + (64 << 20))


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """The storable hash of ``password`` (a fresh random salt each time)."""
    if not password:
        raise ValueError("a password may not be empty")
    salt = os.urandom(SALT_BYTES)
    digest = _derive(password, salt, n, r, p, HASH_BYTES)
    return f"{_PREFIX}${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _parse(encoded: str) -> tuple[int, int, int, bytes, bytes] | None:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != _PREFIX:
        return None
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        return None
    if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16
            and salt and 16 <= len(digest) <= 64):
        return None
    return n, r, p, salt, digest


def is_password_hash(encoded: str) -> bool:
    """True if ``encoded`` is a hash text :func:`verify_password` can check."""
    return _parse(encoded) is not None


def verify_password(password: str, encoded: str) -> bool:
    """True if ``password`` is the one ``encoded`` was made from (constant
    time in the comparison); False for a wrong password or a text that is
    not a hash (which never matches)."""
    parsed = _parse(encoded)
    if parsed is None:
        return False
    n, r, p, salt, digest = parsed
    return hmac.compare_digest(_derive(password, salt, n, r, p, len(digest)), digest)


DUMMY_HASH = f"{_PREFIX}${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(b'quire-dummy-salt')}$" \
             f"{_b64(bytes(HASH_BYTES))}"
"""What an unknown user's password is checked against: the same work as a
real check, and no password's hash is all zeroes."""
