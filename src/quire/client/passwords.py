"""Which keys a client uses for a ledger: those of the caller's password.

A ledger's metadata keeps its keys (:class:`~quire.security.LedgerKeys`),
never its password (:mod:`quire.metadata.model`).  Opening a ledger derives
the keys of the password given and compares master keys with the stored
ones, in constant time: UnauthorizedError if they differ, before any
bookie is asked anything.

A :class:`LedgerPasswords` is a password for new ledgers plus older ones
still accepted for ledgers made with them (a password rotated, or the
segment stores' built-in tier-1 password of clusters made before it came
from configuration): each ledger opens with the password its own metadata
says it was made with.  Nothing is recorded about which one that was; the
stored master key is what tells.

Recovery tools that hold no password (repair, autorecovery, an operator's
``quire ledger recover``) open ledgers with the stored keys themselves
(:meth:`quire.client.Client.open_ledger_as_admin`, BookKeeperAdmin's
openLedger): whoever reads the metadata store can.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from quire.errors import UnauthorizedError
from quire.metadata import LedgerMetadata
from quire.security.ledger_keys import LedgerKeys


@dataclass(frozen=True)
class LedgerPasswords:
    """``current``: the password of the ledgers made from now on;
    ``previous``: passwords ledgers made before may have, tried in order."""

    current: bytes
    previous: tuple[bytes, ...] = ()

    def __iter__(self) -> Iterator[bytes]:
        yield self.current
        yield from self.previous

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"LedgerPasswords(<hidden>, {len(self.previous)} previous)"


Password: TypeAlias = bytes | LedgerPasswords
"""What a client call takes as a ledger's password."""


def new_ledger_keys(password: Password) -> LedgerKeys:
    """The keys of a ledger made now with ``password``."""
    return LedgerKeys.of_password(
        password.current if isinstance(password, LedgerPasswords) else password)


def keys_for(ledger_id: int, metadata: LedgerMetadata, password: Password) -> LedgerKeys:
    """The keys of the (first) password of ``password`` that the ledger was
    made with; UnauthorizedError if none was."""
    for candidate in (password if isinstance(password, LedgerPasswords) else (password,)):
        keys = LedgerKeys.of_password(candidate)
        if keys.matches(metadata.keys):
            return keys
    raise UnauthorizedError(f"wrong password for ledger {ledger_id}")
