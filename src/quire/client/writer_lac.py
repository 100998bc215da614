"""What a writer does with its LAC besides moving it on acknowledgement:
BP-14's LAC and ``sync()`` for VD_JOURNAL ledgers, and WRITE_LAC.

BP-14 VD_JOURNAL ledgers: an acknowledged add is only in the bookies' page
cache, so acknowledgement does not move the LAC.  Every add answer carries the
bookie's LastAddSynced; with the values of the ensemble sorted ascending
(a bookie that has not reported counts as -1) the LAC is the largest of the
first ``W - A + 1`` of them, capped at the last completed append and never
moving back.

``WriteHandle.sync()`` covers the entries appended before the call: its
result never names an entry appended after it.  PD ledgers are persistent on
acknowledgement: it waits for those appends and gives the LAC.  For VD
ledgers it waits for them, sends SYNC to the ensemble and completes once an
ack quorum answered; their LastAddSynced values move the LAC, which is then
sent with WRITE_LAC.  LedgerNotSyncedError if fewer than an ack quorum of
bookies could sync.

WRITE_LAC: while the LAC is ahead of what the last add piggy-backed, the
writer tells its ensemble every ``explicit_lac_interval_ms`` so that readers
of an idle ledger learn it; a sync that moved the LAC tells them at once.

:class:`WriterLac` belongs to one :class:`~quire.client.write_handle.WriteHandle`
and moves its LAC (the writer's ``_lac`` and ``_lac_length``); the add path
reaches the LastAddSynced list and the lengths queue directly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from quire.client.context import ClientContext
from quire.errors import LedgerNotSyncedError, QuireError
from quire.metadata import LedgerMetadata
from quire.peer import BookieClient
from quire.types import NO_ENTRY


class LacWriter(Protocol):
    """The writer state :class:`WriterLac` reads, and the LAC it moves (the
    attributes of :class:`~quire.client.write_handle.WriteHandle`)."""

    _lac: int
    _lac_length: int
    """The ledger's length up to and including the LAC."""
    _last_completed: int
    _piggybacked_lac: int
    """The LAC the last add sent carried."""
    _clients: list[BookieClient]
    """The current ensemble's bookies."""
    _error: QuireError | None
    _change_task: asyncio.Task[None] | None


class WriterLac:
    """BP-14's LAC and sync, and WRITE_LAC, for ``writer`` of ledger
    ``ledger_id`` (metadata ``md``); see the module docstring."""

    def __init__(self, writer: LacWriter, ctx: ClientContext, ledger_id: int,
                 md: LedgerMetadata, master_key: bytes) -> None:
        self._writer = writer
        self._ctx = ctx
        self._ledger_id = ledger_id
        self._master_key = master_key
        self._ack_quorum = md.ack_quorum_size
        self.last_add_synced = [NO_ENTRY] * md.ensemble_size
        """BP-14: each ensemble bookie's latest LastAddSynced."""
        self.unconfirmed_lengths: deque[tuple[int, int]] = deque()
        """VD: (entry id, length) of completed entries above the LAC."""
        self._rank = md.write_quorum_size - md.ack_quorum_size
        self._explicit_lac = NO_ENTRY
        self._task: asyncio.Task[None] | None = None

    # --- BP-14 --------------------------------------------------------------

    def advance(self) -> None:
        """LAC = max of the lowest ``W - A + 1`` LastAddSynced values, capped at
        the last completed append; it never moves back."""
        writer = self._writer
        candidate = min(sorted(self.last_add_synced)[self._rank], writer._last_completed)
        if candidate <= writer._lac:
            return
        writer._lac = candidate
        lengths = self.unconfirmed_lengths
        while lengths and lengths[0][0] <= candidate:
            writer._lac_length = lengths.popleft()[1]

    async def sync(self, target: int) -> int:
        """VD: SYNC to the ensemble once the appends up to ``target`` completed;
        complete once an ack quorum answered (LedgerNotSyncedError if fewer
        could sync), WRITE_LAC a LAC that moved; the LAC, at most ``target``."""
        ok, problems = await self._sync_round()
        if ok < self._ack_quorum:
            raise LedgerNotSyncedError(
                f"ledger {self._ledger_id}: only {ok} of the ack quorum of {self._ack_quorum} "
                f"bookies synced ({'; '.join(problems) or 'no answer'})")
        lac = self._writer._lac
        if lac > self._explicit_lac:
            self._explicit_lac = lac
            self._write_lac(lac)
        return min(lac, target)

    async def _sync_round(self) -> tuple[int, list[str]]:
        """SYNC to every ensemble bookie until an ack quorum answered OK (or all
        answered); returns the OK count and what the others said."""
        timeout = self._ctx.add_timeout_s
        loop = asyncio.get_running_loop()
        calls = {loop.create_task(client.sync(self._ledger_id, timeout)): i
                 for i, client in enumerate(self._writer._clients)}
        ok, problems = 0, []
        waiting = set(calls)
        try:
            while waiting and ok < self._ack_quorum:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=calls.__getitem__):  # (a set: ensemble order)
                    index = calls[task]
                    error = task.exception()
                    if error is None:
                        ok += 1
                        last_add_synced = task.result()
                        if last_add_synced > self.last_add_synced[index]:
                            self.last_add_synced[index] = last_add_synced
                    else:
                        problems.append(str(error))
        finally:
            for task in waiting:
                task.cancel()
        self.advance()
        return ok, problems

    # --- WRITE_LAC ----------------------------------------------------------

    def start(self) -> None:
        """Send the LAC of an idle writer every ``explicit_lac_interval_ms``."""
        self._task = asyncio.get_running_loop().create_task(self._send_explicit_lac())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _send_explicit_lac(self) -> None:
        """While the LAC is ahead of what the last add piggy-backed, tell the
        ensemble (WRITE_LAC) so readers of an idle ledger learn it."""
        interval = self._ctx.config.explicit_lac_interval_ms / 1000.0
        writer = self._writer
        while True:
            await asyncio.sleep(interval)
            lac = writer._lac
            if (lac <= writer._piggybacked_lac or lac <= self._explicit_lac
                    or writer._change_task is not None or writer._error is not None):
                continue
            self._explicit_lac = lac
            self._write_lac(lac)

    def _write_lac(self, lac: int) -> None:
        """WRITE_LAC ``lac`` to the ensemble (best effort: answers are ignored)."""
        timeout = self._ctx.add_timeout_s
        for client in self._writer._clients:
            client.write_lac(self._ledger_id, lac, self._master_key, timeout, _ignore_answer,
                             None)


def _ignore_answer(_token: Any, _result: object) -> None:
    """WRITE_LAC is best effort: its answers change nothing."""
