"""Seeded bugs: known-wrong protocol changes the simulation must catch.

Each is switched on for one run by :func:`seeded_bug` (``--bug NAME`` on the
command line) and undone afterwards; they exist to show that the
invariants have teeth, and are never on in the product (which never
imports this package).

* ``unknown-as-no``: recovery reads count every failed answer (timeout,
  lost connection, UNKNOWN) as NO_SUCH_ENTRY, so a recovery that cannot
  reach enough replicas decides an entry is gone and closes the ledger
  short of what was acknowledged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from quire.client import reads
from quire.errors import QuireError

BUGS = ("unknown-as-no",)


@contextlib.contextmanager
def seeded_bug(name: str) -> Iterator[None]:
    """Switch bug ``name`` on inside the block ("" : none)."""
    if not name:
        yield
        return
    if name not in BUGS:
        raise ValueError(f"unknown seeded bug {name!r} (known: {', '.join(BUGS)})")
    saved = reads.EXPLICIT_NEGATIVES
    reads.EXPLICIT_NEGATIVES = (QuireError,)  # type: ignore[assignment]
    try:
        yield
    finally:
        reads.EXPLICIT_NEGATIVES = saved
