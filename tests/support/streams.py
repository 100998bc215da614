"""An in-process stream system for quire.streams tests: a SegmentStore
(in-memory tier-1 twin, or real bookies through a Client) served by a
SegmentServer on loopback, and a Controller whose own segment store is a
RemoteSegmentStore over that server's wire protocol, so the controller's
tables go through the stream client too."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from quire.client import Client
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.metadata import open_store
from quire.segmentserver import SegmentServer, SegmentServerConfig
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    SegmentClientConfig,
    StreamReader,
    controller_resolver,
)
from quire.testing.memory_data_log import MemoryDataLogs

CONTAINERS = 2
TAIL_WAIT_MS = 300
FAST_RETRY = SegmentClientConfig(retry_deadline_ms=5_000, retry_backoff_ms=5,
                                 connect_timeout_ms=2_000, request_timeout_ms=5_000)


async def read_all(controller: ControllerClient, segments: RemoteSegmentStore, scope: str,
                   stream: str) -> list[Any]:
    reader = StreamReader(controller, segments, scope, stream)
    return [e async for e in reader.events(follow=False)]


@dataclass
class StreamSystem:
    store: SegmentStore
    server: SegmentServer
    controller_store: RemoteSegmentStore
    controller: Controller
    clients: list[Any] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.server.host}:{self.server.port}"

    @property
    def controller_uri(self) -> str:
        return f"tcp://127.0.0.1:{self.controller.port}"

    def controller_client(self) -> ControllerClient:
        client = ControllerClient(self.controller_uri, timeout_ms=10_000)
        self.clients.append(client)
        return client

    def segments(self, controller: ControllerClient,
                 config: SegmentClientConfig | None = None) -> RemoteSegmentStore:
        segments = RemoteSegmentStore(controller_resolver(controller), config)
        self.clients.append(segments)
        return segments

    async def close(self) -> None:
        for client in reversed(self.clients):
            await client.close()
        await self.controller.close(0)
        await self.controller_store.close()
        await self.server.close()
        await self.store.close()


async def start_system(client: Client | None = None) -> StreamSystem:
    """The system on the in-memory tier-1 twin, or on ``client``'s bookies."""
    if client is None:
        logs = MemoryDataLogs()
        metadata = await open_store(f"memory://streams-{time.monotonic_ns()}")
        store = await SegmentStore.open(None, range(CONTAINERS), metadata_store=metadata,
                                        open_log=lambda c: logs.open(f"c{c}"),
                                        config=SegmentStoreConfig(container_count=CONTAINERS))
    else:
        store = await SegmentStore.open(client, range(CONTAINERS),
                                        config=SegmentStoreConfig(container_count=CONTAINERS))
    server = SegmentServer(store, SegmentServerConfig(tail_read_wait_ms=TAIL_WAIT_MS))
    await server.start("127.0.0.1", 0)
    address = f"{server.host}:{server.port}"

    async def resolve(_segment: str) -> str:
        return address
    controller_store = RemoteSegmentStore(resolve)
    controller = Controller(controller_store, ControllerConfig(),
                            fixed_locator((server.host, server.port)))
    await controller.start("127.0.0.1", 0)
    return StreamSystem(store, server, controller_store, controller)


class SystemThread:
    """A stream system on a loop of its own thread (for the CLI, which runs
    its own loop in the test's thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.system: StreamSystem = self.run(start_system)

    def run(self, factory: Callable[[], Awaitable[Any]]) -> Any:
        async def call() -> Any:
            return await factory()
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=30)

    def close(self) -> None:
        self.run(self.system.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


async def serve_until_stdin_closes() -> None:
    """``python -m tests.support.streams``: a stream system on the in-memory
    twin, its controller URI printed as one line, until stdin closes (for
    clients that must not share the servers' process, like the Pravega
    client, whose blocking calls hold the GIL)."""
    system = await start_system()
    print(system.controller_uri, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await system.close()


if __name__ == "__main__":
    asyncio.run(serve_until_stdin_closes())
