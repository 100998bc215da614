"""Writing DataFrames to Quire (or Pravega) streams: ``format("quire")`` with
``option("stream", "scope/stream")``.

::

    (df.write.format("quire").option("controller", "tcp://127.0.0.1:9090")
       .option("stream", "shop/orders").mode("append").save())
    (df.writeStream.format("quire").option("controller", uri)
       .option("stream", "shop/orders").option("sink_id", "orders-etl")
       .option("checkpointLocation", path).start())

Rows give column ``event`` (binary, or string as UTF-8) and, if the
DataFrame has it, ``routing_key`` (string; null: no key, so any segment);
other columns are ignored.  Events of one key keep the DataFrame's order
(partition order, then row order).

A batch write is all or nothing: each task attempt opens its own stream
transaction, registers it (see :mod:`quire.spark.stream_commits`), writes
its rows into it and pings it while writing; the driver's commit records
the successful attempts' transactions (in partition order) durably, then
commits them one by one, pinging the rest; failed and retried attempts'
transactions are aborted.  A driver that dies after the record is rolled
forward by the next write to the stream, or by :func:`recover_stream_writes`.
A streaming sink commits micro-batch ``n`` exactly once per ``sink_id``: the
sink's record moves to ``n`` with the batch's transactions before they are
committed, and a replayed ``n`` is aborted.

================  ===============================================================
option            meaning
================  ===============================================================
stream            ``scope/stream`` to write (it must exist)
controller        controller URI, ``tcp://host:port`` or ``tls://host:port``
                  (default ``$QUIRE_CONTROLLER``, else ``tcp://127.0.0.1:9090``)
tls_ca            CA certificates (PEM file, on every executor) trusted for a
                  ``tls://`` controller and its segment stores
credentials_file  TOML file (mode 0600, read by the driver) with ``username``
                  and ``password``; or give ``username`` and ``password``
                  (a cluster with auth on: the user needs READ_UPDATE on the
                  stream, which also guards the write's commit records)
sink_id           streaming write: the sink's stable id (required)
txn_lease         lease of the transactions, renewed by pings (duration,
                  default ``120s``, at most the controller's maximum); a
                  crashed driver's write must be rolled forward within it
================  ===============================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from quire.errors import QuireError
from quire.security import Credentials
from quire.spark._runtime import runtime
from quire.spark.options import parse_duration_ms
from quire.spark.stream_commits import (
    RecoveryReport,
    StreamCommits,
    sink_batch_write_id,
)
from quire.spark.stream_options import access_options
from quire.streams import (
    ControllerClient,
    RemoteSegmentStore,
    StreamAccess,
    StreamTransaction,
    controller_uri,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("quire.spark.streams")

BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class StreamSinkOptions:
    """The options of a write to a stream (see the module docstring)."""

    scope: str
    stream: str
    controller: str
    sink_id: str | None = None
    txn_lease_ms: int = 120_000
    tls_ca: str | None = None
    credentials: Credentials | None = None

    @property
    def access(self) -> StreamAccess:
        return StreamAccess(self.controller, self.tls_ca, self.credentials)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamSinkOptions:
        """Parse Spark's options; ValueError names the bad one."""
        target = (options.get("stream") or "").strip()
        scope, sep, stream = target.partition("/")
        if not sep or not scope or not stream or "/" in stream:
            raise ValueError(f"option stream must be scope/stream, got {target!r}")
        access = access_options(options)
        lease = parse_duration_ms(options.get("txn_lease") or "120s")
        if lease <= 0:
            raise ValueError("option txn_lease must be positive")
        sink_id = options.get("sink_id")
        if sink_id is not None and (not sink_id.strip() or "/" in sink_id):
            raise ValueError(f"option sink_id must be a non-empty name without '/', "
                             f"got {sink_id!r}")
        return cls(scope, stream, access.controller, sink_id, lease, access.tls_ca,
                   access.credentials)


def _columns(schema: StructType) -> tuple[str, str | None]:
    """The names of the event column and of the routing key column (if any)."""
    event = key = None
    for f in schema.fields:
        name = f.name.lower()
        if name == "event":
            if not isinstance(f.dataType, BinaryType | StringType):
                raise ValueError(f"column event must be binary or string, not "
                                 f"{f.dataType.simpleString()}")
            event = f.name
        elif name == "routing_key":
            if not isinstance(f.dataType, StringType):
                raise ValueError(f"column routing_key must be a string, not "
                                 f"{f.dataType.simpleString()}")
            key = f.name
    if event is None:
        raise ValueError(f"a write to a stream takes column 'event' (binary or string) and "
                         f"optionally 'routing_key'; the DataFrame has {schema.fieldNames()}")
    return event, key


# --- clients, one pair per process and controller ---------------------------------------

_clients: dict[tuple[int, StreamAccess], tuple[ControllerClient, RemoteSegmentStore]] = {}


async def stream_clients(access: StreamAccess) -> tuple[ControllerClient, RemoteSegmentStore]:
    """This process's controller client and segment store client for
    ``access`` (call on the runtime's loop; kept for the life of the process)."""
    key = (os.getpid(), access)
    found = _clients.get(key)
    if found is None:
        found = _clients[key] = access.clients()
    return found


async def _commits(opts: StreamSinkOptions) -> StreamCommits:
    controller, segments = await stream_clients(opts.access)
    return StreamCommits(controller, segments, lease_ms=opts.txn_lease_ms)


def recover_stream_writes(controller: str | None = None, scope: str | None = None,
                          stream: str | None = None, *, tls_ca: str | None = None,
                          credentials_file: str | None = None) -> RecoveryReport:
    """Finish the Spark writes to streams whose driver died after recording
    their commit (all streams, one scope's, or one stream's), from any
    process; what was done.  Run it within ``txn_lease`` of the crash (a
    later write to the same stream does it too).  A cluster with TLS or
    auth: ``tls_ca`` and a ``credentials_file`` as the options say."""
    access = StreamAccess.of(controller_uri(controller), tls_ca, credentials_file)

    async def go() -> RecoveryReport:
        controller_client, segments = await stream_clients(access)
        return await StreamCommits(controller_client, segments).recover(scope, stream)

    return runtime().run(go())


# --- tasks ------------------------------------------------------------------------------


@dataclass
class StreamCommitMessage(WriterCommitMessage):
    """One task attempt's transaction (None: it had no rows)."""

    partition_id: int
    attempt: int
    txn_id: int | None
    rows: int


def _events(batch: pa.RecordBatch, event: str, key: str | None
            ) -> tuple[list[bytes], list[str | None]]:
    import pyarrow as pa

    array = batch.column(batch.schema.get_field_index(event))
    if array.null_count:
        raise ValueError("column event holds nulls: an event cannot be null")
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary() if pa.types.is_string(array.type)
                           else pa.large_binary())
    events: list[bytes] = array.to_pylist()
    keys: list[str | None] = (batch.column(batch.schema.get_field_index(key)).to_pylist()
                              if key is not None else [None] * len(events))
    return events, keys


class _TaskTransaction:
    """A task attempt's transaction, written from Spark's thread through the
    process's runtime loop, pinged while it is written."""

    def __init__(self, opts: StreamSinkOptions, write_id: str, task: str) -> None:
        self.opts = opts
        self.write_id = write_id
        self.task = task
        self.txn: StreamTransaction | None = None
        self.rows = 0
        self._pending: list[asyncio.Future[None]] = []
        self._pinger: asyncio.Task[None] | None = None

    async def _begin(self) -> None:
        opts = self.opts
        commits = await _commits(opts)
        self.txn = await StreamTransaction.begin(commits.controller, commits.segments,
                                                 opts.scope, opts.stream,
                                                 lease_ms=opts.txn_lease_ms)
        try:
            await commits.register(self.write_id, opts.scope, opts.stream, self.txn.id,
                                   self.task)
        except BaseException:
            with contextlib.suppress(QuireError):
                await self.txn.abort()
            raise
        self._pinger = asyncio.ensure_future(self._keep_alive())

    async def _keep_alive(self) -> None:
        assert self.txn is not None
        while True:
            await asyncio.sleep(self.opts.txn_lease_ms / 4000)  # the lease renewal period
            try:
                await self.txn.ping(self.opts.txn_lease_ms)
            except QuireError as e:
                log.warning("ping of transaction %032x failed: %s", self.txn.id, e)

    async def _write(self, events: list[bytes], keys: list[str | None]) -> None:
        if self.txn is None:
            await self._begin()
        assert self.txn is not None
        previous, self._pending = self._pending, [
            self.txn.write_event(data, key) for data, key in zip(events, keys, strict=True)]
        if previous:  # one batch in flight while the next is converted
            await asyncio.gather(*previous)

    def write(self, events: list[bytes], keys: list[str | None]) -> None:
        runtime().run(self._write(events, keys))
        self.rows += len(events)

    async def _finish(self) -> int | None:
        if self.txn is None:
            return None
        await self.txn.flush()
        await self._stop_pinging()
        if not await self.txn.ping(self.opts.txn_lease_ms):  # a full lease for the commit
            raise QuireError(f"transaction {self.txn.id:032x} on {self.opts.scope}/"
                             f"{self.opts.stream} ended before its task did")
        return self.txn.id

    def finish(self) -> int | None:
        """Wait until every event is durable in the transaction; its id."""
        return runtime().run(self._finish())

    async def _stop_pinging(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pinger
            self._pinger = None

    async def _discard(self) -> None:
        await self._stop_pinging()
        if self.txn is None:
            return
        try:
            await self.txn.abort()
        except QuireError:
            return  # the registration stays: the driver's abort or a recovery ends it
        # Aborted: the registration has done its job.  The driver may already
        # have aborted the write: Spark fails a job without waiting for every
        # Python worker, so a worker can register after the driver's abort has
        # listed the registrations, and only the attempt itself removes that one.
        with contextlib.suppress(QuireError):
            commits = await _commits(self.opts)
            await commits.unregister(self.write_id, self.opts.scope, self.opts.stream,
                                     self.txn.id)

    def discard(self) -> None:
        """Abort the transaction (a failed attempt)."""
        runtime().run(self._discard())


def _write_task(opts: StreamSinkOptions, write_id: str, event: str, key: str | None,
                batches: Iterator[pa.RecordBatch]) -> StreamCommitMessage:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    txn = _TaskTransaction(opts, write_id, f"partition {partition} attempt {attempt}")
    try:
        for batch in batches:
            if batch.num_rows:
                txn.write(*_events(batch, event, key))
        txn_id = txn.finish()
    except BaseException:
        txn.discard()
        raise
    return StreamCommitMessage(partition, attempt, txn_id, txn.rows)


def _ordered_txns(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    """The successful attempts' transactions, in partition order."""
    ordered = sorted((m for m in messages if isinstance(m, StreamCommitMessage)),
                     key=lambda m: m.partition_id)
    return [m.txn_id for m in ordered if m.txn_id is not None]


def _reported_txns(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    return [m.txn_id for m in messages
            if isinstance(m, StreamCommitMessage) and m.txn_id is not None]


# --- batch write ------------------------------------------------------------------------


class StreamBatchWriter(DataSourceArrowWriter):
    """One all-or-nothing write to a stream (one id, transactions per task)."""

    def __init__(self, opts: StreamSinkOptions, write_id: str, event: str,
                 key: str | None) -> None:
        self._opts = opts
        self.write_id = write_id
        self._event = event
        self._key = key

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamCommitMessage:
        return _write_task(self._opts, self.write_id, self._event, self._key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        opts, txns = self._opts, _ordered_txns(messages)

        async def commit() -> int:
            commits = await _commits(opts)
            return await commits.commit_write(self.write_id, opts.scope, opts.stream, txns)

        runtime().run(commit())

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        opts, txns = self._opts, _reported_txns(messages)

        async def abort() -> RecoveryReport:
            commits = await _commits(opts)
            return await commits.abort_write(self.write_id, opts.scope, opts.stream, txns)

        runtime().run(abort())


def batch_writer(options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> StreamBatchWriter:
    """The writer of ``df.write.format("quire").option("stream", ...)``: it
    first finishes the stream's interrupted writes and checks the stream."""
    if overwrite:
        raise ValueError("a stream is append-only: use mode('append')")
    opts = StreamSinkOptions.parse(options)
    event, key = _columns(schema)
    _prepare(opts)
    return StreamBatchWriter(opts, uuid.uuid4().hex, event, key)


def _prepare(opts: StreamSinkOptions) -> None:
    async def prepare() -> RecoveryReport:
        commits = await _commits(opts)
        await commits.controller.current_segments(opts.scope, opts.stream)  # exists?
        return await commits.recover(opts.scope, opts.stream)

    report = runtime().run(prepare())
    if report.rolled_forward:
        log.warning("stream %s/%s: rolled forward interrupted writes %s", opts.scope,
                    opts.stream, report.rolled_forward)


# --- streaming write --------------------------------------------------------------------


class StreamSinkWriter(DataSourceStreamArrowWriter):
    """Exactly-once sink: micro-batch ``n`` is committed once per sink id."""

    def __init__(self, opts: StreamSinkOptions, event: str, key: str | None) -> None:
        self._opts = opts
        self._event = event
        self._key = key

    @property
    def sink_id(self) -> str:
        assert self._opts.sink_id is not None
        return self._opts.sink_id

    def _write_id(self, batch_id: int) -> str:
        return sink_batch_write_id(self._opts.scope, self._opts.stream, self.sink_id, batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        if batch is None:
            raise QuireError("a stream sink task without Spark's batch id")
        return _write_task(self._opts, self._write_id(int(batch)), self._event, self._key,
                           iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts, txns = self._opts, _ordered_txns(messages)

        async def commit() -> bool:
            commits = await _commits(opts)
            return await commits.commit_sink_batch(opts.scope, opts.stream, self.sink_id,
                                                   batchId, txns)

        if not runtime().run(commit()):
            log.info("sink %s of %s/%s: batch %d was committed before; replay dropped",
                     self.sink_id, opts.scope, opts.stream, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts, txns = self._opts, _reported_txns(messages)

        async def abort() -> RecoveryReport:
            commits = await _commits(opts)
            return await commits.abort_write(self._write_id(batchId), opts.scope, opts.stream,
                                             txns)

        runtime().run(abort())


def stream_writer(options: Mapping[str, str], schema: StructType,
                  overwrite: bool) -> StreamSinkWriter:
    """The writer of ``df.writeStream.format("quire").option("stream", ...)``."""
    if overwrite:
        raise ValueError("a stream is append-only: use outputMode('append')")
    opts = StreamSinkOptions.parse(options)
    if opts.sink_id is None:
        raise ValueError("a quire stream sink needs option 'sink_id' (stable across "
                         "restarts of the query: it keys exactly-once commits)")
    event, key = _columns(schema)
    _prepare(opts)
    return StreamSinkWriter(opts, event, key)
