"""Seeded bugs: known-wrong protocol changes the simulation must catch.

Each is switched on for one run by :func:`seeded_bug` (``--bug NAME`` on the
command line) and undone afterwards; they exist to show that the
invariants have teeth, and are never on in the product (which never
imports this package).

* ``unknown-as-no``: recovery reads count every failed answer (timeout,
  lost connection, UNKNOWN) as NO_SUCH_ENTRY, so a recovery that cannot
  reach enough replicas decides an entry is gone and closes the ledger
  short of what was acknowledged.
* ``skip-fencing``: recovery's "fencing" reads do not fence, so the old
  writer keeps adding, and being acknowledged, past the end recovery
  closes the ledger at.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from quire.client import reads
from quire.errors import QuireError
from quire.peer import BookieClient
from quire.peer.connection import ReadHandler
from quire.protocol import LAST_ENTRY_ID, ReadRequest, ReadResponse

BUGS = ("unknown-as-no", "skip-fencing")


def _read_without_fencing(self: BookieClient, ledger_id: int, master_key: bytes,
                          timeout_s: float, handler: ReadHandler, token: Any) -> None:
    self._request(ReadRequest(0, ledger_id, LAST_ENTRY_ID, 0, None), ReadResponse, timeout_s,
                  handler, token)


@contextlib.contextmanager
def seeded_bug(name: str) -> Iterator[None]:
    """Switch bug ``name`` on inside the block ("" : none)."""
    if not name:
        yield
        return
    if name not in BUGS:
        raise ValueError(f"unknown seeded bug {name!r} (known: {', '.join(BUGS)})")
    names = vars(reads)  # (the module's globals: its reads look the name up there)
    negatives, fence_read = names["EXPLICIT_NEGATIVES"], BookieClient.fence_read
    if name == "unknown-as-no":
        names["EXPLICIT_NEGATIVES"] = (QuireError,)
    else:
        BookieClient.fence_read = _read_without_fencing  # type: ignore[method-assign]
    try:
        yield
    finally:
        names["EXPLICIT_NEGATIVES"] = negatives
        BookieClient.fence_read = fence_read  # type: ignore[method-assign]
