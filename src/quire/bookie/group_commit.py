"""Group commit: many journal appends, one fsync, on one dedicated thread.

Adds append to the journal's buffer on the event-loop thread and register a
callback for their journal sequence number.  At most one fsync runs at a
time, in the ``quire-fsync`` thread; every add that arrives while it runs
joins the next one.  Under load that gives BookKeeper's natural batching with
no timer; ``max_group_wait_ms`` adds an optional wait to gather more.

A failed fsync leaves durability unknown: the waiting callbacks get the
exception (the server answers IO_ERROR and turns read-only), never an OK.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar


class SyncableJournal(Protocol):
    """What group commit needs of the journal (see the storage engine)."""

    def sync(self) -> int:
        """Write and fsync everything appended so far; return the highest
        sequence number now durable.  Called on one thread only."""
        ...


DurableCallback = Callable[[BaseException | None], None]
T = TypeVar("T")


def _call_plain(callback: DurableCallback, error: BaseException | None) -> None:
    """The waiter callback of :meth:`GroupCommitter.after_durable`."""
    callback(error)

SyncObserver = Callable[[float, int], None]
"""Called after each fsync with (seconds taken, callbacks released)."""
DurableHook = Callable[[int], None]
"""Called with the new durable seq after each fsync, before any callback."""


class GroupCommitter:
    def __init__(self, journal: SyncableJournal, *, max_group_wait_ms: float = 0.0,
                 on_sync: SyncObserver | None = None,
                 on_durable: DurableHook | None = None) -> None:
        self._journal = journal
        self._wait_s = max_group_wait_ms / 1000.0
        self._on_sync = on_sync
        self._on_durable = on_durable
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="quire-fsync")
        # (seq, callback, arg, weight): callback(arg, error); a tuple per
        # waiter, no closure (after_durable_with is the add path).  weight:
        # the adds it stands for (on_sync's count).
        self._waiters: deque[tuple[int, Callable[..., None], Any, int]] = deque()
        self._lazy: deque[tuple[int, Callable[[], None]]] = deque()
        """when_durable callbacks: released by fsyncs and checkpoints that
        happen anyway, never the cause of one."""
        self._durable_seq = -1
        self._syncing = False
        self._closed = False
        self.fsync_count = 0

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    def after_durable(self, seq: int, callback: DurableCallback) -> None:
        """Call ``callback(None)`` once journal ``seq`` is fsynced (at once if
        it already is), or ``callback(error)`` if the fsync fails."""
        self.after_durable_with(seq, _call_plain, callback)

    def when_durable(self, seq: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``seq`` is durable through an fsync or a
        checkpoint that happens for other reasons: this never causes an fsync
        (BP-14 sync cursors use it, so persisting a cursor cannot feed a loop
        of fsyncs).  Never called if the journal fails."""
        if seq <= self._durable_seq:
            callback()
            return
        self._lazy.append((seq, callback))

    def mark_durable(self, seq: int) -> None:
        """Records up to ``seq`` are durable by other means: a checkpoint
        wrote their effects (entries to fsynced entry logs, ledger states to
        the index) before the journal was fsynced.  Releases their waiters."""
        if seq <= self._durable_seq:
            return
        self._release(seq)

    def _release(self, durable: int) -> int:
        """Move the durable point to ``durable``; release what it covers;
        return the adds released."""
        self._durable_seq = max(self._durable_seq, durable)
        if self._on_durable is not None:
            self._on_durable(durable)
        released = 0
        waiters = self._waiters
        popleft = waiters.popleft
        while waiters and waiters[0][0] <= durable:
            _seq, callback, arg, weight = popleft()
            callback(arg, None)
            released += weight
        lazy = self._lazy
        while lazy and lazy[0][0] <= durable:
            lazy.popleft()[1]()
        return released

    def after_durable_with(self, seq: int, callback: Callable[[T, BaseException | None], None],
                           arg: T, weight: int = 1) -> None:
        """:meth:`after_durable` calling ``callback(arg, error)``: the waiter is
        a tuple, so the caller needs no closure per wait (the add path).  A
        waiter standing for several adds (a batch) gives their number as
        ``weight``, so that ``on_sync`` still counts adds released."""
        if seq <= self._durable_seq:
            callback(arg, None)
            return
        self._waiters.append((seq, callback, arg, weight))
        if not self._syncing:
            self._kick()

    async def wait_durable(self, seq: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        self.after_durable(seq, done)
        await future

    def _kick(self) -> None:
        if self._syncing or not self._waiters or self._closed:
            return
        self._syncing = True
        loop = asyncio.get_running_loop()
        if self._wait_s > 0:
            loop.call_later(self._wait_s, self._start_sync)
        else:
            # call_soon: adds decoded in this loop iteration still join.
            loop.call_soon(self._start_sync)

    def _start_sync(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        future = loop.run_in_executor(self._executor, self._journal.sync)
        future.add_done_callback(lambda f: self._on_synced(f, started))

    def _on_synced(self, future: asyncio.Future[int], started: float) -> None:
        self._syncing = False
        error = future.exception()
        if error is not None:
            waiters, self._waiters = self._waiters, deque()
            for _seq, callback, arg, _weight in waiters:
                callback(arg, error)
            return
        self.fsync_count += 1
        released = self._release(future.result())
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started, released)
        self._kick()

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True)
