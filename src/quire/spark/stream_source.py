"""The ``quire`` data source over *streams*: batch reads between cuts or
times, and micro-batch streaming reads whose offsets are a cut per stream.

``spark.read.format("quire").option("stream", "scope/stream")`` (or
``streams``, ``stream_pattern``; options: :mod:`quire.spark.stream_options`)
gives one row per event::

    event binary, scope string, stream string, segment_id long, offset long,
    timestamp timestamp

Batch reads plan one input partition per segment range between the start
and the end of each stream (:mod:`quire.spark.stream_plan`: segments and,
across scales, their successors), fixed at planning time.  With
``read_mode`` ``tier2`` they read the flushed history from tier-2 alone
(:mod:`quire.spark.tier2_history`).

Streaming reads: an offset is a cut per stream (:class:`~quire.spark.stream_cuts.Offsets`,
recorded in Spark's checkpoint); ``latestOffset`` plans from the last one
to each stream's tail now (or, under ``Trigger.AvailableNow``, the tail when
the query started), sharing ``max_rows_per_trigger`` /
``max_bytes_per_trigger`` among the streams; ``partitions(start, end)``
plans the same ranges again, so a batch replayed after a driver restart
reads exactly the same events.  Streams a pattern matches later join at the
next micro-batch, from their head.  ``commit`` publishes the committed
cuts as the query's subscriber stream cuts, so retention keeps what the
query has not committed (:mod:`quire.spark.stream_progress`), and each
batch notes the bytes left behind the tail (``reportLatestOffset``, read by
:func:`pyspark_quire.lag`).

With option ``tier2`` the planner reads each planned segment's tier-2
layout and the tasks read the flushed part from the chunks themselves
(:mod:`quire.spark.tier2_reads`), the tail through the segment store
(:mod:`quire.spark.stream_read`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from quire.spark._runtime import runtime
from quire.spark.stream_cuts import (
    Offsets,
    bytes_between,
    end_cut,
    planner,
    selected_streams,
    split_key,
    start_cut,
    stream_key,
)
from quire.spark.stream_options import Cut, StreamOptions, cut_to_json
from quire.spark.stream_plan import Budget, SegmentSpan, StreamDataLossError
from quire.spark.stream_progress import RetentionHold
from quire.spark.stream_read import SegmentRange, read_segment_range
from quire.spark.tier2_reads import plan_layouts
from quire.streams.model import segment_name

if TYPE_CHECKING:
    import pyarrow as pa

STREAM_SCHEMA = StructType([
    StructField("event", BinaryType(), nullable=False),
    StructField("scope", StringType(), nullable=False),
    StructField("stream", StringType(), nullable=False),
    StructField("segment_id", LongType(), nullable=False),
    StructField("offset", LongType(), nullable=False),
    StructField("timestamp", TimestampType(), nullable=True),
])
"""The rows of a stream."""

__all__ = ["STREAM_SCHEMA", "StreamBatchReader", "StreamDataLossError", "StreamMicroBatchReader",
           "check_stream_schema"]


def check_stream_schema(schema: StructType) -> StructType:
    """Stream reads produce :data:`STREAM_SCHEMA`'s columns; a user schema
    may only change nullability."""
    ours = [(f.name, f.dataType) for f in STREAM_SCHEMA.fields]
    if [(f.name, f.dataType) for f in schema.fields] != ours:
        raise ValueError(f"the quire data source reads a stream as "
                         f"{STREAM_SCHEMA.simpleString()}, not {schema.simpleString()}")
    return schema


def arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


async def _partitions(opts: StreamOptions, scope: str, stream: str,
                      spans: list[SegmentSpan]) -> list[SegmentRange]:
    layouts = {}
    if opts.tier2 is not None and spans:
        layouts = await plan_layouts(opts.tier2, [
            segment_name(scope, stream, s.segment_id) for s in spans])
    return [SegmentRange(
        controller=opts.controller, scope=scope, stream=stream,
        segment_id=s.segment_id, first=s.first, last=s.last,
        tier2=layouts.get(segment_name(scope, stream, s.segment_id)),
        fail_on_data_loss=opts.fail_on_data_loss, read_bytes=opts.read_bytes,
        batch_rows=opts.batch_rows, tls_ca=opts.tls_ca, credentials=opts.credentials,
        tls_cert=opts.tls_cert, tls_key=opts.tls_key)
        for s in spans]


def _read(partition: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, SegmentRange):
        return iter(())  # Spark's stand-in partition when there are none
    return read_segment_range(partition, arrow_schema(schema))


class StreamBatchReader(DataSourceReader):
    """A batch read of the events between each stream's start and end."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts

        async def plan() -> list[SegmentRange]:
            parts: list[SegmentRange] = []
            for scope, stream in await selected_streams(opts):
                p = await planner(opts, scope, stream)
                start, end = await start_cut(p, opts), await end_cut(p, opts)
                spans, _ = await p.plan_between(start, end)
                parts += await _partitions(opts, scope, stream, spans)
            return parts

        return runtime().run(plan())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self._schema)


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over streams; offsets are cuts per stream (module docstring)."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema
        self._target: dict[str, Cut] | None = None
        self._hold: RetentionHold | None = None
        self._latest: dict[str, Any] | None = None

    def _retention(self, subscriber: str | None) -> RetentionHold | None:
        if subscriber is None or not self._opts.hold_retention:
            return None
        if self._hold is None or self._hold.subscriber != subscriber:
            self._hold = RetentionHold(self._opts, subscriber)
        return self._hold

    def initialOffset(self) -> dict[str, Any]:
        opts = self._opts
        subscriber = None
        if opts.hold_retention:
            subscriber = opts.subscriber or f"spark-{uuid.uuid4().hex[:16]}"

        async def initial() -> Offsets:
            offsets = Offsets(subscriber=subscriber)
            for scope, stream in await selected_streams(opts):
                p = await planner(opts, scope, stream)
                offsets.streams[stream_key(scope, stream)] = await start_cut(p, opts)
            return offsets

        return runtime().run(initial()).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self._opts

        async def target() -> dict[str, Cut]:
            return {stream_key(scope, stream): await (await planner(opts, scope, stream))
                    .tail_cut() for scope, stream in await selected_streams(opts)}

        self._target = runtime().run(target())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self._opts.max_rows_per_trigger)
        if self._opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _budget(self, limit: ReadLimit, ways: int) -> Budget | None:
        """One stream's share of a micro-batch's limit (None: no limit)."""
        opts = self._opts
        if isinstance(limit, ReadAllAvailable):
            return None
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_rows_per_trigger
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) \
            else opts.max_bytes_per_trigger
        return Budget(rows=None if rows is None else max(1, rows // ways),
                      bytes=None if size is None else max(1, size // ways))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        opts, target = self._opts, self._target
        begun = Offsets.from_json(start, opts)
        hold = self._retention(begun.subscriber)

        async def latest() -> tuple[Offsets, dict[str, Any]]:
            keys = dict.fromkeys([*begun.streams, *(stream_key(*s) for s in
                                                    await selected_streams(opts))])
            if target is not None:
                keys = dict.fromkeys(k for k in keys if k in target)
            end = Offsets(subscriber=begun.subscriber)
            tails: dict[str, dict[str, int]] = {}
            lag: dict[str, int] = {}
            for key in keys:
                p = await planner(opts, *split_key(key))
                first = begun.streams.get(key)
                if first is None:  # a stream new to the query joins at its head
                    first = end.joined[key] = await p.head_cut()
                if hold is not None:
                    await hold.subscribe(key, first)
                tail = await p.tail_cut()
                _spans, cut = await p.plan_between(
                    first, target[key] if target is not None else tail,
                    self._budget(limit, len(keys)))
                end.streams[key] = cut
                tails[key] = cut_to_json(tail)
                lag[key] = await bytes_between(p, cut, tail)
            return end, {"streams": tails, "lag_bytes": lag}

        end, self._latest = runtime().run(latest())
        return end.to_json()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Each stream's tail when the last batch was planned, and the bytes
        the query was then behind it after that batch (``lag_bytes``)."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        if start == end:
            return []
        opts = self._opts
        begun, ends = Offsets.from_json(start, opts), Offsets.from_json(end, opts)

        async def plan() -> list[SegmentRange]:
            parts: list[SegmentRange] = []
            for key, last in sorted(ends.streams.items()):
                first = begun.start_of(key, ends)
                if first is None or first == last:
                    continue
                scope, stream = split_key(key)
                spans, _ = await (await planner(opts, scope, stream)).plan_between(first, last)
                parts += await _partitions(opts, scope, stream, spans)
            return parts

        return runtime().run(plan())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self._schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed everything up to ``end``: publish it as the
        query's subscriber stream cuts (retention may now drop what is before)."""
        offsets = Offsets.from_json(end, self._opts)
        hold = self._retention(offsets.subscriber)
        if hold is not None:
            runtime().run(hold.report(offsets.streams))
