"""The ``quire`` data source's ``read_mode`` ``tier2``: a batch read of
streams' flushed history from tier-2 alone, with no Quire process running
(:mod:`quire.history`).

::

    df = (spark.read.format("quire").option("stream", "shop/orders")
          .option("tier2", "s3://bucket/tier2?endpoint_url=...")
          .option("read_mode", "tier2").option("start_time", "2025-01-01T00:00:00")
          .load())

The driver plans from tier-2 (the controller's streams table and the
layouts, as flushed: the view lags the cluster by one flush); each input
partition is one :class:`~quire.history.HistorySplit`, a segment's bytes
between two event boundaries, so a segment is read by several tasks.
Streams come from ``stream``, ``streams`` or ``stream_pattern`` (matched
against the streams tier-2 records).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from quire.history import HistorySplit, list_streams, plan, read_split
from quire.history.plan import Bound
from quire.spark.stream_options import EARLIEST, LATEST, StreamOptions

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass
class HistoryPartition(InputPartition):
    """One split of one segment's history."""

    split: HistorySplit
    batch_rows: int
    read_bytes: int


def _bounds(opts: StreamOptions) -> tuple[Bound, Bound]:
    start: Bound = opts.start_time_ms
    end: Bound = opts.end_time_ms
    if isinstance(opts.start, dict):
        start = opts.start
    elif opts.start == LATEST:
        raise ValueError("read_mode tier2 reads history: start_stream_cut cannot be latest")
    if isinstance(opts.end, dict):
        end = opts.end
    return start, end


class Tier2HistoryReader(DataSourceReader):
    """A batch read of the selected streams' history out of tier-2."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        assert opts.tier2 is not None
        self._opts = opts
        self._schema = schema
        self._uri = opts.tier2

    def _streams(self) -> list[tuple[str, str]]:
        opts = self._opts
        if opts.pattern is None:
            return list(opts.streams)
        scope = opts.pattern[0]
        return [(scope, s) for s in list_streams(self._uri, scope) if opts.matches(scope, s)]

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts
        start, end = _bounds(opts)
        assert opts.start in (EARLIEST, LATEST) or isinstance(opts.start, dict)
        return [HistoryPartition(split, opts.batch_rows, opts.read_bytes)
                for scope, stream in self._streams()
                for split in plan(self._uri, scope, stream, start, end, opts.split_bytes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from quire.spark.stream_source import arrow_schema

        if not isinstance(partition, HistoryPartition):
            return iter(())  # Spark's stand-in partition when there are none
        return read_split(partition.split, arrow_schema(self._schema), partition.batch_rows,
                          max(partition.read_bytes, 4 << 20))
