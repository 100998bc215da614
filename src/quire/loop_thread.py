"""An asyncio event loop (uvloop) running forever in a daemon thread, for
blocking callers: :class:`~quire.client.SyncClient` and the Spark
runtime each own one.

Other threads hand it coroutines (:meth:`LoopThread.submit`,
:meth:`LoopThread.run`); the loop's own thread may not, since it would wait
for itself.

This module imports nothing from the rest of Quire: every layer may use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A new event loop, run forever by a daemon thread called ``name``.
    ``owner`` names its user in the error a call from the loop thread raises."""

    def __init__(self, name: str, owner: str) -> None:
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self.loop = asyncio.new_event_loop()
        self._owner = owner
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its result as a concurrent future.
        RuntimeError (and ``coro`` closed) when called on the loop's thread."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"{self._owner} cannot be called from its own loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        return self.submit(coro).result()

    def stop(self) -> None:
        """Stop the loop, wait for its thread, close the loop."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
