"""A controller and a segment server in one process, for tests with the real
Pravega client (whose blocking calls hold the GIL, so it cannot share a
process with the servers it calls).

``python -m tests.support.pravega_stack [tail_read_wait_ms]``: a SegmentStore
on the in-memory tier-1 twin (2 containers), served by a SegmentServer and a
Controller on loopback; prints one JSON line ``{"controller": port,
"segments": port}``, then serves until stdin closes.  A line ``drop`` on
stdin drops every segment server connection (answered ``{"dropped": n}``)."""

from __future__ import annotations

import asyncio
import json
import sys

from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.metadata import open_store
from quire.segmentserver import SegmentServer, SegmentServerConfig
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.testing.memory_data_log import MemoryDataLogs


async def serve(tail_read_wait_ms: int) -> None:
    logs = MemoryDataLogs()
    metadata = await open_store("memory://pravega-stack")
    store = await SegmentStore.open(None, range(2), metadata_store=metadata,
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=2))
    server = SegmentServer(store, SegmentServerConfig(tail_read_wait_ms=tail_read_wait_ms))
    await server.start("127.0.0.1", 0)
    controller = Controller(store, ControllerConfig(),
                            fixed_locator(("127.0.0.1", server.port)))
    port = await controller.start("127.0.0.1", 0)
    print(json.dumps({"controller": port, "segments": server.port}), flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):  # until stdin closes
            if line.strip() == "drop":
                print(json.dumps({"dropped": server.abort_connections()}), flush=True)
    finally:
        await controller.close()
        await server.close()
        await store.close()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
