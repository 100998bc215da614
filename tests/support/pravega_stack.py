"""A controller and a segment server in one process, for tests with the real
Pravega client (whose blocking calls hold the GIL, so it cannot share a
process with the servers it calls).

``python -m tests.support.pravega_stack [tail_read_wait_ms] [--cut-ack N]
[--autoscale-s N] [--retention-ms N]``: a SegmentStore on the in-memory
tier-1 twin (2 containers), served by a SegmentServer and a Controller on
loopback; prints one JSON line ``{"controller": port, "segments": port}``,
then serves until stdin closes.  With ``--autoscale-s N`` the store reports
hot and cold segments with windows, cooldown and mute of N seconds (and
the controller acts on them every 100 ms); ``--retention-ms`` sets the
retention interval.
With ``--cut-ack N`` the controller's getURI answers an
:class:`~tests.support.ack_cutting_proxy.AckCuttingProxy` in front of the
segment server, which drops the connection carrying the N-th append
acknowledgement (once); the JSON line then also holds ``"proxy": port``, and
a line ``{"cuts": count, "acks": count}`` is printed on exit.  A line
``drop`` on stdin drops every segment server connection (answered
``{"dropped": n}``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from quire.clock import SYSTEM_CLOCK
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.metadata import open_store
from quire.segmentserver import SegmentServer, SegmentServerConfig
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.segmentstore.scale_requests import AutoScaleReporter, ScaleRequests
from quire.segmentstore.segment_rates import AutoScalerConfig
from quire.testing.memory_data_log import MemoryDataLogs
from tests.support.ack_cutting_proxy import AckCuttingProxy


async def serve(tail_read_wait_ms: int, cut_ack: int | None, autoscale_s: int | None,
                retention_ms: int) -> None:
    logs = MemoryDataLogs()
    metadata = await open_store("memory://pravega-stack")
    store = await SegmentStore.open(None, range(2), metadata_store=metadata,
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=2))
    server = SegmentServer(store, SegmentServerConfig(tail_read_wait_ms=tail_read_wait_ms))
    await server.start("127.0.0.1", 0)
    ports = {"segments": server.port}
    proxy = None
    if cut_ack is not None:
        proxy = AckCuttingProxy(("127.0.0.1", server.port), cut_ack)
        ports["proxy"] = await proxy.start()
    requests = ScaleRequests(metadata)
    reporter = None
    if autoscale_s is not None:
        reporter = AutoScaleReporter(lambda: [store.container(c) for c in store.container_ids],
                                     requests, AutoScalerConfig.every(autoscale_s),
                                     SYSTEM_CLOCK.wall_ms)
        reporter.start()
    controller = Controller(store, ControllerConfig(autoscale_interval_ms=100,
                                                    retention_interval_ms=retention_ms),
                            fixed_locator(("127.0.0.1", ports.get("proxy", server.port))),
                            requests=requests)
    ports["controller"] = await controller.start("127.0.0.1", 0)
    print(json.dumps(ports), flush=True)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):  # until stdin closes
            if line.strip() == "drop":
                print(json.dumps({"dropped": server.abort_connections()}), flush=True)
    finally:
        if proxy is not None:
            await proxy.close()
            print(json.dumps({"cuts": proxy.cuts, "acks": proxy.acks_seen}), flush=True)
        await controller.close()
        if reporter is not None:
            await reporter.close()
        await server.close()
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("tail_read_wait_ms", type=int, nargs="?", default=1000)
    parser.add_argument("--cut-ack", type=int, default=None)
    parser.add_argument("--autoscale-s", type=int, default=None)
    parser.add_argument("--retention-ms", type=int, default=60_000)
    args = parser.parse_args()
    asyncio.run(serve(args.tail_read_wait_ms, args.cut_ack, args.autoscale_s, args.retention_ms))
