"""A stream system of processes for Spark stream tests and benchmarks: the
bookies of a :class:`~tests.support.cluster.Cluster`, one segment store
process (``quire segmentstore start``) flushing to a ``file://`` tier-2, and
the controller process (``quire controller start``); plus helpers that
write and inspect streams from the test's process with Quire's own client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quire.metadata import open_store
from quire.sandbox import ControllerProcess, SegmentStoreProcess, free_port, tier1_quorums
from quire.segmentstore.ownership import read_assignment
from quire.segmentstore.tier2_reader import read_layout
from quire.streams import ControllerClient, RemoteSegmentStore, StreamWriter, controller_resolver
from quire.streams.model import segment_name
from quire.tier2 import SegmentLayout, open_chunk_storage

T = TypeVar("T")


def with_stream_clients(uri: str,
                        fn: Callable[[ControllerClient, RemoteSegmentStore], Awaitable[T]],
                        timeout_ms: int = 30_000) -> T:
    """``fn(controller, segments)`` with fresh clients of the controller at
    ``uri`` (calls time out after ``timeout_ms``), on a fresh loop."""
    async def go() -> T:
        controller = ControllerClient(uri, timeout_ms=timeout_ms)
        segments = RemoteSegmentStore(controller_resolver(controller))
        try:
            return await fn(controller, segments)
        finally:
            await segments.close()
            await controller.close()

    return asyncio.run(go())


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling the condition, with a deadline


@dataclass
class StreamStack:
    """The segment store and controller processes over a cluster's bookies."""

    root: Path
    metadata_uri: str
    store: SegmentStoreProcess
    controller: ControllerProcess
    tier2_uri: str

    @classmethod
    def start(cls, root: Path, metadata_uri: str, bookies: int = 3,
              controller_settings: dict[str, Any] | None = None,
              **store_settings: Any) -> StreamStack:
        tier2 = (root / "tier2").resolve()
        tier2.mkdir(parents=True, exist_ok=True)
        settings: dict[str, Any] = {"container_count": 2, "tail_read_wait_ms": 200,
                                    "rebalance_interval_ms": 100, "tier2_uri": tier2.as_uri(),
                                    **tier1_quorums(bookies), **store_settings}
        store = SegmentStoreProcess(root, metadata_uri, "ss-1", port=free_port(), **settings)
        controller = ControllerProcess(root, metadata_uri, **(controller_settings or {}))
        store.start()
        try:
            asyncio.run(wait_assigned(metadata_uri, settings["container_count"]))
            controller.start()
        except BaseException:
            store.stop()
            raise
        return cls(root, metadata_uri, store, controller, tier2.as_uri())

    @property
    def uri(self) -> str:
        return self.controller.uri

    def restart_store(self) -> None:
        self.store.start()
        asyncio.run(wait_assigned(self.metadata_uri, self.store.settings["container_count"]))

    def close(self) -> None:
        self.controller.stop()
        self.store.stop()

    # --- Quire's own stream client, from the test's process -----------------------------

    def run(self, fn: Callable[[ControllerClient, RemoteSegmentStore], Awaitable[T]]) -> T:
        """``fn(controller, segments)`` with fresh clients, on a fresh loop."""
        return with_stream_clients(self.uri, fn, timeout_ms=20_000)

    def create(self, scope: str, stream: str, segments: int) -> None:
        async def create(controller: ControllerClient, _s: RemoteSegmentStore) -> None:
            await controller.create_scope(scope)
            await controller.create_stream(scope, stream, segments)

        self.run(create)

    def write(self, scope: str, stream: str, events: Sequence[tuple[str, bytes]]) -> None:
        """Write ``(routing key, payload)`` events, each acknowledged."""
        async def write(controller: ControllerClient, segments: RemoteSegmentStore) -> None:
            writer = StreamWriter(controller, segments, scope, stream)
            await writer.start()
            try:
                await asyncio.gather(*(writer.write_event(data, routing_key=key)
                                       for key, data in events))
                await writer.flush()
            finally:
                await writer.close()

        self.run(write)

    def scale_first(self, scope: str, stream: str) -> list[int]:
        """Split the stream's first current segment in two; the new segments' ids."""
        async def scale(controller: ControllerClient, _s: RemoteSegmentStore) -> list[int]:
            first = (await controller.current_segments(scope, stream))[0]
            middle = (first.min_key + first.max_key) / 2
            epoch = await controller.scale(scope, stream, [first.id],
                                           [(first.min_key, middle), (middle, first.max_key)])
            async with asyncio.timeout(30):
                while not await controller.scale_done(scope, stream, epoch):
                    await asyncio.sleep(0.05)  # polling the scale's state, with a deadline
            current = await controller.current_segments(scope, stream)
            return sorted(s.id for s in current if s.epoch > first.epoch)

        return self.run(scale)

    def lengths(self, scope: str, stream: str, segment_ids: Sequence[int]) -> dict[int, int]:
        async def lengths(_c: ControllerClient, segments: RemoteSegmentStore
                          ) -> dict[int, int]:
            infos = await asyncio.gather(*(segments.get_info(segment_name(scope, stream, s))
                                           for s in segment_ids))
            return {s: i.length for s, i in zip(segment_ids, infos, strict=True)}

        return self.run(lengths)

    def layout(self, scope: str, stream: str, segment_id: int) -> SegmentLayout | None:
        async def layout() -> SegmentLayout | None:
            storage = await open_chunk_storage(self.tier2_uri)
            try:
                return await read_layout(storage, segment_name(scope, stream, segment_id))
            finally:
                await storage.close()

        return asyncio.run(layout())


async def wait_assigned(metadata_uri: str, containers: int) -> None:
    """Until every container has an owner (a condition with a deadline)."""
    store = await open_store(metadata_uri)
    try:
        async with asyncio.timeout(30):
            while True:
                assignment, _ = await read_assignment(store)
                if len(assignment) >= containers:
                    return
                await asyncio.sleep(0.05)  # polling the assignment, with a deadline
    finally:
        await store.close()
