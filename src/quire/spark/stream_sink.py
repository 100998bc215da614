"""Writing DataFrames to Quire (or Pravega) streams: ``format("quire")`` with
``option("stream", "scope/stream")``, or a ``stream`` column routing each
row to its stream.

::

    (df.write.format("quire").option("controller", "tcp://127.0.0.1:9090")
       .option("stream", "shop/orders").mode("append").save())
    (df.writeStream.format("quire").option("controller", uri)
       .option("stream", "shop/orders").option("sink_id", "orders-etl")
       .option("checkpointLocation", path).start())
    (events.selectExpr("payload AS event", "concat('shop/', kind) AS stream")
       .writeStream.format("quire").option("controller", uri)      # fan-out
       .option("sink_id", "split-by-kind").option("checkpointLocation", path).start())

Rows give column ``event`` (binary, or string as UTF-8) and, if the
DataFrame has it, ``routing_key`` (string; null: no key, so any segment);
other columns are ignored.  Events of one key keep the DataFrame's order
(partition order, then row order).  Options and stream creation:
:mod:`quire.spark.sink_options`; the tasks: :mod:`quire.spark.sink_tasks`.

A batch write is all or nothing: each task attempt opens its own stream
transaction (per stream its rows go to), registers it (see
:mod:`quire.spark.stream_commits`), writes its rows into it and pings it
while writing; the driver's commit records the successful attempts'
transactions (in partition order) durably, then commits them one by one,
pinging the rest; failed and retried attempts' transactions are aborted.
A driver that dies after the record is rolled forward by the next write to
the stream, or by :func:`recover_stream_writes`.  A streaming sink commits
micro-batch ``n`` exactly once per ``sink_id``: the sink's record moves to
``n`` with the batch's transactions before they are committed, and a
replayed ``n`` is aborted.  Rows routed to several streams commit as one
decision across all of them (:mod:`quire.spark.fanout_commits`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from quire.errors import QuireError
from quire.spark._runtime import runtime
from quire.spark.fanout_commits import FanOutCommits, fanout_sink_write_id
from quire.spark.sink_options import StreamSinkOptions, _columns, stream_column
from quire.spark.sink_tasks import (
    StreamCommitMessage,
    _write_task,
    commits_of,
    ensure_stream,
    ordered_txns,
    reported_txns,
    routed_txns,
)
from quire.spark.stream_commits import RecoveryReport, sink_batch_write_id
from quire.spark.stream_read import stream_clients
from quire.streams import StreamAccess, controller_uri

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["StreamBatchWriter", "StreamCommitMessage", "StreamSinkOptions", "StreamSinkWriter",
           "_columns", "_write_task", "batch_writer", "recover_stream_writes", "stream_writer"]

log = logging.getLogger("quire.spark.streams")

BATCH_ID_PROPERTY = "streaming.sql.batchId"


def recover_stream_writes(controller: str | None = None, scope: str | None = None,
                          stream: str | None = None, *, tls_ca: str | None = None,
                          credentials_file: str | None = None) -> RecoveryReport:
    """Finish the Spark writes to streams whose driver died after recording
    their commit (all streams, one scope's, or one stream's; a write across
    several streams from any of them), from any process; what was done.
    Run it within ``txn_lease`` of the crash (a later write to the same
    stream does it too).  A cluster with TLS or auth: ``tls_ca`` and a
    ``credentials_file`` as the options say."""
    access = StreamAccess.of(controller_uri(controller), tls_ca, credentials_file)

    async def go() -> RecoveryReport:
        controller_client, segments = await stream_clients(access)
        return await FanOutCommits(controller_client, segments).recover(scope, stream)

    return runtime().run(go())


# --- batch write ------------------------------------------------------------------------


class StreamBatchWriter(DataSourceArrowWriter):
    """One all-or-nothing write to a stream, or to the streams its rows name
    (one id, transactions per task and stream)."""

    def __init__(self, opts: StreamSinkOptions, write_id: str, event: str,
                 key: str | None, routed: str | None = None) -> None:
        self._opts = opts
        self.write_id = write_id
        self._event = event
        self._key = key
        self._routed = routed

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamCommitMessage:
        return _write_task(self._opts, self.write_id, self._event, self._key, iterator,
                           self._routed)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self._opts

        async def commit() -> int:
            commits = await commits_of(opts)
            if self._routed is not None:
                txns = routed_txns(messages)
                return await commits.commit_fanout(self.write_id, txns) if txns else 0
            return await commits.commit_write(self.write_id, opts.scope, opts.stream,
                                              ordered_txns(messages))

        runtime().run(commit())

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self._opts

        async def abort() -> RecoveryReport:
            commits = await commits_of(opts)
            if self._routed is not None:
                return await commits.abort_fanout(self.write_id, routed_txns(messages))
            return await commits.abort_write(self.write_id, opts.scope, opts.stream,
                                             reported_txns(messages))

        runtime().run(abort())


def _parse(options: Mapping[str, str], schema: StructType, overwrite: bool, mode: str
           ) -> tuple[StreamSinkOptions, str, str | None, str | None]:
    if overwrite:
        raise ValueError(f"a stream is append-only: use {mode}('append')")
    routed = stream_column(schema)
    opts = StreamSinkOptions.parse(options, routed=routed is not None)
    if opts.stream:
        routed = None  # option stream names the stream: a stream column is data
    event, key = _columns(schema)
    return opts, event, key, routed


def batch_writer(options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> StreamBatchWriter:
    """The writer of ``df.write.format("quire")`` to streams: it first
    creates the stream if missing and finishes its interrupted writes."""
    opts, event, key, routed = _parse(options, schema, overwrite, "mode")
    if routed is None:
        _prepare(opts)
    return StreamBatchWriter(opts, uuid.uuid4().hex, event, key, routed)


def _prepare(opts: StreamSinkOptions) -> None:
    async def prepare() -> RecoveryReport:
        await ensure_stream(opts, opts.scope, opts.stream)
        return await (await commits_of(opts)).recover(opts.scope, opts.stream)

    report = runtime().run(prepare())
    if report.rolled_forward:
        log.warning("stream %s/%s: rolled forward interrupted writes %s", opts.scope,
                    opts.stream, report.rolled_forward)


# --- streaming write --------------------------------------------------------------------


class StreamSinkWriter(DataSourceStreamArrowWriter):
    """Exactly-once sink: micro-batch ``n`` is committed once per sink id."""

    def __init__(self, opts: StreamSinkOptions, event: str, key: str | None,
                 routed: str | None = None) -> None:
        self._opts = opts
        self._event = event
        self._key = key
        self._routed = routed

    @property
    def sink_id(self) -> str:
        assert self._opts.sink_id is not None
        return self._opts.sink_id

    def _write_id(self, batch_id: int) -> str:
        if self._routed is not None:
            return fanout_sink_write_id(self.sink_id, batch_id)
        return sink_batch_write_id(self._opts.scope, self._opts.stream, self.sink_id, batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if batch is None:
            raise QuireError("a stream sink task without Spark's batch id")
        return _write_task(self._opts, self._write_id(int(batch)), self._event, self._key,
                           iterator, self._routed)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self._opts

        async def commit() -> bool:
            commits = await commits_of(opts)
            if self._routed is not None:
                txns = routed_txns(messages)
                return await commits.commit_fanout_sink(self.sink_id, batchId, txns) \
                    if txns else True
            return await commits.commit_sink_batch(opts.scope, opts.stream, self.sink_id,
                                                   batchId, ordered_txns(messages))

        if not runtime().run(commit()):
            log.info("sink %s: batch %d was committed before; replay dropped", self.sink_id,
                     batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self._opts

        async def abort() -> RecoveryReport:
            commits = await commits_of(opts)
            if self._routed is not None:
                return await commits.abort_fanout(self._write_id(batchId),
                                                  routed_txns(messages))
            return await commits.abort_write(self._write_id(batchId), opts.scope,
                                             opts.stream, reported_txns(messages))

        runtime().run(abort())


def stream_writer(options: Mapping[str, str], schema: StructType,
                  overwrite: bool) -> StreamSinkWriter:
    """The writer of ``df.writeStream.format("quire")`` to streams."""
    opts, event, key, routed = _parse(options, schema, overwrite, "outputMode")
    if opts.sink_id is None:
        raise ValueError("a quire stream sink needs option 'sink_id' (stable across "
                         "restarts of the query: it keys exactly-once commits)")
    if routed is None:
        _prepare(opts)
    return StreamSinkWriter(opts, event, key, routed)
