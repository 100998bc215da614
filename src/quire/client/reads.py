"""Reading entries from their replicas (BookKeeper's PendingReadOp).

:class:`EntryReadOp` reads one entry from the replicas of its write set and
classifies every answer into exactly one of three kinds:

* **good**: OK with an entry whose digest and ids verify;
* **explicit no**: NO_SUCH_ENTRY or NO_SUCH_LEDGER;
* **unknown**: everything else (errors, UNKNOWN, timeouts, lost connections,
  and OK answers whose digest does not verify, counted apart so the error can
  say so).  An unknown is never counted as a no.

A *normal* read asks one replica at a time, in order, failing over on any
non-good answer and speculatively asking the next replica when one is slow.
A *recovery* read asks every replica at once and waits for every answer (or
timeout) unless a good copy comes first: one good copy makes the entry
recoverable; otherwise ``gone_threshold`` explicit noes make it gone.

:func:`read_range` pipelines single-entry reads over a range; a batched
(BP-62) path can sit beside it behind the same ``read_range`` signature.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from itertools import repeat
from typing import NamedTuple

from quire.client.context import ClientContext
from quire.errors import (
    EXPLICIT_NEGATIVES,
    DigestMismatchError,
    EntryNotAvailableError,
    NoSuchEntryError,
    QuireError,
)
from quire.protocol import DigestManager, EntryHeader, ReadResponse


class LedgerEntry(NamedTuple):
    """One entry read back: its id and its payload (a NamedTuple: reads make
    millions of these, and a frozen dataclass costs several times more)."""

    entry_id: int
    data: bytes


_new_tuple = tuple.__new__


def ledger_entries(first_entry_id: int, payloads: list[bytes]) -> list[LedgerEntry]:
    """``LedgerEntry(first_entry_id, payloads[0])``, ``(+1, payloads[1])``...
    built by ``tuple.__new__`` in C: a NamedTuple's own ``__new__`` is
    Python code, three times slower over a batch's hundreds of entries."""
    count = len(payloads)
    return list(map(_new_tuple, repeat(LedgerEntry, count),
                    zip(range(first_entry_id, first_entry_id + count), payloads,
                        strict=True)))


ReplicaLookup = Callable[[int], tuple[str, ...]]
"""Entry id -> the bookie ids of its write set, in the order to try them."""


class EntryReadOp:
    """Reads one entry; calls ``on_done(self)`` once, when it is decided.

    Outcome: ``header``/``payload``/``stored`` set (good copy found), or
    ``gone`` True (recovery reads only), or ``error`` set to
    :class:`EntryNotAvailableError` (some answer was unknown),
    :class:`DigestMismatchError` (no unknowns, and every copy that exists is
    corrupt) or :class:`NoSuchEntryError` (every replica said no).
    """

    __slots__ = (
        "_ctx",
        "_digest",
        "_digest_failures",
        "_errors",
        "_ledger_id",
        "_negatives",
        "_next",
        "_on_done",
        "_outstanding",
        "_parallel",
        "_replicas",
        "_timer",
        "_unknown",
        "done",
        "entry_id",
        "error",
        "gone",
        "gone_threshold",
        "header",
        "payload",
        "stored",
    )

    def __init__(self, ctx: ClientContext, digest: DigestManager, entry_id: int,
                 replicas: tuple[str, ...], on_done: Callable[[EntryReadOp], None], *,
                 recovery: bool = False, gone_threshold: int = 0) -> None:
        self._ctx = ctx
        self._digest = digest
        self._ledger_id = digest.ledger_id
        self.entry_id = entry_id
        self._replicas = replicas
        self._on_done = on_done
        self._parallel = recovery
        self.gone_threshold = gone_threshold
        self._next = 0
        self._outstanding = 0
        self._negatives = 0
        self._unknown = 0
        self._digest_failures = 0
        self._errors: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self.done = False
        self.header: EntryHeader | None = None
        self.payload: memoryview | None = None
        self.stored: bytes | None = None
        self.gone = False
        self.error: QuireError | None = None

    def start(self) -> EntryReadOp:
        if self._parallel:
            while self._next < len(self._replicas):
                self._send_next()
        else:
            self._send_next()
        return self

    def _send_next(self) -> None:
        index = self._next
        self._next += 1
        self._outstanding += 1
        ctx = self._ctx
        ctx.pool.client(self._replicas[index]).read_entry(
            self._ledger_id, self.entry_id, ctx.read_timeout_s, self._on_answer, index)
        if (not self._parallel and self._next < len(self._replicas)
                and ctx.config.speculative_read_timeout_ms > 0):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(
                ctx.speculative_timeout_s, self._speculate)

    def _speculate(self) -> None:
        self._timer = None
        if not self.done and self._next < len(self._replicas):
            self._send_next()

    def _on_answer(self, index: int, result: ReadResponse | QuireError) -> None:
        if self.done:
            return
        self._outstanding -= 1
        bookie = self._replicas[index]
        if type(result) is ReadResponse:
            assert result.entry is not None
            try:
                self.header, self.payload = self._digest.verify(result.entry, self.entry_id)
            except DigestMismatchError as e:
                self._digest_failures += 1
                self._errors.append(f"{bookie}: {e}")
            else:
                self.stored = result.entry
                self._finish()
                return
        elif isinstance(result, EXPLICIT_NEGATIVES):
            self._negatives += 1
            self._errors.append(str(result))
        else:
            self._unknown += 1
            self._errors.append(str(result))
        if not self._parallel and self._next < len(self._replicas):
            self._send_next()  # fail over now, whatever the speculative timer says
        elif self._outstanding == 0:
            self._finish_without_copy()

    def _finish_without_copy(self) -> None:
        if self.gone_threshold and self._negatives >= self.gone_threshold:
            # enough definite noes: the entry cannot have been acknowledged
            # (the other answers were awaited: a good copy would have won)
            self.gone = True
            self._finish()
            return
        self._fail()

    def _fail(self) -> None:
        where = f"entry {self.entry_id} of ledger {self._ledger_id}"
        detail = "; ".join(self._errors)
        if self._unknown:
            self.error = EntryNotAvailableError(
                f"{where}: no replica could serve it and {self._unknown} of "
                f"{len(self._replicas)} answers were not a definite no ({detail})")
        elif self._digest_failures:
            self.error = DigestMismatchError(f"{where}: no replica has a copy that verifies "
                                             f"({detail})")
        else:
            self.error = NoSuchEntryError(f"{where}: every replica says it does not exist "
                                          f"({detail})")
        self._finish()

    def _finish(self) -> None:
        self.done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._on_done(self)


def read_range(ctx: ClientContext, digest: DigestManager, replicas: ReplicaLookup,
               first: int, last: int) -> asyncio.Future[list[LedgerEntry]]:
    """Read entries ``first..last`` with up to ``max_outstanding_reads`` on the
    wire; the future fails with the first entry's error."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[list[LedgerEntry]] = loop.create_future()
    count = last - first + 1
    entries: list[LedgerEntry | None] = [None] * count
    state = [first, 0]  # next entry to launch, entries done

    def launch() -> None:
        entry_id = state[0]
        state[0] += 1
        EntryReadOp(ctx, digest, entry_id, replicas(entry_id), done).start()

    def done(op: EntryReadOp) -> None:
        if result.done():
            return
        if op.error is not None:
            result.set_exception(op.error)
            return
        assert op.payload is not None
        entries[op.entry_id - first] = LedgerEntry(op.entry_id, bytes(op.payload))
        state[1] += 1
        if state[1] == count:
            result.set_result(entries)  # type: ignore[arg-type]
        elif state[0] <= last:
            launch()

    for _ in range(min(count, ctx.config.max_outstanding_reads)):
        launch()
    return result
