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

See :mod:`quire.spark.source` for the semantics and :mod:`quire.spark.options`
for the options.
"""

from quire.spark.io import LedgerRange, QuireCommitMessage
from quire.spark.options import QuireOptions
from quire.spark.source import (
    SCHEMA,
    QuireBatchReader,
    QuireBatchWriter,
    QuireDataSource,
    QuireStreamReader,
    QuireStreamWriter,
    collect_garbage,
)
from quire.spark.stream_sink import recover_stream_writes

__all__ = [
    "SCHEMA",
    "LedgerRange",
    "QuireBatchReader",
    "QuireBatchWriter",
    "QuireCommitMessage",
    "QuireDataSource",
    "QuireOptions",
    "QuireStreamReader",
    "QuireStreamWriter",
    "collect_garbage",
    "recover_stream_writes",
]
