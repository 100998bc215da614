"""One Quire client per Spark Python worker process.

Connections cannot be pickled, so data source objects carry only plain
options; the process that runs them (a planner worker on the driver, a task
worker on an executor) connects here.  :func:`runtime` returns the process's
:class:`Runtime`: a private event loop in a daemon thread with one
:class:`~quire.Client` per metadata URI, kept for the life of the process
(PySpark reuses Python workers across tasks, so later tasks skip the
connect).  A forked child gets its own runtime.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from quire.client import Client, ClientConfig
from quire.log import LogStore
from quire.loop_thread import LoopThread

T = TypeVar("T")


class Runtime(LoopThread):
    """An event loop thread and the clients connected on it."""

    def __init__(self) -> None:
        super().__init__("quire-spark-loop", "the Quire Spark runtime")
        self._clients: dict[tuple[str, ClientConfig], Client] = {}

    async def client(self, uri: str, config: ClientConfig | None = None) -> Client:
        """The connected client for ``uri`` and ``config`` (its TLS
        settings; call on the loop)."""
        key = (uri, config or ClientConfig())
        client = self._clients.get(key)
        if client is None:
            client = await Client.connect(uri, key[1])
            self._clients[key] = client
        return client

    def with_logs(self, uri: str, password: bytes,
                  fn: Callable[[LogStore], Awaitable[T]],
                  config: ClientConfig | None = None) -> T:
        """Run ``fn(LogStore(client for uri and config))`` on the loop and wait."""
        async def go() -> T:
            return await fn(LogStore(await self.client(uri, config), password=password))

        return self.run(go())


_lock = threading.Lock()
_runtime: tuple[int, Runtime] | None = None


def runtime() -> Runtime:
    """This process's runtime (created on first use, again after a fork)."""
    global _runtime
    with _lock:
        if _runtime is None or _runtime[0] != os.getpid():
            _runtime = (os.getpid(), Runtime())
        return _runtime[1]
