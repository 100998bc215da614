"""The tier-1 log seam: :class:`DurableDataLog` (Pravega's name for it).

A segment container writes every operation to one durable log before it
applies it, replays that log when it opens, and truncates it once a
checkpoint covers the front.  This module says what such a log must do;
:class:`~quire.log.named_data_log.NamedDataLog` does it on a named log, and
:class:`quire.testing.memory_data_log.MemoryDataLog` in memory, for tests.
Both pass the same contract tests.

Addresses are :class:`~quire.log.Position` s: totally ordered, and
serialisable as text (``str(address)``, ``Position.parse``), so a container
can keep one in a checkpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from quire.log.position import Position


class DurableDataLog(Protocol):
    """One owner's ordered, durable log of opaque records.

    Contract:

    * **Ownership.**  :meth:`initialize` makes this instance the log's only
      writer: its :attr:`epoch` is higher than every earlier instance's, and
      every earlier instance is fenced from then on.  A fenced instance's
      appends (pending or later) and truncations fail with
      :class:`~quire.log.LogFencedError`, and nothing it appends after the
      fence is ever read by anyone.  An append pending when the fence landed
      has an unknown outcome (it may or may not be in the log).  Losing a
      ledger to a fence while the epoch is still ours is *not* a loss of
      ownership: the log goes on (the implementation rolls to a new ledger).
      Calling any other method before :meth:`initialize` raises
      :class:`~quire.log.LogError`.
    * **Append.**  ``append(data)`` (a plain method, not a coroutine) queues
      one record and returns a future of its address.  Addresses strictly
      increase in call order, and the futures complete in that order.  A
      future completes once the record is durable (on the ack quorum) and
      will be read by every later :meth:`read`, including by the next owner.
      ``QueueFullError`` may be raised at once when too much is queued:
      await earlier futures, then retry.
    * **Read.**  ``read(from_address)`` yields ``(address, data)`` in address
      order, each record once: every record at or after ``from_address``
      (None: the first one still in the log) whose append completed before
      the call, and possibly later ones.  Records removed by a truncation
      are skipped.
    * **Truncate.**  ``truncate(up_to)`` allows the log to drop every record
      at or before ``up_to``.  It never drops a record after it; it may keep
      some at or before it for a while (a named log drops whole ledgers).
    * **Close.**  :meth:`close` waits for the pending appends and gives up
      ownership; it is idempotent, and a fenced instance's close just lets go
      (no error).  Afterwards :meth:`append` and :meth:`truncate` raise
      :class:`~quire.log.LogWriterClosedError`.  A new instance that
      initializes later reads every record whose append completed.
    """

    @property
    def epoch(self) -> int:
        """This instance's epoch (set by :meth:`initialize`)."""
        ...

    async def initialize(self) -> None:
        """Take the log, fencing every earlier instance (see the class contract)."""
        ...

    def append(self, data: bytes) -> asyncio.Future[Position]:
        """Queue ``data`` as the next record; the future gives its address
        once it is durable."""
        ...

    def read(self, from_address: Position | None = None
             ) -> AsyncIterator[tuple[Position, bytes]]:
        """The records from ``from_address`` on, in order (see the contract)."""
        ...

    async def truncate(self, up_to: Position) -> None:
        """Let the log drop every record at or before ``up_to``."""
        ...

    async def close(self) -> None:
        """Wait for pending appends and give up the log."""
        ...
