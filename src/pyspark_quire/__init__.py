"""Auto-registration of Quire's Spark data source.

PySpark (4.x) imports every top-level module named ``pyspark_*`` on the
Python path of its workers and registers the :class:`DefaultSource` it
exports under ``DefaultSource.name()``, so ``spark.read.format("quire")``
works without ``spark.dataSource.register``.  The implementation is
:class:`quire.spark.QuireDataSource`.
"""

from quire.spark import QuireDataSource

DefaultSource = QuireDataSource

__all__ = ["DefaultSource", "QuireDataSource"]
