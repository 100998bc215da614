"""A local Spark session for the ``quire`` data source tests.

:func:`start_spark` builds the one SparkSession of a test session:
``local[2,2]`` (two cores; a failed task is retried once, so retry tests
can fail a first attempt on purpose), small shuffles, no UI, bound to
127.0.0.1, modest memory, and the Python workers on this interpreter (the
venv, where :mod:`pyspark_quire` is importable).  The session does not
register the data source: ``format("quire")`` must resolve through
``pyspark_quire``'s auto-registration.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

SPARK_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.task.maxFailures": "2",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "200",
    "spark.python.worker.reuse": "true",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.sql.adaptive.enabled": "false",
}


def start_spark(tmp: Path) -> SparkSession:
    """Start the test SparkSession (skips the test if PySpark is missing)."""
    import pyarrow  # noqa: F401  (a missing dependency fails, never skips)
    import pyspark  # noqa: F401  (a missing dependency fails, never skips)
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master("local[2,2]").appName("quire-tests")
               .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
               .config("spark.local.dir", str(tmp / "local")))
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def forget_last_commit(checkpoint: Path) -> int:
    """Make a query's last micro-batch look uncommitted (as after a crash
    between the sink's commit and Spark's commit log): a restarted query
    runs it again.  Returns its batch id."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    crc = commits / f".{last}.crc"
    if crc.exists():
        crc.unlink()
    return last


CONNECT_BACK = "failed to connect back"


def run_available_now(start: Callable[[], StreamingQuery], attempts: int = 5
                      ) -> BaseException | None:
    """Start a ``Trigger.AvailableNow`` query (``start``), wait for it to end,
    and return its error (None: it read everything and stopped).

    Spark gives a Python worker it starts (a streaming source's or sink's
    driver-side process) a fixed 10 s to connect back, hard-coded in its
    ``PythonWorkerFactory``; on a loaded 2-core machine that is sometimes
    too little, and the query stops with "Python worker failed to connect
    back" before its batch.  Only then is it started again from its
    checkpoint, as an operator would (at most ``attempts`` runs); any other
    error is returned at once."""
    error: BaseException | None = None
    for _attempt in range(attempts):
        try:
            query = start()
            query.awaitTermination()
            error = query.exception()
        except Exception as e:
            error = e
        if error is None or CONNECT_BACK not in str(error):
            return error
    return error


def read_available_now(spark: SparkSession, checkpoint: Path, collect: Any,
                       **options: str) -> BaseException | None:
    """One ``Trigger.AvailableNow`` run of a ``format("quire")`` streaming
    read with ``options`` (a log's or a stream's) into ``foreachBatch(collect)``,
    checkpointed at ``checkpoint``: :func:`run_available_now`'s answer."""
    def start() -> StreamingQuery:
        reader = spark.readStream.format("quire")
        for key, value in options.items():
            reader = reader.option(key, value)
        return (reader.load().writeStream.foreachBatch(collect)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True).start())

    return run_available_now(start)
