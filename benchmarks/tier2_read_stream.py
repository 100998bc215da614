"""A stream's history read straight from tier-2 by ``quire.history.read_stream``
(no Quire process running), against the Spark source reading the same
history through the segment store.

Starts a sandbox of processes in a temporary directory (3 bookies, one
segment store flushing to a ``file://`` tier-2, the controller), writes
``--events`` events of ``--size`` bytes into a stream of ``--segments``
segments with Quire's StreamWriter and seals it, waits until tier-2 holds
every byte and the controller's stream tables as flushed there say the
stream is sealed (``read_stream`` lags the cluster by one flush), then:

* Spark (``local[--cores]``) computes ``count(*)`` and ``sum(length(event))``
  through the segment store, once untimed (the JVMs' JIT compilation), then
  ``--rounds`` times;
* the sandbox is stopped: no bookie, segment store, controller or metadata
  store runs from here on;
* ``read_stream(tier2, scope, stream)`` gives the same history as Arrow
  record batches in this process; the same count and sum are taken with
  ``pyarrow.compute``, ``--rounds`` times.

Both must agree on the rows and payload bytes (asserted).  It prints each
way's median rows/s and the ratio direct/Spark (goal >= 2: the direct read
has no Spark in the way).

    .venv/bin/python benchmarks/tier2_read_stream.py [--events 1000000] [--size 100]
        [--segments 4] [--cores 2] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks.spark_stream_read import (
    SCOPE,
    STREAM,
    measure,
    spark_session,
    wait_flushed,
    write,
)
from quire.errors import QuireError
from quire.sandbox import Sandbox


async def wait_record_sealed(tier2: str, timeout_s: float = 600.0) -> None:
    """Until the stream's record, as tier-2 holds the controller's tables, is sealed."""
    from quire.history.catalog import Tier2Catalog
    from quire.tier2 import open_chunk_storage

    storage = await open_chunk_storage(tier2)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                record = await (await Tier2Catalog.load(storage)).stream(SCOPE, STREAM)
                if record.state.value == "sealed":
                    return
            except QuireError:
                pass  # not flushed yet
            if time.monotonic() > deadline:
                raise TimeoutError("the stream's record did not reach tier-2 sealed")
            await asyncio.sleep(0.2)  # polling the flush, with a deadline
    finally:
        await storage.close()


def read_direct(tier2: str) -> tuple[int, int, float]:
    """(rows, payload bytes, seconds): ``read_stream`` from tier-2, in this process."""
    import pyarrow.compute as pc

    from quire.history import read_stream

    start = time.perf_counter()
    rows = size = 0
    for batch in read_stream(tier2, SCOPE, STREAM):
        rows += batch.num_rows
        size += pc.sum(pc.binary_length(batch.column("event"))).as_py() or 0
    return rows, size, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure each way this many times; the figures are medians")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.size < 10 or args.events < 1 or args.rounds < 1:
        parser.error("need --size >= 10, --events >= 1 and --rounds >= 1")
    expected = (args.events, args.events * args.size)

    with tempfile.TemporaryDirectory(prefix="quire-tier2-read-bench-") as tmp:
        root = Path(tmp)
        sandbox = Sandbox(root / "sandbox", bookies=3)
        store = sandbox.segment_stores[0]
        store.settings.update(container_count=4, tier2_flush_threshold_bytes=4 << 20,
                              tier2_flush_threshold_ms=2_000, tier2_flush_interval_ms=200)
        tier2 = str(store.settings["tier2_uri"])
        spark = None
        sandbox.start()
        try:
            assert sandbox.controller is not None
            uri = sandbox.controller.uri
            write_rate, _ = uvloop.run(write(uri, args.events, args.size, args.segments))
            stored = uvloop.run(wait_flushed(uri, tier2))
            uvloop.run(wait_record_sealed(tier2))
            spark = spark_session(args, root, None)
            measure(spark, uri, None)  # warm-up: the JVMs' JIT compilation
            spark_s = []
            for _round in range(args.rounds):
                rows, payload, seconds = measure(spark, uri, None)
                assert (rows, payload) == expected, ("spark", rows, payload)
                spark_s.append(seconds)
        finally:
            if spark is not None:
                spark.stop()
            sandbox.stop()  # nothing of Quire runs from here on
        direct_s = []
        for _round in range(args.rounds):
            rows, payload, seconds = read_direct(tier2)
            assert (rows, payload) == expected, ("read_stream", rows, payload)
            direct_s.append(seconds)

    spark_rate = args.events / statistics.median(spark_s)
    direct_rate = args.events / statistics.median(direct_s)
    figures = {"events": args.events, "size": args.size, "segments": args.segments,
               "spark": f"local[{args.cores}]", "stored_bytes": stored,
               "write_events_per_s": write_rate, "rounds": args.rounds,
               "spark_segment_store_rows_per_s": spark_rate,
               "read_stream_rows_per_s": direct_rate,
               "ratio_read_stream_vs_spark": direct_rate / spark_rate,
               "loadavg_1m": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(figures))
        return
    print(f"stream {SCOPE}/{STREAM}: {args.events:,} events of {args.size} B in "
          f"{args.segments} segments, {stored:,} B in tier-2; load average "
          f"{figures['loadavg_1m']:.1f}; medians of {args.rounds} round(s):")
    print(f"  Spark {figures['spark']}, through the segment store {spark_rate:>12,.0f} rows/s")
    print(f"  read_stream from tier-2, no cluster running {direct_rate:>10,.0f} rows/s")
    print(f"  ratio read_stream/Spark {figures['ratio_read_stream_vs_spark']:.2f} (goal >= 2)")


if __name__ == "__main__":
    main()
