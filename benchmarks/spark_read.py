"""Spark reads of a log against the raw client's batched reads, and a Spark write.

Starts a 3-bookie sandbox in a temporary directory, writes ``--entries``
entries of ``--entry-bytes`` bytes with the raw client (pipelined, into
``--ledgers`` ledgers of E=W=3 A=2, written in parallel) and bulk-appends
them to a log.  Then, once each after a warm-up query:

* Spark (``local[N]``, the ``quire`` data source): ``count()`` and
  ``sum(length(payload))``, in rows/s;
* the raw client: every ledger read with BP-62 batched reads
  (``batch_read``), all ledgers at once on one event loop, in rows/s;
* the ratio Spark / raw (goal: >= 0.5);
* Spark writing a DataFrame of ``--entries`` rows of ``--entry-bytes`` into a
  new log (``df.write.format("quire")``), in rows/s.

    .venv/bin/python benchmarks/spark_read.py [--entries 1000000] [--entry-bytes 100]
        [--ledgers 4] [--cores 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from benchmarks._common import local_spark_session
from quire.client import Client, ReadHandle
from quire.errors import QueueFullError
from quire.log import LogStore
from quire.sandbox import Sandbox

LOG = "bench"


async def write_ledger(client: Client, count: int, entry_bytes: int, tag: int) -> int:
    ledger = await client.create_ledger(3, 3, 2)
    payload_tail = b"x" * (entry_bytes - 12)
    last: asyncio.Future[int] | None = None
    marks: list[asyncio.Future[int]] = []
    for i in range(count):
        data = b"%02d-%09d" % (tag, i) + payload_tail
        while True:
            try:
                last = ledger.append(data)
                break
            except QueueFullError:
                await (marks.pop(0) if marks else last)  # type: ignore[misc]
        if i % 4096 == 0:
            marks.append(last)
    if last is not None:
        await last
    await ledger.close()
    return ledger.ledger_id


async def prepare(uri: str, entries: int, entry_bytes: int, ledgers: int) -> float:
    client = await Client.connect(uri)
    try:
        start = time.perf_counter()
        per = [entries // ledgers + (1 if i < entries % ledgers else 0) for i in range(ledgers)]
        ids = await asyncio.gather(*[write_ledger(client, n, entry_bytes, i)
                                     for i, n in enumerate(per)])
        seconds = time.perf_counter() - start
        logs = LogStore(client)
        await logs.create(LOG, exist_ok=True)
        await logs.bulk_append(LOG, ids)
        return entries / seconds
    finally:
        await client.close()


async def read_raw(uri: str) -> tuple[int, int, float]:
    """(rows, payload bytes, seconds) of reading the whole log with batch reads."""
    client = await Client.connect(uri)
    try:
        info = await LogStore(client).info(LOG)
        handles = [await client.open_ledger(r.ledger_id, recovery=False) for r in info.ledgers]

        async def read_one(handle: ReadHandle) -> tuple[int, int]:
            rows = size = 0
            following, last = 0, handle.last_add_confirmed
            while following <= last:
                entries = await handle.batch_read(following, 8192, 8 << 20)
                rows += len(entries)
                size += sum(len(e.data) for e in entries)
                following = entries[-1].entry_id + 1
            return rows, size

        start = time.perf_counter()
        results = await asyncio.gather(*[read_one(h) for h in handles])
        seconds = time.perf_counter() - start
        for handle in handles:
            await handle.close()
        return sum(r for r, _ in results), sum(s for _, s in results), seconds
    finally:
        await client.close()


def timed(fn: object) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()  # type: ignore[operator]
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--entry-bytes", type=int, default=100)
    parser.add_argument("--ledgers", type=int, default=4)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    if args.ledgers < 2 or args.entry_bytes < 12:
        parser.error("need --ledgers >= 2 and --entry-bytes >= 12")

    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="quire-spark-bench-") as tmp:
        root = Path(tmp)
        sandbox = Sandbox(root / "sandbox", bookies=3)
        sandbox.start()
        spark = None
        try:
            uri = sandbox.metadata_uri
            write_rate = uvloop.run(prepare(uri, args.entries, args.entry_bytes, args.ledgers))
            print(f"log {LOG}: {args.entries} entries of {args.entry_bytes} B in "
                  f"{args.ledgers} ledgers (raw client write {write_rate:,.0f} entries/s)")

            spark = local_spark_session("quire-spark-bench", args.cores, root)
            df = (spark.read.format("quire").option("metadata", uri).option("log", LOG).load())
            df.count()  # warm-up: JVM, Python workers, connections

            count, count_s = timed(df.count)
            total, sum_s = timed(lambda: df.agg(F.sum(F.length("payload"))).first()[0])
            raw_rows, raw_bytes, raw_s = uvloop.run(read_raw(uri))
            assert count == raw_rows == args.entries, (count, raw_rows)
            assert total == raw_bytes, (total, raw_bytes)
            raw_rate = raw_rows / raw_s
            count_rate = args.entries / count_s
            sum_rate = args.entries / sum_s
            partitions = df.rdd.getNumPartitions()
            print(f"spark local[{args.cores}], {partitions} input partitions:")
            print(f"  count()                {count_rate:>12,.0f} rows/s  ({count_s:.2f} s)")
            print(f"  sum(length(payload))   {sum_rate:>12,.0f} rows/s  ({sum_s:.2f} s)")
            print(f"raw client batch_read    {raw_rate:>12,.0f} rows/s  ({raw_s:.2f} s, "
                  "one event loop)")
            print(f"ratio spark/raw: count {count_rate / raw_rate:.2f}, "
                  f"sum {sum_rate / raw_rate:.2f} (goal >= 0.5)")

            rows = spark.range(0, args.entries, numPartitions=args.cores).select(
                F.lpad(F.col("id").cast("string"), args.entry_bytes, "x")
                .cast("binary").alias("payload"))
            (rows.limit(1000).write.format("quire").option("metadata", uri)
             .option("log", "bench-warmup").mode("append").save())
            _, write_s = timed(lambda: rows.write.format("quire").option("metadata", uri)
                               .option("log", "bench-write").mode("append").save())
            print(f"spark write of {args.entries} rows of {args.entry_bytes} B: "
                  f"{args.entries / write_s:,.0f} rows/s ({write_s:.2f} s)")
        finally:
            if spark is not None:
                spark.stop()
            sandbox.stop()


if __name__ == "__main__":
    main()
