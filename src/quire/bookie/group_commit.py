"""Group commit: many journal appends, one fsync, on the loop or on one thread.

Adds append to the journal's buffer on the event-loop thread and register a
callback for their journal sequence number.  Whoever syncs writes and fsyncs
everything appended so far, so adds that arrive while one fsync runs join
the next one: natural batching with no timer.  Two places can sync:

* The event loop itself, once per loop iteration in which a waiter asked
  for more, while the journal's fsyncs are fast: their moving average is
  below ``loop_sync_max_ms``.  The loop blocks for the fsync, and adds that
  arrive meanwhile wait in the socket and make the next group.  This saves
  every hand-over of the thread below (a futex wake, a thread switch, the
  GIL, a wake-up of the loop) on each group; ARCHITECTURE.md has what that
  was worth.
* The ``quire-fsync`` thread, like BookKeeper's force-write thread, when
  fsyncs are slow (a loop blocked for each of them would hold up reads and
  fencing as long), when ``loop_sync_max_ms`` is 0, or when
  ``max_group_wait_ms`` asks for a wait to gather more.  While any waiter
  needs a record that is not yet durable it syncs, hands the new durable
  point to the loop, and goes straight on to the next fsync, so the loop
  being busy never holds the next fsync back (an earlier design started
  each fsync from the loop on a thread, so every fsync waited for the loop
  to finish the batch in hand: 1.7 ms cycles around 0.3 ms fsyncs).

Every sync, on either path, feeds the moving average, so a bookie moves to
the thread when its disk slows down and back when it recovers; the loop
never syncs while the thread does.

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
from typing import Any, TypeVar

from quire.bookie.storage.seams import SyncableJournal

DurableCallback = Callable[[BaseException | None], None]
T = TypeVar("T")


def _call_plain(callback: DurableCallback, error: BaseException | None) -> None:
    """The waiter callback of :meth:`GroupCommitter.after_durable`."""
    callback(error)

SYNC_AVERAGE_WEIGHT = 0.05
"""Weight of the latest sync in the moving average of sync durations."""
SyncObserver = Callable[[float, int], None]
"""Called after each fsync with (seconds taken, callbacks released)."""
DurableHook = Callable[[int], None]
"""Called with the new durable seq after each fsync, before any callback."""


class GroupCommitter:
    """Durable-point bookkeeping (loop thread) over syncs on the loop or on
    one fsync thread (see the module docstring for which).

    Every method is called on the event loop's thread; the fsync thread only
    reads ``_wanted_seq`` and ``_durable_seq`` and posts results back with
    ``call_soon_threadsafe``.  Create it inside the running loop.
    ``loop_sync_max_ms`` 0 (the default here) keeps every sync on the thread."""

    def __init__(self, journal: SyncableJournal, *, max_group_wait_ms: float = 0.0,
                 loop_sync_max_ms: float = 0.0) -> None:
        self._journal = journal
        self._wait_s = max_group_wait_ms / 1000.0
        self._loop_sync_max_s = loop_sync_max_ms / 1000.0 if self._wait_s <= 0 else 0.0
        """Sync on the loop while the average sync is shorter (0: never)."""
        self._sync_average_s = 0.0
        """Moving average of sync durations, both paths (loop thread)."""
        self._loop_sync_scheduled = False
        self._thread_busy = False
        """Set by the fsync thread from its wake-up until it waits again."""
        self._on_sync: SyncObserver | None = None
        self._on_durable: DurableHook | None = None
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
        self.loop_sync_count = 0
        """Of ``fsync_count``, the syncs the loop ran itself."""
        self._thread: threading.Thread | None = None
        """Started by the first sync that needs it: a committer whose syncs
        all run on the loop (the simulation's) never starts one."""

    def observe(self, *, on_sync: SyncObserver | None = None,
                on_durable: DurableHook | None = None) -> None:
        """Set the hooks of whoever serves over this committer (the bookie
        server, which is built after it): ``on_durable`` with each new
        durable point before any callback, ``on_sync`` after each fsync's
        callbacks ran.  Call it before the first add."""
        self._on_sync = on_sync
        self._on_durable = on_durable

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    @property
    def syncs_on_loop(self) -> bool:
        """Whether the next sync asked for runs on the loop (else the thread)."""
        return self._sync_average_s < self._loop_sync_max_s and not self._thread_busy

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
            if not self.syncs_on_loop:
                self._wake_thread()
            elif not self._loop_sync_scheduled:
                self._loop_sync_scheduled = True
                self._loop.call_soon(self._sync_on_loop)

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

    # --- syncing on the loop -----------------------------------------------------

    def _sync_on_loop(self) -> None:
        """One sync covering every waiter of this loop iteration (called
        soon after the first of them asked)."""
        self._loop_sync_scheduled = False
        if self._closed or self._wanted_seq <= self._durable_seq:
            return
        if self._thread_busy:  # (it moved to the thread meanwhile) never both at once
            self._wake_thread()
            return
        started = time.perf_counter()
        try:
            synced = self._journal.sync()
        except Exception as e:  # handed to the waiters, as the thread does
            self._on_failed(e)
            return
        self.loop_sync_count += 1
        self._on_synced(synced, time.perf_counter() - started)

    # --- the fsync thread -----------------------------------------------------

    def _wake_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="quire-fsync", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        synced = -1
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            if self._closed:
                return
            self._thread_busy = True
            if self._wait_s > 0:
                time.sleep(self._wait_s)
            # Sync until no waiter needs more: each sync covers everything
            # appended before it started, so a burst needs one or two.
            while self._wanted_seq > max(synced, self._durable_seq) and not self._closed:
                started = time.perf_counter()
                try:
                    synced = self._journal.sync()
                except BaseException as e:  # handed to the waiters
                    self._post(self._on_failed, e)
                    break
                self._post(self._on_synced, synced, time.perf_counter() - started)
            self._thread_busy = False

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)

    def _on_synced(self, durable: int, seconds: float) -> None:
        self.fsync_count += 1
        self._sync_average_s += (seconds - self._sync_average_s) * SYNC_AVERAGE_WEIGHT
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
        if self._thread is not None:
            self._thread.join()
