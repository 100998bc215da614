"""Auto-registration of Quire's Spark data source, and its helpers.

PySpark (4.x) imports every top-level module named ``pyspark_*`` on the
Python path of its workers and registers the :class:`DefaultSource` it
exports under ``DefaultSource.name()``, so ``spark.read.format("quire")``
works without ``spark.dataSource.register``.  The implementation is
:class:`quire.spark.QuireDataSource`.

:func:`lag` gives a running query's lag per stream (bytes behind each
stream's tail as of its last micro-batch) and sets the Prometheus gauge
``quire_spark_stream_lag_bytes{query, stream}``; :class:`LagListener`
(``spark.streams.addListener(LagListener())``) keeps that gauge set on
every micro-batch of every query.
"""

from quire.spark import QuireDataSource
from quire.spark.stream_progress import LagListener
from quire.spark.stream_progress import query_lag as lag

DefaultSource = QuireDataSource

__all__ = ["DefaultSource", "LagListener", "QuireDataSource", "lag"]
