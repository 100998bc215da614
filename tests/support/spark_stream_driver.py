"""A Spark driver process writing DataFrames to streams (for the stream sink
tests on the standalone cluster; see tests/support/spark_cluster.py).

``python tests/support/spark_stream_driver.py CONTROLLER SPEC``: SPEC is JSON
``[{"stream": "scope/stream", "rows": [[event, routing_key], ...],
"partitions": n}, ...]``; each is written in order with ``df.write``; one
line ``{"written": "scope/stream"}`` is printed after each write.  A write
``{"routed": true, "rows": [[event, routing_key, "scope/stream"], ...], ...}``
routes each row by its ``stream`` column (printed as ``{"written": "routed"}``).
The master is ``$QUIRE_SPARK_MASTER`` (a standalone cluster's, or ``local[2]``)."""

from __future__ import annotations

import json
import sys

from tests.support.spark_cluster import cluster_session


def main() -> None:
    controller, spec = sys.argv[1], json.loads(sys.argv[2])
    spark = cluster_session("quire-stream-driver")
    try:
        for write in spec:
            rows = [tuple(r) for r in write["rows"]]
            routed = bool(write.get("routed"))
            df = spark.createDataFrame(spark.sparkContext.parallelize(
                rows, int(write["partitions"])),
                "event string, routing_key string" + (", stream string" if routed else ""))
            writer = df.write.format("quire").option("controller", controller)
            if not routed:
                writer = writer.option("stream", write["stream"])
            writer.mode("append").save()
            print(json.dumps({"written": "routed" if routed else write["stream"]}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
