"""A Spark driver process writing DataFrames to streams (for the stream sink
tests on the standalone cluster; see tests/support/spark_cluster.py).

``python tests/support/spark_stream_driver.py CONTROLLER SPEC``: SPEC is JSON
``[{"stream": "scope/stream", "rows": [[event, routing_key], ...],
"partitions": n}, ...]``; each is written in order with ``df.write``; one
line ``{"written": "scope/stream"}`` is printed after each write."""

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
            df = spark.createDataFrame(spark.sparkContext.parallelize(
                rows, int(write["partitions"])), "event string, routing_key string")
            (df.write.format("quire").option("controller", controller)
             .option("stream", write["stream"]).mode("append").save())
            print(json.dumps({"written": write["stream"]}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
