"""Spark reading a Quire stream, against Quire's own stream reader, and
history read straight from tier-2 against through the segment store.

Starts a sandbox of processes in a temporary directory (3 bookies, one
segment store flushing to a ``file://`` tier-2 with small thresholds, the
controller), writes ``--events`` events of ``--size`` bytes with Quire's
StreamWriter into a stream of ``--segments`` segments and seals it (a
sealed segment is flushed whole), waits until tier-2 holds every byte, then
runs the measured Spark aggregation once each way as a warm-up (the JVMs'
JIT compilation; :func:`warm_up`), then measures, in one run:

* Quire's own :class:`~quire.streams.StreamReader` reading the stream from
  its head (one event loop in this process), rows/s;
* Spark (``local[--cores]``, or ``--cluster``: a standalone master and two
  1-core workers from ``tests/support/spark_cluster.py``) computing
  ``count(*)`` and ``sum(length(event))`` through the segment store, rows/s;
* the same with option ``tier2``: the executors read the chunks directly;
* Spark's floor: the same aggregation over the same rows (as many, the same
  columns, payloads of ``--size`` bytes, one partition per segment) from a
  Python data source that reads nothing (:func:`register_floor`: each task
  hands over one prepared Arrow batch again and again).  No reading path can
  be faster than that in this Spark, so ``segment store time / floor time``
  is the most any tier-2 path could gain over the segment store here;

each ``--rounds`` times in turn, and prints each reader's median and the
ratios: Spark/StreamReader (goal >= 0.5) and tier-2/segment store (goal >= 2),
beside that ceiling.

It measures twice.  First with the history still in the segment store's
memory (just written: the read index keeps 256 MiB a container), which is
not what reading history meets; then (``--store-cache-kib``, default 8,192) it
restarts the segment store with that read-index budget per container, well
under the stream's size, so that the history is what a catch-up reader of a
long-lived stream finds: flushed to tier-2 and no longer in the segment
store's memory, which must read it back from tier-2 to serve it (as
Pravega's segment store does past its cache).  The second phase is the one
the tier-2 goal is about.

    .venv/bin/python benchmarks/spark_stream_read.py [--events 1000000] [--size 100]
        [--segments 4] [--cores 2] [--cluster] [--rounds 3] [--store-cache-kib 8192] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import local_spark_session
from quire.errors import QuireError
from quire.sandbox import Sandbox
from quire.segmentstore.tier2_reader import read_layout
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    StreamReader,
    StreamWriter,
    controller_resolver,
)
from quire.streams.model import segment_name
from quire.tier2 import open_chunk_storage

SCOPE, STREAM = "bench", "events"


def register_floor(spark: Any) -> None:
    """Register ``format("quire_bench_floor")``: the stream's rows without
    reading anything.  Options ``events``, ``size``, ``segments``; one
    partition per segment, each yielding one prepared Arrow batch of 8,192
    rows of :data:`~quire.spark.stream_source.STREAM_SCHEMA` again and again
    (sliced for the last)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from quire.spark.stream_source import STREAM_SCHEMA

    class FloorPartition(InputPartition):
        def __init__(self, segment_id: int, rows: int, size: int) -> None:
            self.segment_id, self.rows, self.size = segment_id, rows, size

    class FloorReader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.events, self.size = int(options["events"]), int(options["size"])
            self.segments = int(options["segments"])

        def partitions(self) -> list[FloorPartition]:
            share, extra = divmod(self.events, self.segments)
            return [FloorPartition(i, share + (i < extra), self.size)
                    for i in range(self.segments)]

        def read(self, part: InputPartition) -> Any:
            # (no isinstance: the class arrives pickled by value, maybe twice)
            partition: Any = part
            import numpy as np
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema

            rows = min(8192, partition.rows)
            size = partition.size
            offsets = np.arange(rows + 1, dtype=np.int32) * size
            events = pa.Array.from_buffers(pa.binary(), rows, [
                None, pa.py_buffer(offsets), pa.py_buffer(b"x" * (rows * size))])
            batch = pa.RecordBatch.from_arrays([
                events, pa.repeat(pa.scalar(SCOPE), rows), pa.repeat(pa.scalar(STREAM), rows),
                pa.array(np.full(rows, partition.segment_id, dtype=np.int64)),
                pa.array(np.arange(rows, dtype=np.int64) * (size + 8)),
                pa.array(np.zeros(rows, dtype="datetime64[us]"), pa.timestamp("us", "UTC"))],
                schema=to_arrow_schema(STREAM_SCHEMA, timezone="UTC"))
            left = partition.rows
            while left > 0:
                yield batch if left >= rows else batch.slice(0, left)
                left -= rows

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "quire_bench_floor"

        def schema(self) -> Any:
            return STREAM_SCHEMA

        def reader(self, schema: Any) -> FloorReader:
            return FloorReader(self.options)

    spark.dataSource.register(Floor)


@contextlib.asynccontextmanager
async def stream_clients(uri: str) -> AsyncIterator[tuple[ControllerClient, RemoteSegmentStore]]:
    """A controller client for ``uri`` and a segment store client through it,
    closed on the way out."""
    controller = ControllerClient(uri)
    store = RemoteSegmentStore(controller_resolver(controller))
    try:
        yield controller, store
    finally:
        await store.close()
        await controller.close()


async def write(uri: str, events: int, size: int, segments: int) -> tuple[float, int]:
    """Write and seal the stream; (events/s of the write, total event bytes)."""
    async with stream_clients(uri) as (controller, store):
        await controller.create_scope(SCOPE)
        await controller.create_stream(SCOPE, STREAM, segments)
        writer = StreamWriter(controller, store, SCOPE, STREAM)
        await writer.start()
        tail = b"x" * (size - 10)
        start = time.perf_counter()
        pending: list[asyncio.Future[None]] = []
        for i in range(events):
            pending.append(writer.write_event(b"%010d" % i + tail, routing_key=f"k{i % 64}"))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        await writer.flush()
        seconds = time.perf_counter() - start
        await writer.close()
        await controller.seal_stream(SCOPE, STREAM)
        return events / seconds, events * size


async def wait_flushed(uri: str, tier2: str, timeout_s: float = 600.0) -> int:
    """Until tier-2's layouts hold every segment's bytes; the bytes."""
    storage = await open_chunk_storage(tier2)
    try:
        async with stream_clients(uri) as (controller, store):
            current = await controller.current_segments(SCOPE, STREAM)
            names = [segment_name(SCOPE, STREAM, s.id) for s in current]
            lengths = [(await store.get_info(n)).length for n in names]
        deadline = time.monotonic() + timeout_s
        while True:
            layouts = [await read_layout(storage, n) for n in names]
            if all(la is not None and la.length == n for la, n in zip(layouts, lengths,
                                                                       strict=True)):
                return sum(lengths)
            if time.monotonic() > deadline:
                raise TimeoutError("tier-2 did not catch up")
            await asyncio.sleep(0.2)  # polling the flush, with a deadline
    finally:
        await storage.close()


async def read_own(uri: str) -> tuple[int, int, float]:
    """(rows, payload bytes, seconds): Quire's StreamReader from the head."""
    async with stream_clients(uri) as (controller, store):
        start = time.perf_counter()
        rows = size = 0
        async for event in StreamReader(controller, store, SCOPE, STREAM).events():
            rows += 1
            size += len(event.data)
        return rows, size, time.perf_counter() - start


def spark_session(args: argparse.Namespace, root: Path, cluster: Any) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if cluster is not None:
        from tests.support.spark_cluster import cluster_session

        return cluster_session("quire-stream-bench", cluster.master_url,
                               {"spark.ui.showConsoleProgress": "false"})
    return local_spark_session("quire-stream-bench", args.cores, root)


def stream_frame(spark: Any, uri: str, tier2: str | None) -> Any:
    reader = spark.read.format("quire").option("controller", uri).option(
        "stream", f"{SCOPE}/{STREAM}")
    if tier2 is not None:
        reader = reader.option("tier2", tier2)
    return reader.load()


def warm_up(spark: Any, uri: str, tier2: str, args: argparse.Namespace) -> float:
    """The measured aggregation once each way (the floor too), untimed; its
    seconds.

    The first full aggregation after the cluster starts pays for the JVMs'
    JIT compilation of the Arrow-to-row and aggregation code (about 8-12 s
    of executor CPU on this machine, against 2-4 s for a warm one): a
    warm-up that only reads a few rows (``limit(100)``) left that to
    whichever way was measured first, and made it look 2-3x slower than the
    other.  Both ways run the same JVM code, so one warm run each warms both."""
    start = time.perf_counter()
    for way in (None, tier2):
        measure(spark, uri, way)
    measure(spark, uri, None, floor=args)  # (its first run took 4x its next ones)
    return time.perf_counter() - start


def measure(spark: Any, uri: str, tier2: str | None, floor: argparse.Namespace | None = None
            ) -> tuple[int, int, float]:
    """(rows, payload bytes, seconds) of one Spark aggregation over the
    stream, or with ``floor`` (the arguments) over :func:`register_floor`'s source."""
    from pyspark.sql import functions as F

    if floor is None:
        df = stream_frame(spark, uri, tier2)
    else:
        df = spark.read.format("quire_bench_floor").option("events", floor.events).option(
            "size", floor.size).option("segments", floor.segments).load()
    start = time.perf_counter()
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("event")).alias("b")).first()
    return int(row["n"]), int(row["b"] or 0), time.perf_counter() - start


def rounds(args: argparse.Namespace, spark: Any, uri: str, tier2: str,
           expected: tuple[int, int], label: str) -> dict[str, Any]:
    """``--rounds`` rounds of the three readers and the floor in turn; each
    one's median."""
    times: dict[str, list[float]] = {"own": [], "ss": [], "t2": [], "floor": []}
    for round_no in range(1, args.rounds + 1):
        results = {"own": uvloop.run(read_own(uri)),
                   "ss": measure(spark, uri, None),
                   "t2": measure(spark, uri, tier2),
                   "floor": measure(spark, uri, None, floor=args)}
        for way, (rows, payload_bytes, seconds) in results.items():
            assert (rows, payload_bytes) == expected, (way, rows, payload_bytes)
            times[way].append(seconds)
        if not args.json:
            own_s, ss_s, t2_s, floor_s = (results[w][2] for w in ("own", "ss", "t2", "floor"))
            print(f"{label}, round {round_no}: StreamReader {own_s:.2f} s, Spark via "
                  f"segment store {ss_s:.2f} s, via tier-2 {t2_s:.2f} s, floor "
                  f"{floor_s:.2f} s: {own_s / ss_s:.2f}x, {ss_s / t2_s:.2f}x "
                  f"(ceiling {ss_s / floor_s:.2f}x)", flush=True)
    own_s, ss_s, t2_s, floor_s = (statistics.median(times[w])
                                  for w in ("own", "ss", "t2", "floor"))
    rows = expected[0]  # every reader read them all (asserted above)
    return {"label": label, "own_rows_per_s": rows / own_s,
            "segment_store_rows_per_s": rows / ss_s, "tier2_rows_per_s": rows / t2_s,
            "floor_rows_per_s": rows / floor_s,
            "ratio_spark_vs_own": own_s / ss_s, "ratio_tier2_vs_segment_store": ss_s / t2_s,
            "ratio_floor_vs_segment_store": ss_s / floor_s}


async def wait_serving(uri: str, timeout_s: float = 120.0) -> None:
    """Until the (restarted) segment store answers for every segment."""
    async with stream_clients(uri) as (controller, store):
        segments = await controller.current_segments(SCOPE, STREAM)
        deadline = time.monotonic() + timeout_s
        for s in segments:
            while True:
                try:
                    await store.get_info(segment_name(SCOPE, STREAM, s.id))
                    break
                except QuireError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)  # the containers are reopening


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--cluster", action="store_true",
                        help="a Spark standalone cluster (master + 2 workers), not local[N]")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure all three readers this many times, in turn; the "
                             "figures are each reader's median")
    parser.add_argument("--store-cache-kib", type=int, default=8192,
                        help="then restart the segment store with this read-index budget "
                             "per container and measure again: history no longer in its "
                             "memory, read from tier-2 by the segment store or the "
                             "executors (0: skip)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.size < 10 or args.events < 1 or args.rounds < 1:
        parser.error("need --size >= 10, --events >= 1 and --rounds >= 1")

    with tempfile.TemporaryDirectory(prefix="quire-stream-bench-") as tmp:
        root = Path(tmp)
        sandbox = Sandbox(root / "sandbox", bookies=3)
        store = sandbox.segment_stores[0]
        store.settings.update(container_count=4, tier2_flush_threshold_bytes=4 << 20,
                              tier2_flush_threshold_ms=2_000, tier2_flush_interval_ms=200)
        tier2 = str(store.settings["tier2_uri"])
        cluster = None
        spark = None
        sandbox.start()
        try:
            assert sandbox.controller is not None
            uri = sandbox.controller.uri
            write_rate, _ = uvloop.run(write(uri, args.events, args.size, args.segments))
            stored = uvloop.run(wait_flushed(uri, tier2))
            if args.cluster:
                from tests.support.spark_cluster import SparkStandalone

                cluster = SparkStandalone(root / "spark-cluster", workers=2).start()
            spark = spark_session(args, root, cluster)
            register_floor(spark)
            warm_s = warm_up(spark, uri, tier2, args)
            expected = (args.events, args.events * args.size)
            phases = {"cached": rounds(args, spark, uri, tier2, expected,
                                       "history in the segment store's cache")}
            if args.store_cache_kib > 0:
                # History as a catch-up reader meets it: flushed, and no longer
                # in the segment store's memory, which then reads it from tier-2.
                store.stop()
                store.settings["read_index_budget_bytes"] = args.store_cache_kib << 10
                store.start()
                uvloop.run(wait_serving(uri))
                phases["beyond_cache"] = rounds(
                    args, spark, uri, tier2, expected,
                    f"history beyond the segment store's cache ({args.store_cache_kib:,} KiB "
                    f"a container)")
            figures = {
                "events": args.events, "size": args.size, "segments": args.segments,
                "spark": "standalone 2x1 core" if cluster else f"local[{args.cores}]",
                "stored_bytes": stored, "write_events_per_s": write_rate,
                "store_cache_kib": args.store_cache_kib,
                **{f"{phase}_{k}": v for phase, medians in phases.items()
                   for k, v in medians.items()},
                "warm_up_s": warm_s, "rounds": args.rounds,
                "loadavg_1m": os.getloadavg()[0],
            }
            if args.json:
                print(json.dumps(figures))
            else:
                print(f"stream {SCOPE}/{STREAM}: {args.events:,} events of {args.size} B in "
                      f"{args.segments} segments (write {write_rate:,.0f} events/s), "
                      f"{stored:,} B flushed to tier-2; Spark {figures['spark']}; load "
                      f"average {figures['loadavg_1m']:.1f}; warm-up (both aggregations "
                      f"once, cold JVMs) {warm_s:.1f} s")
                for medians in phases.values():
                    print(f"{medians['label']}, medians of {args.rounds} round(s):")
                    print(f"  Quire StreamReader           {medians['own_rows_per_s']:>12,.0f} "
                          f"rows/s")
                    print(f"  Spark, through the segment store "
                          f"{medians['segment_store_rows_per_s']:>8,.0f} rows/s")
                    print(f"  Spark, tier-2 directly       {medians['tier2_rows_per_s']:>12,.0f} "
                          f"rows/s")
                    print(f"  Spark's floor (reads nothing) {medians['floor_rows_per_s']:>11,.0f} "
                          f"rows/s")
                    print(f"  ratio Spark/StreamReader {medians['ratio_spark_vs_own']:.2f} "
                          f"(goal >= 0.5); tier-2/segment store "
                          f"{medians['ratio_tier2_vs_segment_store']:.2f} (goal >= 2; at most "
                          f"{medians['ratio_floor_vs_segment_store']:.2f} for any path here: "
                          f"floor/segment store)")
        finally:
            if spark is not None:
                spark.stop()
            if cluster is not None:
                cluster.close()
            sandbox.stop()


if __name__ == "__main__":
    main()
