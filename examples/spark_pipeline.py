"""A small data pipeline on Quire logs with Spark.

1. Generate a CSV dataset of sales (``ts, store, product, quantity, price``).
2. Load it into the log ``sales`` through Spark: one JSON document per row,
   written with ``df.write.format("quire")`` (all rows appear at once, or
   none).
3. Read the log back with ``spark.read.format("quire")``, parse the JSON and
   aggregate revenue per store; check it against the same aggregation of the
   CSV.
4. Stream the big sales into a second log, ``big-sales``, with an
   exactly-once streaming sink (``sink_id``), and count them.
5. With ``--controller``: write the sales into the stream
   ``example/sales`` (event: the JSON document, routing key: the store), all
   or nothing, and count the events Quire's stream reader reads back.

Run it against the sandbox in one command (starts one in a temporary
directory, runs this, stops it)::

    scripts/example-spark
    scripts/example-spark --cluster     # on a Spark standalone cluster

or against a running cluster::

    .venv/bin/python examples/spark_pipeline.py --metadata sqlite:////path/metadata.db \
        [--controller tcp://127.0.0.1:9090] [--master spark://host:7077]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType

SALE = StructType([
    StructField("ts", StringType()),
    StructField("store", StringType()),
    StructField("product", StringType()),
    StructField("quantity", IntegerType()),
    StructField("price", DoubleType()),
])


def generate_csv(path: Path, rows: int, seed: int = 7) -> None:
    """Write ``rows`` random sales to ``path`` (with a header line)."""
    rng = random.Random(seed)
    stores = [f"store-{i:02d}" for i in range(12)]
    products = ["apples", "bread", "cheese", "coffee", "milk", "tea", "wine"]
    start = time.mktime((2026, 1, 1, 0, 0, 0, 0, 0, -1))
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([field.name for field in SALE.fields])
        for i in range(rows):
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + i * 37))
            out.writerow([ts, rng.choice(stores), rng.choice(products), rng.randint(1, 20),
                          round(rng.uniform(0.5, 40.0), 2)])


def per_store(sales: DataFrame) -> DataFrame:
    """Sales and revenue per store, biggest first (summed in cents: exact)."""
    cents = F.col("quantity") * F.round(F.col("price") * 100).cast("long")
    return (sales.groupBy("store")
            .agg(F.count("*").alias("sales"), F.sum(cents).alias("cents"))
            .select("store", "sales", (F.col("cents") / 100).alias("revenue"))
            .orderBy(F.desc("revenue"), "store"))


async def stream_events(controller_uri: str, create: bool = False) -> int:
    """The number of events in the stream example/sales (created first if
    ``create``), read with Quire's own stream reader."""
    from quire.streams import (
        ControllerClient,
        RemoteSegmentStore,
        StreamReader,
        controller_resolver,
    )

    controller = ControllerClient(controller_uri)
    segments = RemoteSegmentStore(controller_resolver(controller))
    try:
        if create:
            await controller.create_scope("example")
            await controller.create_stream("example", "sales", segments=2)
        count = 0
        reader = StreamReader(controller, segments, "example", "sales")
        async for _ in reader.events():
            count += 1
        await reader.close()
        return count
    finally:
        await segments.close()
        await controller.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", default=os.environ.get("QUIRE_METADATA"),
                        help="metadata store URI of the cluster (default $QUIRE_METADATA)")
    parser.add_argument("--controller", default=os.environ.get("QUIRE_CONTROLLER"),
                        help="controller URI: also write the sales to the stream "
                             "example/sales (default $QUIRE_CONTROLLER)")
    parser.add_argument("--master", default=os.environ.get("QUIRE_SPARK_MASTER", "local[2]"),
                        help="Spark master (default $QUIRE_SPARK_MASTER, else local[2])")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the CSV and the stream checkpoint go (default: a temp dir)")
    args = parser.parse_args()
    if not args.metadata:
        parser.error("give --metadata URI (or set QUIRE_METADATA); scripts/example-spark "
                     "starts a sandbox for you")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="quire-example-"))
    workdir.mkdir(parents=True, exist_ok=True)
    uri = args.metadata

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(args.master).appName("quire-example")
    if args.master.startswith("spark://"):  # small executors: one core each
        builder = (builder.config("spark.executor.memory", "512m")
                   .config("spark.executor.cores", "1").config("spark.cores.max", "2"))
    print(f"Spark master: {args.master}")
    spark = (builder
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # 1. a dataset
        csv_path = workdir / "sales.csv"
        generate_csv(csv_path, args.rows)
        sales = spark.read.option("header", True).schema(SALE).csv(str(csv_path))
        print(f"generated {args.rows} sales in {csv_path}")

        # 2. into a log: one JSON document per entry, all rows or none
        started = time.perf_counter()
        (sales.select(F.to_json(F.struct(*SALE.fieldNames())).alias("payload"))
         .repartition(4)
         .write.format("quire").option("metadata", uri).option("log", "sales")
         .mode("overwrite").save())
        print(f"loaded them into log 'sales' in {time.perf_counter() - started:.1f} s")

        # 3. back out, parsed, aggregated
        log = (spark.read.format("quire").option("metadata", uri).option("log", "sales")
               .load())
        parsed = log.select("ledger_seq", "entry_id", F.from_json(
            F.col("payload").cast("string"), SALE).alias("sale")).select("sale.*")
        revenue = per_store(parsed)
        print("revenue per store, read back from the log:")
        revenue.show(12, truncate=False)
        assert revenue.collect() == per_store(sales).collect(), "the log does not match the CSV"
        print(f"log entries: {log.count()}, ledgers: "
              f"{log.select('ledger_seq').distinct().count()} (matches the CSV)")

        # 4. a stream: big sales into another log, exactly once
        big = (spark.readStream.format("quire").option("metadata", uri).option("log", "sales")
               .option("max_rows_per_trigger", max(1, args.rows // 4)).load()
               .select(F.from_json(F.col("payload").cast("string"), SALE).alias("sale"),
                       "payload")
               .where(F.col("sale.quantity") * F.col("sale.price") > 500)
               .select("payload"))
        query = (big.writeStream.format("quire").option("metadata", uri)
                 .option("log", "big-sales").option("sink_id", "big-sales-v1")
                 .option("checkpointLocation", str(workdir / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        copied = (spark.read.format("quire").option("metadata", uri).option("log", "big-sales")
                  .load().count())
        wanted = sales.where(F.col("quantity") * F.col("price") > 500).count()
        print(f"streamed {copied} big sales into log 'big-sales' (expected {wanted})")
        assert copied == wanted

        # 5. into a stream, all or nothing, routed by store
        if args.controller:
            before = asyncio.run(stream_events(args.controller, create=True))
            started = time.perf_counter()
            (sales.select(F.to_json(F.struct(*SALE.fieldNames())).alias("event"),
                          F.col("store").alias("routing_key"))
             .repartition(4)
             .write.format("quire").option("controller", args.controller)
             .option("stream", "example/sales").mode("append").save())
            after = asyncio.run(stream_events(args.controller))
            print(f"wrote {after - before} events into stream 'example/sales' in "
                  f"{time.perf_counter() - started:.1f} s (expected {args.rows})")
            assert after - before == args.rows
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
