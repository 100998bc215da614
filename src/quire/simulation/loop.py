"""A deterministic asyncio event loop on virtual time.

:class:`SimLoop` is a plain :class:`asyncio.BaseEventLoop` whose clock is a
number it owns and whose "select" never blocks: when nothing is ready it
jumps the clock to the next timer.  Callbacks run in the order asyncio
gives them (ready queue, then timers by deadline; equal deadlines in the
order the timer heap's contents give them, not always the order they were
scheduled), so one seed and one program give one run.

There is no self-pipe, no selector and no thread pool:

* ``call_soon_threadsafe`` is ``call_soon`` (nothing runs on another thread);
* ``run_in_executor`` (and so :func:`asyncio.to_thread`) runs the function
  inline and returns a finished future: the storage engine's checkpoint,
  which a bookie runs on a thread, runs on the loop in zero virtual time;
* ``create_connection`` connects through the :class:`~quire.simulation.network.SimNetwork`
  given at construction (``host:port`` names a simulated listener).

A loop with nothing ready and no timer can never make progress again:
:class:`SimDeadlock` is raised from ``run_until_complete``.

With :meth:`SimLoop.track_tasks`, every task is recorded under the node and
life it was created in (``current_node``, ``current_life``), so that a
process's crash (:meth:`SimLoop.kill`) stops all of it at once: its tasks
are cancelled, its pending callbacks and timers dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import heapq
import math
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from quire.simulation.network import current_life, current_node

if TYPE_CHECKING:
    from quire.simulation.network import SimNetwork

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
P = TypeVar("P", bound=asyncio.BaseProtocol)


class SimDeadlock(RuntimeError):
    """Nothing is ready and no timer is scheduled: the run is stuck."""


class _VirtualSelector:
    """The loop's "selector": no I/O ever, time jumps to the next timer."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimDeadlock("nothing ready and no timer: every task waits forever")
        loop = self._loop
        if loop.exact_timers:
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            if scheduled and not loop._ready and not loop._stopping:  # type: ignore[attr-defined]
                # just past the first deadline: it (and whatever is due with it) runs next
                loop.advance_to(math.nextafter(scheduled[0]._when, math.inf))
        elif timeout > 0:
            loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """See the module docstring.  ``network`` serves ``create_connection``."""

    def __init__(self, network: SimNetwork | None = None, *, start_s: float = 0.0,
                 exact_timers: bool = False) -> None:
        super().__init__()
        self._now_s = start_s
        self._alarm: tuple[float, Callable[[], object]] | None = None
        self._selector = _VirtualSelector(self)
        self.exact_timers = exact_timers
        """A timer fires when the clock reaches its deadline exactly (the
        clock jumps there), never a hair early: code that loops until
        ``deadline - loop.time()`` is not positive (as it may on a real
        clock, which moves by itself) then ends.  The ledger layer keeps the
        first version's 1 ns resolution, which its stored seeds replay with."""
        self._clock_resolution = 0.0 if exact_timers else 1e-9
        self.network = network
        self._tasks_of: dict[tuple[str, int],
                             weakref.WeakValueDictionary[int, asyncio.Task[Any]]] | None = None
        """(node, life) -> its tasks by creation number (in creation order: a
        set's order would follow the tasks' addresses, which differ from run
        to run)."""
        self._created = 0
        self._life_of: dict[int, tuple[str, int]] = {}
        """id of a task -> its node and life (by id: a task is asked about from
        its finalizer, when no weak reference finds it any more; an id reused
        by a later task is overwritten when that task is created)."""

    # --- processes ------------------------------------------------------------------

    def track_tasks(self) -> None:
        """Record each task's node and life from now on (see :meth:`kill`)."""
        self._tasks_of = {}

    def create_task(self, coro: Generator[Any, None, T] | Coroutine[Any, Any, T], *,
                    name: object = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        tasks_of = self._tasks_of
        if tasks_of is not None:
            key = (current_node.get(), current_life.get()) if context is None else \
                (context.get(current_node, "?"), context.get(current_life, 0))
            if self.network is not None and key[1] != self.network.life_of(key[0]):
                task.cancel()  # spawned by a dead life's cleanup: it never runs
                return task
            found = tasks_of.get(key)
            if found is None:
                found = tasks_of[key] = weakref.WeakValueDictionary()
            self._created += 1
            found[self._created] = task
            self._life_of[id(task)] = key
        return task

    def of_dead_life(self, task: object) -> bool:
        """Whether ``task`` was created by a life that has ended since (what
        it does, or fails to do, is no process's any more)."""
        key = self._life_of.get(id(task)) if isinstance(task, asyncio.Task) else None
        return key is not None and self.network is not None \
            and key[1] != self.network.life_of(key[0])

    def kill(self, node: str, life: int) -> int:
        """Life ``life`` of ``node`` crashed: drop its timers (timeouts,
        retries, delayed work; network deliveries are the network's to
        drop), then cancel its tasks (a sleeping one wakes up cancelled).
        Callbacks already due run (a task's wake-up among them, which a
        cancelled task needs to end).  Returns how many tasks were cancelled."""
        for handle in self._scheduled:  # type: ignore[attr-defined]
            context = handle._context
            if context is not None and context.get(current_node, "?") == node \
                    and context.get(current_life, 0) == life \
                    and getattr(handle._callback, "__self__", None) is not self.network:
                handle.cancel()
        tasks = self._tasks_of.pop((node, life), None) if self._tasks_of is not None else None
        cancelled = 0
        for task in list(tasks.values()) if tasks is not None else []:
            if not task.done():
                task.cancel()
                cancelled += 1
        return cancelled

    # --- the clock ------------------------------------------------------------------

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does, when idle)."""
        self.advance_to(self._now_s + seconds)

    def advance_to(self, when: float) -> None:
        self._now_s = max(self._now_s, when)
        if self._alarm is not None and self._now_s >= self._alarm[0]:
            callback, self._alarm = self._alarm[1], None
            self.call_soon(callback)

    def alarm_at(self, when_s: float, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the clock passes ``when_s``.  Unlike a
        timer, it never enters the timer heap, whose order of equal
        deadlines follows its contents: a run that ends before ``when_s``
        has the schedule it would have without the alarm."""
        self._alarm = (when_s, callback)

    def cancel_alarm(self) -> None:
        self._alarm = None

    def jump_clock(self, node: str, seconds: float) -> int:
        """Node ``node``'s clock jumps ``seconds`` ahead: each of its timers
        (those scheduled in its context: timeouts, sleeps, retries) falls
        due up to ``seconds`` earlier, never before now, while the rest of
        the cluster (and the network's deliveries, which belong to no
        node's clock) keeps its time.  One loop clock cannot run at two
        speeds; moving the node's deadlines is what a jump does to it.
        Returns how many timers moved."""
        now = self._now_s
        return self._move_timers(node, lambda when: max(now, when - seconds))

    def hold_timers(self, node: str, seconds: float) -> int:
        """Node ``node`` hangs for ``seconds`` (a stopped process): none of
        its timers fires before then (with the network's pause of the
        node, nothing of it runs).  Returns how many timers moved."""
        until = self._now_s + seconds
        return self._move_timers(node, lambda when: max(until, when))

    def _move_timers(self, node: str, new_when: Callable[[float], float]) -> int:
        moved = 0
        for handle in self._scheduled:  # type: ignore[attr-defined]
            context = handle._context  # (asyncio's: the context the timer runs in)
            if handle.cancelled() or context is None or context.get(current_node) != node:
                continue
            if getattr(handle._callback, "__self__", None) is self.network:
                continue
            handle._when = new_when(handle._when)
            moved += 1
        heapq.heapify(self._scheduled)  # type: ignore[attr-defined]
        return moved

    # --- what BaseEventLoop leaves to its subclasses --------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def call_soon_threadsafe(self, callback: Callable[[*Ts], object], *args: *Ts,
                             context: contextvars.Context | None = None) -> asyncio.Handle:
        return self.call_soon(callback, *args, context=context)

    def run_in_executor(self, executor: concurrent.futures.Executor | None,
                        func: Callable[[*Ts], T], *args: *Ts) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as e:  # handed to the awaiting task, as a pool would
            future.set_exception(e)
        return future

    async def create_connection(
            self, protocol_factory: Callable[[], P], host: str | None = None,
            port: int | None = None, **_kwargs: Any) -> tuple[asyncio.Transport, P]:
        if self.network is None:
            raise ConnectionRefusedError("this simulation has no network")
        return await self.network.connect(protocol_factory, f"{host}:{port}")


class VirtualClock:
    """A :class:`~quire.clock.Clock` on the loop's virtual time: wall time
    ``start_ms`` at loop time 0, plus ``offset_ms`` (a node whose clock
    jumped)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, start_ms: int = 1_700_000_000_000,
                 offset_ms: int = 0) -> None:
        self._loop = loop
        self.start_ms = start_ms
        self.offset_ms = offset_ms

    def wall_ms(self) -> int:
        return self.start_ms + self.offset_ms + int(self._loop.time() * 1000)
