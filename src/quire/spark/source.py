"""The ``quire`` PySpark data source over named logs: batch and streaming
reads and writes (the data source itself, which picks a log's or a
stream's, is :mod:`quire.spark.datasource`; streams:
:mod:`quire.spark.stream_source`).

Reading gives one row per log entry::

    ledger_seq long, ledger_id long, entry_id long, payload binary

Batch reads plan one input partition per ledger (or per
``partition_entries`` of it), fixed at planning time: an open ledger is read
up to the LastAddConfirmed the planner saw.

Writes take the ``payload`` column (binary, or string as UTF-8; other
columns are ignored).  A batch write is one *job*: ``writer()`` creates the
job record; each task creates a VD_JOURNAL ledger, registers it with the job,
writes, syncs and closes it and reports it in its commit message; the
driver's commit appends the reported ledgers (in partition order) to the log
in one transaction together with the job's change to committed, so readers
see the whole write or none of it.  Ledgers of failed or retried task
attempts are deleted (abort, commit cleanup, or ``collect_garbage`` for jobs
older than ``job_ttl``).  ``mode("overwrite")`` replaces the log's ledgers in
the same transaction.

Streams: offsets are ``{"ledger_seq": s, "entry_id": e}``, the next position
to read; ``max_rows_per_trigger`` / ``max_bytes_per_trigger`` bound a
micro-batch (bytes are estimated from the ledgers' average entry size).  A
stream sink publishes each micro-batch exactly once: the sink record
``logs/<log>/sinks/<sink_id>`` holds the last committed batch id and moves in
the same transaction as the batch's ledgers; a replayed batch id is dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from quire.log import (
    GarbageReport,
    Job,
    LedgerRecord,
    LogInfo,
    LogJobs,
    LogStore,
    LogTruncatedError,
    Position,
)
from quire.spark._runtime import runtime
from quire.spark.io import (
    LedgerRange,
    QuireCommitMessage,
    TaskLedgerWriter,
    live_bookie_count,
    read_range,
)
from quire.spark.options import QuireOptions
from quire.types import LedgerState

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("quire.spark")

SCHEMA = StructType([
    StructField("ledger_seq", LongType(), nullable=False),
    StructField("ledger_id", LongType(), nullable=False),
    StructField("entry_id", LongType(), nullable=False),
    StructField("payload", BinaryType(), nullable=False),
])
"""The rows of a log."""

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""Local property Spark sets on the tasks of a micro-batch."""


def check_read_schema(schema: StructType) -> StructType:
    """Reads produce :data:`SCHEMA`'s columns; a user schema may only change
    nullability."""
    ours = [(f.name, f.dataType) for f in SCHEMA.fields]
    if [(f.name, f.dataType) for f in schema.fields] != ours:
        raise ValueError(f"the quire data source reads {SCHEMA.simpleString()}, not "
                         f"{schema.simpleString()}")
    return schema


def payload_column(schema: StructType) -> str:
    for f in schema.fields:
        if f.name.lower() == "payload":
            if not isinstance(f.dataType, BinaryType | StringType):
                raise ValueError(f"column payload must be binary or string, not "
                                 f"{f.dataType.simpleString()}")
            return f.name
    raise ValueError(f"the quire data source writes column 'payload' (binary or string); "
                     f"the DataFrame has {schema.fieldNames()}")


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# --- planning ---------------------------------------------------------------------------


async def _last_entry(logs: LogStore, record: LedgerRecord) -> int:
    """The last readable entry of a ledger of the log: its end if closed, else
    its LastAddConfirmed now."""
    if record.closed:
        return (record.entries or 0) - 1
    handle = await logs.client.open_ledger(record.ledger_id, password=logs.password,
                                           recovery=False)
    try:
        if handle.is_closed:
            return handle.last_add_confirmed
        return await handle.read_last_add_confirmed()
    finally:
        await handle.close()


def _split(opts: QuireOptions, record: LedgerRecord, first: int, last: int,
           missing_ok: bool = False) -> list[LedgerRange]:
    ranges = []
    step = opts.partition_entries
    for start in range(first, last + 1, step):
        ranges.append(LedgerRange(
            metadata=opts.metadata, log=opts.log, password=opts.password,
            ledger_seq=record.seq, ledger_id=record.ledger_id, first=start,
            last=min(last, start + step - 1), batch_entries=opts.batch_entries,
            missing_ok=missing_ok, client_config=opts.client_config))
    return ranges


async def plan_ranges(logs: LogStore, opts: QuireOptions, start: Position,
                      end: Position | None, *, missing_ok: bool = False,
                      info: LogInfo | None = None) -> list[LedgerRange]:
    """Input partitions covering the log's entries at positions in
    ``[start, end)`` (``end`` None: up to what is readable now)."""
    info = info or await logs.info(opts.log)
    ranges: list[LedgerRange] = []
    for record in info.ledgers:
        if record.seq < start.ledger_seq:
            continue
        if end is not None and (record.seq > end.ledger_seq
                                or (record.seq == end.ledger_seq and end.entry_id == 0)):
            break
        first = start.entry_id if record.seq == start.ledger_seq else 0
        last = await _last_entry(logs, record)
        if end is not None and record.seq == end.ledger_seq:
            last = min(last, end.entry_id - 1)
        if last >= first:
            ranges += _split(opts, record, first, last, missing_ok)
        if not record.closed and end is None:
            break  # nothing after an open ledger is readable yet
    return ranges


class QuireBatchReader(DataSourceReader):
    """Plans ledger ranges on the driver; reads them in tasks."""

    def __init__(self, opts: QuireOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts

        async def plan(logs: LogStore) -> list[LedgerRange]:
            info = await logs.info(opts.log)
            start = opts.start_position or info.truncated_before
            if start < info.truncated_before and info.ledger(start.ledger_seq) is None:
                raise LogTruncatedError(f"log {opts.log!r}: start {start} was truncated "
                                        f"(entries before {info.truncated_before} are gone)")
            return await plan_ranges(logs, opts, start, opts.end, info=info)

        ranges = runtime().with_logs(opts.metadata, opts.password, plan, opts.client_config)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerRange):
            return iter(())  # Spark's stand-in partition when there are none
        return read_range(partition, _arrow_schema(self._schema))


# --- batch write ----------------------------------------------------------------------


def _payloads(batch: pa.RecordBatch, column: str) -> list[bytes]:
    import pyarrow as pa

    array = batch.column(batch.schema.get_field_index(column))
    if array.null_count:
        raise ValueError("column payload holds nulls: a log entry cannot be null")
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = array.cast(pa.binary() if pa.types.is_string(array.type)
                           else pa.large_binary())
    payloads: list[bytes] = array.to_pylist()
    return payloads


def _write_task(opts: QuireOptions, job: Job, quorums: tuple[int, int, int] | None,
                column: str, batches: Iterator[pa.RecordBatch],
                batch_id: int | None = None) -> QuireCommitMessage:
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    rt = runtime()

    async def prepare(logs: LogStore) -> tuple[LogStore, tuple[int, int, int]]:
        return logs, quorums or opts.quorums(await live_bookie_count(logs))

    logs, resolved = rt.with_logs(opts.metadata, opts.password, prepare, opts.client_config)
    writer = TaskLedgerWriter(rt, LogJobs(logs), job, resolved, batch_id=batch_id,
                              task=f"partition {partition} attempt {attempt}")
    try:
        for batch in batches:
            writer.write(_payloads(batch, column))
        ledger_ids = writer.finish()
    except BaseException:
        writer.discard()
        raise
    return QuireCommitMessage(partition_id=partition, attempt=attempt, ledger_ids=ledger_ids,
                              rows=writer.rows, bytes=writer.bytes)


def _committed_ledgers(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    """The ledgers of the successful attempts, in partition order."""
    ordered = sorted((m for m in messages if isinstance(m, QuireCommitMessage)),
                     key=lambda m: m.partition_id)
    return [ledger_id for m in ordered for ledger_id in m.ledger_ids]


def _reported_ledgers(messages: Sequence[WriterCommitMessage | None]) -> list[int]:
    return [i for m in messages if isinstance(m, QuireCommitMessage) for i in m.ledger_ids]


class QuireBatchWriter(DataSourceArrowWriter):
    """One write job: tasks write ledgers, the commit publishes them at once."""

    def __init__(self, opts: QuireOptions, job: Job, quorums: tuple[int, int, int],
                 column: str, overwrite: bool) -> None:
        self._opts = opts
        self._job = job
        self._quorums = quorums
        self._column = column
        self._overwrite = overwrite

    @property
    def job(self) -> Job:
        return self._job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QuireCommitMessage:
        return _write_task(self._opts, self._job, self._quorums, self._column, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        ledger_ids = _committed_ledgers(messages)
        job, overwrite = self._job, self._overwrite

        async def commit(logs: LogStore) -> list[int]:
            return await LogJobs(logs).commit_job(job, ledger_ids, replace=overwrite)

        runtime().with_logs(self._opts.metadata, self._opts.password, commit,
                                   self._opts.client_config)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        job = self._job

        async def abort(logs: LogStore) -> list[int]:
            return await LogJobs(logs).abort_job(job)

        runtime().with_logs(self._opts.metadata, self._opts.password, abort,
                                   self._opts.client_config)


# --- streaming read ---------------------------------------------------------------------


def _offset(position: Position) -> dict[str, int]:
    return {"ledger_seq": position.ledger_seq, "entry_id": position.entry_id}


def _position(offset: dict[str, Any]) -> Position:
    return Position(int(offset["ledger_seq"]), int(offset["entry_id"]))


class QuireStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a log; offsets are positions (the next to read)."""

    def __init__(self, opts: QuireOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema
        self._target: Position | None = None

    def _with_logs(self, fn: Any) -> Any:
        return runtime().with_logs(self._opts.metadata, self._opts.password, fn,
                                   self._opts.client_config)

    def initialOffset(self) -> dict[str, int]:
        opts = self._opts

        async def initial(logs: LogStore) -> Position:
            if opts.create:
                await logs.create(opts.log, exist_ok=True)
            info = await logs.info(opts.log)
            if opts.start == "latest":
                return await self._tail(logs, info)
            return opts.start_position or info.truncated_before

        position: Position = self._with_logs(initial)
        return _offset(position)

    async def _tail(self, logs: LogStore, info: LogInfo) -> Position:
        """The position after the last readable entry of the log now."""
        tail = info.truncated_before
        for record in info.ledgers:
            last = await _last_entry(logs, record)
            tail = max(tail, Position(record.seq, last + 1))
            if not record.closed:
                break
        return tail

    def prepareForTriggerAvailableNow(self) -> None:
        async def target(logs: LogStore) -> Position:
            return await self._tail(logs, await logs.info(self._opts.log))

        self._target = self._with_logs(target)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self._opts.max_rows_per_trigger)
        if self._opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _check_loss(self, info: LogInfo, start: Position) -> Position:
        """``start``, or where to go on if truncation removed it (raises
        LogTruncatedError when ``fail_on_data_loss``)."""
        if start >= info.truncated_before or info.ledger(start.ledger_seq) is not None:
            return start
        if self._opts.fail_on_data_loss:
            raise LogTruncatedError(
                f"log {self._opts.log!r}: offset {start} was truncated (entries before "
                f"{info.truncated_before} are gone); set fail_on_data_loss=false to skip "
                "ahead")
        log.warning("log %s: offset %s was truncated; skipping to %s", self._opts.log, start,
                    info.truncated_before)
        return info.truncated_before

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts = self._opts
        rows = bytes_ = None
        if not isinstance(limit, ReadAllAvailable):
            rows = limit.max_rows if isinstance(limit, ReadMaxRows) \
                else opts.max_rows_per_trigger
            bytes_ = limit.max_bytes if isinstance(limit, ReadMaxBytes) \
                else opts.max_bytes_per_trigger
        target = self._target

        async def latest(logs: LogStore) -> Position | None:
            info = await logs.info(opts.log, from_seq=_position(start).ledger_seq)
            position = self._check_loss(info, _position(start))
            taken = used = 0
            end: Position | None = None
            for record in info.ledgers:
                if record.seq < position.ledger_seq:
                    continue
                if target is not None and record.seq > target.ledger_seq:
                    break
                first = position.entry_id if record.seq == position.ledger_seq else 0
                last = await _last_entry(logs, record)
                if target is not None and record.seq == target.ledger_seq:
                    last = min(last, target.entry_id - 1)
                count = last - first + 1
                if count > 0:
                    if rows is not None:
                        count = min(count, rows - taken)
                    if bytes_ is not None:
                        size = await _entry_size(logs, record, first)
                        fits = (bytes_ - used) // max(size, 1)
                        count = min(count, fits if taken or fits > 0 else 1)
                        used += count * size
                    if count <= 0:
                        break
                    taken += count
                    end = Position(record.seq, first + count)
                    if (rows is not None and taken >= rows) or \
                            (bytes_ is not None and used >= bytes_):
                        break
                if not record.closed:
                    break
            return end

        end: Position | None = self._with_logs(latest)
        return start if end is None else _offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        opts = self._opts
        if start == end:
            return []

        async def plan(logs: LogStore) -> list[LedgerRange]:
            info = await logs.info(opts.log, from_seq=_position(start).ledger_seq)
            first = self._check_loss(info, _position(start))
            return await plan_ranges(logs, opts, first, _position(end),
                                     missing_ok=not opts.fail_on_data_loss, info=info)

        ranges: list[LedgerRange] = self._with_logs(plan)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, LedgerRange):
            return iter(())  # Spark's stand-in partition when there are none
        return read_range(partition, _arrow_schema(self._schema))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint."""


async def _entry_size(logs: LogStore, record: LedgerRecord, first: int) -> int:
    """Average payload bytes per entry of a ledger: exact for a closed one
    (its length / entries); for an open one, measured on a sample read at
    ``first``."""
    if record.closed and record.entries:
        return max(1, (record.bytes or 0) // record.entries)
    handle = await logs.client.open_ledger(record.ledger_id, password=logs.password,
                                           recovery=False)
    try:
        md = handle.metadata
        if md.state is LedgerState.CLOSED and md.last_entry_id >= 0:
            return max(1, md.length // (md.last_entry_id + 1))
        last = await handle.read_last_add_confirmed()
        if last < first:
            return 1
        sample = await handle.batch_read(first, min(last, first + 63) - first + 1, 1 << 20)
        return max(1, sum(len(e.data) for e in sample) // len(sample))
    finally:
        await handle.close()


# --- streaming write ----------------------------------------------------------------------


class QuireStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once sink: micro-batch ``n`` is published with the sink record
    moving to ``n`` in one transaction; a replayed ``n`` is dropped."""

    def __init__(self, opts: QuireOptions, column: str, overwrite: bool) -> None:
        self._opts = opts
        self._column = column
        self._overwrite = overwrite

    @property
    def sink_id(self) -> str:
        assert self._opts.sink_id is not None
        return self._opts.sink_id

    def _job(self, logs: LogStore) -> Any:
        return LogJobs(logs).sink_job(self._opts.log, self.sink_id,
                                      ttl_ms=self._opts.job_ttl_ms, create=self._opts.create)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> QuireCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        job: Job = runtime().with_logs(self._opts.metadata, self._opts.password, self._job,
                                   self._opts.client_config)
        return _write_task(self._opts, job, None, self._column, iterator,
                           batch_id=None if batch is None else int(batch))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ledger_ids = _committed_ledgers(messages)
        overwrite = self._overwrite

        async def commit(logs: LogStore) -> bool:
            job = await self._job(logs)
            return await LogJobs(logs).commit_sink_batch(job, self.sink_id, batchId,
                                                         ledger_ids, replace=overwrite)

        if not runtime().with_logs(self._opts.metadata, self._opts.password, commit,
                                   self._opts.client_config):
            log.info("sink %s of log %s: batch %d was committed before; replay dropped",
                     self.sink_id, self._opts.log, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        ledger_ids = _reported_ledgers(messages)

        async def abort(logs: LogStore) -> None:
            job = await self._job(logs)
            await LogJobs(logs).abort_sink_batch(job, batchId, ledger_ids)

        runtime().with_logs(self._opts.metadata, self._opts.password, abort,
                                   self._opts.client_config)


# --- maintenance ---------------------------------------------------------------------------


def collect_garbage(metadata: str, log_name: str | None = None, *,
                    password: str = "") -> GarbageReport:
    """Run :meth:`quire.log.LogJobs.collect_garbage` (jobs that never
    committed within their ``job_ttl``, interrupted cleanups, expired sink
    registrations) on one log or all, from any process."""
    async def collect(logs: LogStore) -> GarbageReport:
        return await LogJobs(logs).collect_garbage(log_name)

    report: GarbageReport = runtime().with_logs(metadata, password.encode(), collect)
    return report

