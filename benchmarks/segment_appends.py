"""Segment store appends against raw ledger appends, in the same run.

Starts 3 bookie processes on a temporary SQLite metadata store, then writes
the same payloads with 256 outstanding (E=3 W=3 A=2) three ways: raw
``ledger.append`` (one entry each), ``SegmentStore.append`` of single
100 B events to one segment of one container (frames pack many per entry),
and appends of blocks of 100 events of 100 B (as the Pravega client sends
them), counted in events.  Prints appends/s, events/s, MB/s, p50/p99.

    .venv/bin/python benchmarks/segment_appends.py [--appends 30000] [--outstanding 256]
        [--event-bytes 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from quire.client import Client
from quire.sandbox import BookieProcess, sqlite_uri
from quire.segmentstore import SegmentStore, SegmentStoreConfig


async def drive(call: Callable[[int], asyncio.Future[Any]], count: int, outstanding: int
                ) -> dict[str, float]:
    """``call(i)`` for i < count with ``outstanding`` in flight; rate and latencies."""
    window = asyncio.Semaphore(outstanding)
    latencies: list[float] = []
    failures: list[BaseException] = []
    done = asyncio.get_running_loop().create_future()

    def finished(t0: float, future: asyncio.Future[Any]) -> None:
        latencies.append(time.perf_counter() - t0)
        window.release()
        if future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]
        if len(latencies) == count and not done.done():
            done.set_result(None)

    start = time.perf_counter()
    for i in range(count):
        await window.acquire()
        t0 = time.perf_counter()
        call(i).add_done_callback(lambda f, t0=t0: finished(t0, f))
    await done
    seconds = time.perf_counter() - start
    if failures:
        raise failures[0]
    latencies.sort()
    return {"per_s": count / seconds, "seconds": seconds,
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000}


async def run(uri: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    client = await Client.connect(uri)
    event = b"e" * args.event_bytes
    block = event * 100
    results = []
    try:
        ledger = await client.create_ledger(3, 3, 2, password=b"bench")
        raw = await drive(lambda i: ledger.append(event), args.appends, args.outstanding)
        await ledger.close()
        results.append({"what": f"raw ledger.append, {args.event_bytes} B", **raw,
                        "events_per_s": raw["per_s"],
                        "mb_per_s": raw["per_s"] * args.event_bytes / 1e6})
        store = await SegmentStore.open(client, [0], config=SegmentStoreConfig(container_count=1))
        try:
            await store.create_segment("bench/single/0")
            single = await drive(lambda i: store.append("bench/single/0", event),
                                 args.appends, args.outstanding)
            results.append({"what": f"segment append, 1 event of {args.event_bytes} B", **single,
                            "events_per_s": single["per_s"],
                            "mb_per_s": single["per_s"] * args.event_bytes / 1e6})
            await store.create_segment("bench/blocks/0")
            blocks = max(1, args.appends // 20)
            grouped = await drive(
                lambda i: store.append("bench/blocks/0", block, writer=(1, i)),
                blocks, args.outstanding)
            results.append({"what": f"segment append, 100 events of {args.event_bytes} B",
                            **grouped, "events_per_s": grouped["per_s"] * 100,
                            "mb_per_s": grouped["per_s"] * len(block) / 1e6})
            frames = store.container(0).operation_log.frames_written
            results[-1]["frames_written"] = frames
        finally:
            await store.close()
    finally:
        await client.close()
    base = results[0]["events_per_s"]
    for r in results:
        r["x_raw_events"] = r["events_per_s"] / base
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=30_000)
    parser.add_argument("--outstanding", type=int, default=256)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quire-segment-bench-") as tmp:
        root = Path(tmp)
        uri = sqlite_uri(root / "metadata.db")
        bookies = [BookieProcess(root, uri, f"bench-{i}", port=0) for i in range(3)]
        for bookie in bookies:
            bookie.start(expect_ready=False)
        try:
            for bookie in bookies:
                bookie._wait_ready(60.0)
            results = uvloop.run(run(uri, args))
        finally:
            for bookie in bookies:
                bookie.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.outstanding} outstanding, E=3 W=3 A=2, 3 bookie processes on this machine")
    for r in results:
        print(f"  {r['what']:<36} {r['per_s']:>9.0f} appends/s {r['events_per_s']:>9.0f} "
              f"events/s ({r['x_raw_events']:.1f}x raw)  {r['mb_per_s']:>6.1f} MB/s  "
              f"p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms")


if __name__ == "__main__":
    main()
