"""A deterministic asyncio event loop on virtual time.

:class:`SimLoop` is a plain :class:`asyncio.BaseEventLoop` whose clock is a
number it owns and whose "select" never blocks: when nothing is ready it
jumps the clock to the next timer.  Callbacks run in the order asyncio
gives them (ready queue, then timers by deadline, ties in the order they
were scheduled), so one seed and one program give one run.

There is no self-pipe, no selector and no thread pool:

* ``call_soon_threadsafe`` is ``call_soon`` (nothing runs on another thread);
* ``run_in_executor`` (and so :func:`asyncio.to_thread`) runs the function
  inline and returns a finished future: the storage engine's checkpoint,
  which a bookie runs on a thread, runs on the loop in zero virtual time;
* ``create_connection`` connects through the :class:`~quire.simulation.network.SimNetwork`
  given at construction (``host:port`` names a simulated listener).

A loop with nothing ready and no timer can never make progress again:
:class:`SimDeadlock` is raised from ``run_until_complete``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

from quire.simulation.network import current_node

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
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


class SimLoop(asyncio.BaseEventLoop):
    """See the module docstring.  ``network`` serves ``create_connection``."""

    def __init__(self, network: SimNetwork | None = None, *, start_s: float = 0.0) -> None:
        super().__init__()
        self._now_s = start_s
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9
        self.network = network

    # --- the clock ------------------------------------------------------------------

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (the selector does, when idle)."""
        self._now_s += seconds

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
