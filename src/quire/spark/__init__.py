"""Quire's PySpark data source (format name ``quire``; needs PySpark >= 4.2).

Register it explicitly::

    from quire.spark import QuireDataSource
    spark.dataSource.register(QuireDataSource)

or not at all: the top-level module :mod:`pyspark_quire` exports it as
``DefaultSource``, and PySpark registers every ``pyspark_*`` module's
``DefaultSource`` it finds on the Python path.  Then::

    df = (spark.read.format("quire").option("metadata", uri).option("log", "events")
          .load())                      # ledger_seq, ledger_id, entry_id, payload
    df.write.format("quire").option("metadata", uri).option("log", "copy") \\
        .mode("append").save()          # writes column payload

Streams (``scope/stream``, through the controller)::

    df = (spark.read.format("quire").option("controller", "tcp://127.0.0.1:9090")
          .option("stream", "shop/orders").load())
          # event, scope, stream, segment_id, offset, timestamp

See :mod:`quire.spark.source` for the semantics and :mod:`quire.spark.options`
for the options (streams: :mod:`quire.spark.stream_source`,
:mod:`quire.spark.stream_options`).
"""

from quire.spark.datasource import QuireDataSource
from quire.spark.io import LedgerRange, QuireCommitMessage
from quire.spark.options import QuireOptions
from quire.spark.source import (
    SCHEMA,
    QuireBatchReader,
    QuireBatchWriter,
    QuireStreamReader,
    QuireStreamWriter,
    collect_garbage,
)
from quire.spark.stream_options import StreamOptions
from quire.spark.stream_plan import StreamDataLossError
from quire.spark.stream_progress import LagListener, query_lag, release_retention
from quire.spark.stream_sink import recover_stream_writes
from quire.spark.stream_source import STREAM_SCHEMA, StreamBatchReader, StreamMicroBatchReader

__all__ = [
    "SCHEMA",
    "STREAM_SCHEMA",
    "LagListener",
    "LedgerRange",
    "QuireBatchReader",
    "QuireBatchWriter",
    "QuireCommitMessage",
    "QuireDataSource",
    "QuireOptions",
    "QuireStreamReader",
    "QuireStreamWriter",
    "StreamBatchReader",
    "StreamDataLossError",
    "StreamMicroBatchReader",
    "StreamOptions",
    "collect_garbage",
    "query_lag",
    "recover_stream_writes",
    "release_retention",
]
