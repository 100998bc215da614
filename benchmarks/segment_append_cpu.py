"""Client CPU per segment append, one container on the in-memory tier-1 log.

What a saturated machine's segment-append rates follow (the client process
is the bottleneck for raw ``ledger.append`` and segment rows alike, see
docs/performance.md): ``time.process_time`` over ``--appends`` appends with
256 outstanding, driven as ``segment_appends.py`` drives them, the minimum of
``--reps`` repetitions (short repetitions and their minimum resist a shared
machine's noise better than one long run), for plain appends and appends
carrying a writer's event number (the wire server's), 100 B and 1 KiB
events, 1, 10 and 1,000 segments; and the driver alone (a future completed
through ``call_soon``), which every row includes.  Compare two trees by
running it from each, alternated.

    .venv/bin/python benchmarks/segment_append_cpu.py [--appends 4000] [--reps 25]
        [--sizes 100,1024] [--segments 1,10,1000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks.segment_appends import drive
from quire.hosts import SegmentStoreHostConfig
from quire.hosts.process import tune_interpreter
from quire.metadata import open_store
from quire.segmentstore import SegmentStore, SegmentStoreConfig
from quire.testing.memory_data_log import MemoryDataLogs


async def best_cpu_us(call: Any, appends: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        await drive(call, appends, 256)
        best = min(best, time.process_time() - start)
    return best / appends * 1e6


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    logs = MemoryDataLogs()
    store = await SegmentStore.open(None, [0], metadata_store=await open_store("memory://cpu"),
                                    open_log=lambda c: logs.open(f"c{c}"),
                                    config=SegmentStoreConfig(container_count=1))
    rows: list[dict[str, Any]] = []
    try:
        for size in args.sizes:
            event = b"e" * size
            for count in args.segments:
                names = [f"cpu/{size}/{count}/{i}" for i in range(count)]
                await asyncio.gather(*(store.create_segment(n) for n in names))
                plain = await best_cpu_us(
                    lambda i, names=names, event=event: store.append(names[i % len(names)],
                                                                     event),
                    args.appends, args.reps)
                numbers = iter(range(1, 1 << 62))  # every writer's numbers keep rising

                def with_writer(i: int, names: list[str] = names, event: bytes = event,
                                numbers: Any = numbers) -> Any:
                    return store.append(names[i % len(names)], event,
                                        writer=(1 + i % len(names), next(numbers)))
                writer = await best_cpu_us(with_writer, args.appends, args.reps)
                rows.append({"what": f"{count} segment(s), {size} B", "size": size,
                             "segments": count, "plain_cpu_us": plain, "writer_cpu_us": writer})
        loop = asyncio.get_running_loop()

        def nothing(_i: int) -> asyncio.Future[None]:
            future = loop.create_future()
            loop.call_soon(future.set_result, None)
            return future
        rows.append({"what": "the driver alone", "driver_cpu_us":
                     await best_cpu_us(nothing, args.appends, args.reps)})
    finally:
        await store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[100, 1024])
    parser.add_argument("--segments", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1, 10, 1000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tune_interpreter(SegmentStoreHostConfig().gc_gen0_threshold_allocations)
    rows = uvloop.run(run(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"client CPU per append (min of {args.reps} x {args.appends}, 256 outstanding, "
          "the driver included)")
    for r in rows:
        if "driver_cpu_us" in r:
            print(f"  {r['what']:<26} {r['driver_cpu_us']:6.2f} us")
        else:
            print(f"  {r['what']:<26} plain {r['plain_cpu_us']:6.2f} us   "
                  f"with a writer {r['writer_cpu_us']:6.2f} us")


if __name__ == "__main__":
    main()
