"""Group commit: many journal appends, one fsync, on one dedicated thread.

Adds append to the journal's buffer on the event-loop thread and register a
callback for their journal sequence number.  The ``quire-fsync`` thread runs
on its own, like BookKeeper's force-write thread: while any waiter needs a
record that is not yet durable it writes and fsyncs everything appended so
far, hands the new durable point to the loop, and goes straight on to the
next fsync; adds that arrive while one runs join the next one.  Under load
that gives natural batching with no timer, and the loop being busy never
holds the next fsync back (an earlier design started each fsync from the
loop, so every fsync waited for the loop to finish the batch in hand:
1.7 ms cycles around 0.3 ms fsyncs).  ``max_group_wait_ms`` adds an
optional wait to gather more.

A failed fsync leaves durability unknown: the waiting callbacks get the
exception (the server answers IO_ERROR and turns read-only), never an OK.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
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
    """Durable-point bookkeeping (loop thread) over one fsync thread.

    Every method is called on the event loop's thread; the fsync thread only
    reads ``_wanted_seq`` and posts results back with
    ``call_soon_threadsafe``.  Create it inside the running loop."""

    def __init__(self, journal: SyncableJournal, *, max_group_wait_ms: float = 0.0,
                 on_sync: SyncObserver | None = None,
                 on_durable: DurableHook | None = None) -> None:
        self._journal = journal
        self._wait_s = max_group_wait_ms / 1000.0
        self._on_sync = on_sync
        self._on_durable = on_durable
        self._loop = asyncio.get_running_loop()
        # (seq, callback, arg, weight): callback(arg, error); a tuple per
        # waiter, no closure (after_durable_with is the add path).  weight:
        # the adds it stands for (on_sync's count).
        self._waiters: deque[tuple[int, Callable[..., None], Any, int]] = deque()
        self._lazy: deque[tuple[int, Callable[[], None]]] = deque()
        """when_durable callbacks: released by fsyncs and checkpoints that
        happen anyway, never the cause of one."""
        self._durable_seq = -1
        self._wanted_seq = -1
        """Highest seq a waiter needs (written by the loop, read by the thread)."""
        self._wake = threading.Event()
        self._closed = False
        self.fsync_count = 0
        self._thread = threading.Thread(target=self._run, name="quire-fsync", daemon=True)
        self._thread.start()

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
        if durable > self._durable_seq:
            self._durable_seq = durable
        durable = self._durable_seq
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
        if seq > self._wanted_seq:
            self._wanted_seq = seq
            self._wake.set()

    async def wait_durable(self, seq: int) -> None:
        future: asyncio.Future[None] = self._loop.create_future()

        def done(error: BaseException | None) -> None:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

        self.after_durable(seq, done)
        await future

    # --- the fsync thread -----------------------------------------------------

    def _run(self) -> None:
        synced = -1
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            if self._closed:
                return
            if self._wait_s > 0:
                time.sleep(self._wait_s)
            # Sync until no waiter needs more: each sync covers everything
            # appended before it started, so a burst needs one or two.
            while self._wanted_seq > synced and not self._closed:
                started = time.perf_counter()
                try:
                    synced = self._journal.sync()
                except BaseException as e:  # handed to the waiters
                    self._post(self._on_failed, e)
                    break
                self._post(self._on_synced, synced, time.perf_counter() - started)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def _on_synced(self, durable: int, seconds: float) -> None:
        self.fsync_count += 1
        released = self._release(durable)
        if self._on_sync is not None:
            self._on_sync(seconds, released)

    def _on_failed(self, error: BaseException) -> None:
        """Durability of every waiting record is unknown: fail them all (the
        journal refuses further use, so later waiters fail the same way)."""
        waiters, self._waiters = self._waiters, deque()
        self._wanted_seq = self._durable_seq
        for _seq, callback, arg, _weight in waiters:
            callback(arg, error)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join()
