"""A ledger's keys, derived from its password as BookKeeper derives them.

``master_key = SHA1(b"ledger" + password)`` goes with every add, fence and
WRITE_LAC (a bookie refuses those whose key is not the one the ledger was
created with); ``mac_key = SHA1(b"mac" + password)`` keys the HMAC-SHA1
digests of ``DigestType.HMAC_SHA1`` ledgers.

Decisions:

* The metadata store keeps these two keys, never the password (see
  :mod:`quire.metadata.model`): recovery, repair and autorecovery need
  exactly them, and a password is often reused elsewhere while the keys
  open nothing but the ledgers made with it.  So whoever reads the
  metadata store can fence and write every ledger (as in BookKeeper, whose
  metadata holds the password itself); bookie mutual TLS and ZooKeeper ACLs
  are what keep strangers from doing it.
* Keys are compared in constant time (:func:`same_key`,
  ``hmac.compare_digest``: the bookie's checks of the key of an add, a
  fence, a WRITE_LAC, and the client's of a password), and never shown in
  a ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


def master_key(password: bytes) -> bytes:
    """The 20-byte key sent with adds, fences and WRITE_LAC (BookKeeper's)."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key for ``DigestType.HMAC_SHA1`` (BookKeeper's)."""
    return hashlib.sha1(b"mac" + password).digest()


same_key = hmac.compare_digest
"""Whether two master keys are the same, in constant time."""


@dataclass(frozen=True, slots=True)
class LedgerKeys:
    """The keys of one ledger (both derived from its password)."""

    master_key: bytes
    mac_key: bytes

    @classmethod
    def of_password(cls, password: bytes) -> LedgerKeys:
        return cls(master_key(password), mac_key(password))

    def matches(self, other: LedgerKeys) -> bool:
        """Whether ``other`` has the same master key (constant time)."""
        return same_key(self.master_key, other.master_key)

    def __repr__(self) -> str:  # keys are secrets: never in a log line or a traceback
        return "LedgerKeys(<hidden>)"


EMPTY_PASSWORD_KEYS = LedgerKeys.of_password(b"")
"""The keys of a ledger made without a password."""
