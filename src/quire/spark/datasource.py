"""The ``quire`` data source: ``spark.read.format("quire")`` and friends.

It serves named logs (option ``log``: :mod:`quire.spark.source`, options
:mod:`quire.spark.options`) and streams (options ``stream``, ``streams``,
``stream_pattern``: :mod:`quire.spark.stream_source`, options
:mod:`quire.spark.stream_options`; writes: :mod:`quire.spark.stream_sink`),
tables about streams (``metadata_table``: :mod:`quire.spark.metadata_tables`)
and streams' history in tier-2 alone (``read_mode`` ``tier2``:
:mod:`quire.spark.tier2_history`).  Every option: ``docs/spark.md``.
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
)
from pyspark.sql.types import StructType

from quire.errors import QuireError
from quire.log import Job, LogJobs, LogStore
from quire.spark._runtime import runtime
from quire.spark.io import live_bookie_count
from quire.spark.options import QuireOptions
from quire.spark.source import (
    SCHEMA,
    QuireBatchReader,
    QuireBatchWriter,
    QuireStreamReader,
    QuireStreamWriter,
    check_read_schema,
    payload_column,
)
from quire.spark.stream_options import TIER2, StreamOptions, is_stream_read
from quire.spark.stream_source import (
    STREAM_SCHEMA,
    StreamBatchReader,
    StreamMicroBatchReader,
    check_stream_schema,
)

log = logging.getLogger("quire.spark")


class QuireDataSource(DataSource):
    """``spark.read.format("quire")`` and friends; see the module docstring
    and :mod:`quire.spark.options` for the options."""

    @classmethod
    def name(cls) -> str:
        return "quire"

    def schema(self) -> StructType:
        from quire.spark.metadata_tables import metadata_table_schema

        table = metadata_table_schema(self.options)
        if table is not None:
            return table
        if is_stream_read(self.options):
            return STREAM_SCHEMA
        return SCHEMA

    def _writes_streams(self, schema: StructType) -> bool:
        """A write to streams: option ``stream``, or (no ``log``) a ``stream``
        column routing each row to its stream."""
        return bool(self.options.get("stream")) or (
            not self.options.get("log")
            and "stream" in (name.lower() for name in schema.fieldNames()))

    def _options(self) -> QuireOptions:
        return QuireOptions.parse(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.options.get("metadata_table"):
            from quire.spark.metadata_tables import MetadataTableReader

            return MetadataTableReader(self.options)
        if is_stream_read(self.options):
            opts = StreamOptions.parse(self.options)
            if opts.read_mode == TIER2:
                from quire.spark.tier2_history import Tier2HistoryReader

                return Tier2HistoryReader(opts, check_stream_schema(schema))
            return StreamBatchReader(opts, check_stream_schema(schema))
        return QuireBatchReader(self._options(), check_read_schema(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if self._writes_streams(schema):  # streams, not a named log
            from quire.spark.stream_sink import batch_writer

            return batch_writer(self.options, schema, overwrite)
        opts = self._options()
        column = payload_column(schema)

        async def begin(logs: LogStore) -> tuple[Job, tuple[int, int, int]]:
            jobs = LogJobs(logs)
            try:
                await jobs.collect_garbage(opts.log)  # opportunistic, this log only
            except QuireError as e:
                log.warning("garbage collection of log %s failed: %s", opts.log, e)
            job = await jobs.begin_job(opts.log, ttl_ms=opts.job_ttl_ms, create=opts.create)
            return job, opts.quorums(await live_bookie_count(logs))

        job, quorums = runtime().with_logs(opts.metadata, opts.password, begin, opts.client_config)
        return QuireBatchWriter(opts, job, quorums, column, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if is_stream_read(self.options):
            opts = StreamOptions.parse(self.options)
            if opts.read_mode == TIER2 or self.options.get("metadata_table"):
                raise ValueError("read_mode tier2 and metadata tables are batch reads")
            return StreamMicroBatchReader(opts, check_stream_schema(schema))
        return QuireStreamReader(self._options(), check_read_schema(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        if self._writes_streams(schema):  # streams, not a named log
            from quire.spark.stream_sink import stream_writer

            return stream_writer(self.options, schema, overwrite)
        opts = self._options()
        if opts.sink_id is None:
            raise ValueError("a quire stream sink needs option 'sink_id' (stable across "
                             "restarts of the query: it keys exactly-once commits)")
        return QuireStreamWriter(opts, payload_column(schema), overwrite)
