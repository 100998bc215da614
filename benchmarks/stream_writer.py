"""Quire's own stream writer and reader (quire.streams) on real bookies.

Starts 3 bookie processes (E=3 W=3 A=2) on a temporary SQLite metadata
store and, in a child process, a segment store (4 containers) with its wire
server and the controller; then, in this process, a StreamWriter writes
``--events`` events of ``--size`` bytes with routing keys to a stream of
``--segments`` segments, keeping ``--outstanding`` unacknowledged, and a
StreamReader reads them all back from the head.  Prints events/s, MB/s and
the p50/p99 of the time from ``write_event`` to its acknowledgement, and
the read rate.

    .venv/bin/python benchmarks/stream_writer.py [--events 50000] [--size 100]
        [--segments 3] [--outstanding 1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from quire.client import Client
from quire.controller import Controller, ControllerConfig, fixed_locator
from quire.sandbox import BookieProcess, sqlite_uri, start_all, stop_all
from quire.segmentserver import SegmentServer
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    StreamReader,
    StreamWriter,
    controller_resolver,
)

CONTAINERS = 4


async def serve(metadata_uri: str) -> None:
    """The child: segment store, wire server and controller until stdin closes."""
    client = await Client.connect(metadata_uri)
    store = await SegmentStore.open(client, range(CONTAINERS),
                                    config=SegmentStoreConfig(container_count=CONTAINERS))
    server = SegmentServer(store)
    await server.start("127.0.0.1", 0)
    controller = Controller(store, ControllerConfig(), fixed_locator((server.host, server.port)))
    port = await controller.start("127.0.0.1", 0)
    print(f"tcp://127.0.0.1:{port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await controller.close()
    await server.close()
    await store.close()
    await client.close()


async def measure(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    controller = ControllerClient(uri)
    segments = RemoteSegmentStore(controller_resolver(controller))
    await controller.create_scope("bench")
    await controller.create_stream("bench", "events", args.segments)
    writer = StreamWriter(controller, segments, "bench", "events")
    await writer.start()
    payload = b"x" * args.size
    window = asyncio.Semaphore(args.outstanding)
    latencies: list[float] = []

    def acked(t0: float, _future: asyncio.Future[None]) -> None:
        latencies.append(time.perf_counter() - t0)
        window.release()

    start = time.perf_counter()
    for i in range(args.events):
        await window.acquire()
        t0 = time.perf_counter()
        writer.write_event(payload, f"key-{i % 1000}").add_done_callback(
            lambda f, t0=t0: acked(t0, f))
    await writer.flush()
    write_s = time.perf_counter() - start
    await writer.close()

    start = time.perf_counter()
    read = 0
    async for _event in StreamReader(controller, segments, "bench", "events").events():
        read += 1
    read_s = time.perf_counter() - start
    await segments.close()
    await controller.close()
    if read != args.events:
        raise SystemExit(f"read {read} events of {args.events}")
    latencies.sort()
    return {"events": args.events, "size": args.size, "segments": args.segments,
            "outstanding": args.outstanding,
            "write_events_per_s": args.events / write_s,
            "write_mb_per_s": args.events * args.size / write_s / 1e6,
            "ack_p50_ms": statistics.median(latencies) * 1000,
            "ack_p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
            "read_events_per_s": read / read_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--outstanding", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", metavar="METADATA_URI", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve(args.serve))
        return
    with tempfile.TemporaryDirectory(prefix="quire-stream-bench-") as tmp:
        root = Path(tmp)
        uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, uri, f"bench-{i}", port=0) for i in range(3)]
        start_all(bookies)
        servers = subprocess.Popen([sys.executable, __file__, "--serve", uri],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert servers.stdout is not None and servers.stdin is not None
            controller_uri = servers.stdout.readline().strip()
            results = uvloop.run(measure(controller_uri, args))
        finally:
            if servers.stdin is not None:
                servers.stdin.close()
            servers.wait(30)
            stop_all(bookies)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['events']} events of {results['size']} B, {results['segments']} segments, "
          f"{results['outstanding']} outstanding, E=3 W=3 A=2, 3 bookie processes, segment "
          "store and controller in one process, writer in another, on this machine")
    print(f"write: {results['write_events_per_s']:,.0f} events/s "
          f"({results['write_mb_per_s']:.1f} MB/s), ack p50 {results['ack_p50_ms']:.1f} ms "
          f"p99 {results['ack_p99_ms']:.1f} ms")
    print(f"read from the head: {results['read_events_per_s']:,.0f} events/s")


if __name__ == "__main__":
    main()
