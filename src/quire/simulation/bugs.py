"""Seeded bugs: known-wrong protocol changes the simulation must catch.

Each is switched on for one run by :func:`seeded_bug` (``--bug NAME`` on the
command line) and undone afterwards; they exist to show that the
invariants have teeth.  Every one is a patch of a product function for the
duration of the run, or a switch read by the simulation's own bookie
assembly (:mod:`~quire.simulation.cluster`): the product has no switch and
no check on any path, so its speed is untouched, and it never imports this
package.

* ``unknown-as-no``: recovery reads count every failed answer (timeout,
  lost connection, UNKNOWN) as NO_SUCH_ENTRY, so a recovery that cannot
  reach enough replicas decides an entry is gone and closes the ledger
  short of what was acknowledged.
* ``skip-fencing``: recovery's "fencing" reads do not fence, so the old
  writer keeps adding, and being acknowledged, past the end recovery
  closes the ledger at.
* ``ack-before-fsync``: a bookie answers a journaled add as soon as it is
  in the journal's buffer, without waiting for (or asking for) the fsync
  covering it, which comes with the next sync anything else asks for or
  the next checkpoint; a power loss before that takes back acknowledged
  PD entries.
* ``forget-limbo``: a bookie that boots with an empty disk (or after a
  crash without the journal) skips BP-46 phase one: it neither fences its
  ledgers nor puts them in limbo, so it answers "no such entry" for
  entries it acknowledged, and two such noes close a ledger short.
* ``lac-backwards``: a reader's READ_LAC keeps only this round's highest
  answer, forgetting what the handle knew, so a round in which the
  up-to-date bookies do not answer moves the LAC back.
* ``limbo-answers-no``: a bookie's reads answer NO_SUCH_ENTRY /
  NO_SUCH_LEDGER about ledgers it holds in limbo, as if the limbo were not
  there (``RequestHandlers.unless_limbo`` passes every status on); the
  watched connections of :mod:`~quire.simulation.cluster` see the
  negatives at once (``limbo-negative``).

The stream layer's bugs (:data:`STREAM_BUGS`) are described in
:mod:`quire.simulation.streams.bugs`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from quire.bookie.connection import BookieConnection
from quire.bookie.durability import AfterFsync, StoredAdd
from quire.bookie.handlers import RequestHandlers
from quire.client import reads
from quire.client.read_handle import ReadHandle
from quire.errors import BookieUnavailableError, QuireError, StatusCode
from quire.peer import BookieClient
from quire.peer.connection import ReadHandler
from quire.protocol import LAST_ENTRY_ID, ReadRequest, ReadResponse
from quire.simulation.streams.bugs import STREAM_BUGS, stream_bug
from quire.types import LedgerState

BUGS = ("unknown-as-no", "skip-fencing", "ack-before-fsync", "forget-limbo", "lac-backwards",
        "limbo-answers-no")

active: str = ""
"""The bug switched on now ("" : none); the simulation's bookie assembly
reads it for ``forget-limbo``."""


def _read_without_fencing(self: BookieClient, ledger_id: int, master_key: bytes,
                          timeout_s: float, handler: ReadHandler, token: Any) -> None:
    self._request(ReadRequest(0, ledger_id, LAST_ENTRY_ID, 0, None), ReadResponse, timeout_s,
                  handler, token)


def _run_answered_at_once(self: AfterFsync, conn: BookieConnection,
                          request_ids: tuple[int, ...], ledger_id: int, entry_ids: list[int],
                          last_seq: int, started: float, held: int) -> None:
    conn.pending_bytes += held
    self.run_durable((conn, request_ids, ledger_id, entry_ids, started, held), None)


def _adds_answered_at_once(self: AfterFsync, conn: BookieConnection, stored: list[StoredAdd],
                           started: float, held: int) -> None:
    conn.pending_bytes += held
    self.adds_durable((conn, stored, started, held), None)


async def _lac_of_this_round(self: ReadHandle) -> int:
    md = self._versioned.value
    if md.state is LedgerState.CLOSED:
        return self._lac
    answers = await asyncio.gather(*(self._read_lac_from(b) for b in md.last_ensemble))
    known = [lac for lac in answers if isinstance(lac, int)]
    if not known:
        raise BookieUnavailableError(f"ledger {self._ledger_id}: no READ_LAC answer")
    self._lac = max(known)  # the bug: not max(self._lac, ...)
    return self._lac


def _status_as_is(self: RequestHandlers, ledger_id: int, status: StatusCode) -> StatusCode:
    return status  # the bug: not UNKNOWN for a negative about a limbo ledger


@contextlib.contextmanager
def seeded_bug(name: str) -> Iterator[None]:
    """Switch bug ``name`` on inside the block ("" : none)."""
    global active
    if not name:
        yield
        return
    if name in STREAM_BUGS:
        with stream_bug(name):
            yield
        return
    if name not in BUGS:
        raise ValueError(f"unknown seeded bug {name!r} (known: "
                         f"{', '.join(BUGS + STREAM_BUGS)})")
    names = vars(reads)  # (the module's globals: its reads look the name up there)
    saved = (names["EXPLICIT_NEGATIVES"], BookieClient.fence_read, AfterFsync.run,
             AfterFsync.adds, ReadHandle.read_last_add_confirmed, RequestHandlers.unless_limbo)
    if name == "unknown-as-no":
        names["EXPLICIT_NEGATIVES"] = (QuireError,)
    elif name == "skip-fencing":
        BookieClient.fence_read = _read_without_fencing  # type: ignore[method-assign]
    elif name == "ack-before-fsync":
        AfterFsync.run = _run_answered_at_once  # type: ignore[method-assign]
        AfterFsync.adds = _adds_answered_at_once  # type: ignore[method-assign]
    elif name == "lac-backwards":
        ReadHandle.read_last_add_confirmed = _lac_of_this_round  # type: ignore[method-assign]
    elif name == "limbo-answers-no":
        RequestHandlers.unless_limbo = _status_as_is  # type: ignore[method-assign]
    active = name
    try:
        yield
    finally:
        active = ""
        names["EXPLICIT_NEGATIVES"] = saved[0]
        BookieClient.fence_read = saved[1]  # type: ignore[method-assign]
        AfterFsync.run = saved[2]  # type: ignore[method-assign]
        AfterFsync.adds = saved[3]  # type: ignore[method-assign]
        ReadHandle.read_last_add_confirmed = saved[4]  # type: ignore[method-assign]
        RequestHandlers.unless_limbo = saved[5]  # type: ignore[method-assign]
