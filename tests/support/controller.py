"""A controller on loopback over an in-process SegmentStore on the in-memory
tier-1 log twin, for the controller's tests."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc

from quire.clock import SYSTEM_CLOCK
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.controller_api.Controller_pb2_grpc import ControllerServiceStub
from quire.errors import ContainerClosedError
from quire.metadata import MetadataStore, open_store
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.testing.memory_data_log import MemoryDataLogs

CONTAINERS = 2
URI = ("segments.example", 12345)


class Faulty:
    """The segment store as the controller's seam, where the n-th next call
    of a method can be made to fail as an unavailable container does (its
    outcome unknown), leaving the controller's work half done."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self.fail_at: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name not in self.fail_at:
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            self.fail_at[name] -= 1
            if self.fail_at[name] == 0:
                del self.fail_at[name]
                raise ContainerClosedError(f"injected: {name}{args}")
            return method(*args, **kwargs)
        return call


@dataclass
class Cluster:
    logs: MemoryDataLogs
    metadata: MetadataStore
    config: ControllerConfig
    store: SegmentStore | None = None
    faulty: Faulty | None = None
    now_ms: int | None = None
    """The controller's clock when set (the wall clock otherwise)."""
    controller: Controller | None = None
    channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self.store = await SegmentStore.open(
            None, range(CONTAINERS), metadata_store=self.metadata,
            open_log=lambda c: self.logs.open(f"c{c}"),
            config=SegmentStoreConfig(container_count=CONTAINERS))
        self.faulty = Faulty(self.store)
        self.controller = Controller(self.faulty, self.config, fixed_locator(URI), self)
        port = await self.controller.start("127.0.0.1", 0)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    def wall_ms(self) -> int:
        """The controller's clock (a :class:`~quire.clock.Clock`)."""
        return SYSTEM_CLOCK.wall_ms() if self.now_ms is None else self.now_ms

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.controller is not None:
            await self.controller.close()
        if self.store is not None:
            await self.store.close()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def stub(self) -> Any:
        return ControllerServiceStub(self.channel)

    @property
    def segments(self) -> SegmentStore:
        assert self.store is not None
        return self.store


async def make_cluster(**config: int) -> Cluster:
    metadata = await open_store(f"memory://controller-{time.monotonic_ns()}")
    cluster = Cluster(MemoryDataLogs(), metadata, ControllerConfig(**config))
    await cluster.start()
    return cluster


