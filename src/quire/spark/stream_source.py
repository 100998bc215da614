"""The ``quire`` data source over a *stream*: batch reads between stream
cuts and micro-batch streaming reads whose offsets are stream cuts.

``spark.read.format("quire").option("stream", "scope/stream")`` (options:
:mod:`quire.spark.stream_options`) gives one row per event::

    event binary, scope string, stream string, segment_id long, offset long

Batch reads plan one input partition per segment range between
``start_stream_cut`` and ``end_stream_cut`` (:mod:`quire.spark.stream_plan`:
segments and, across scales, their successors), fixed at planning time.

Streaming reads: an offset is a stream cut (``{"<segment id>": offset}``),
recorded in Spark's checkpoint; ``latestOffset`` plans from the last one to
the stream's tail now (or, under ``Trigger.AvailableNow``, the tail when
the query started), within ``max_rows_per_trigger`` /
``max_bytes_per_trigger``; ``partitions(start, end)`` plans the same ranges
again, so a batch replayed after a driver restart reads exactly the same
events.  Sealed segments are followed to their successors, so a scale
during a query loses and repeats nothing.

With option ``tier2`` the planner reads each planned segment's tier-2
layout and the tasks read the flushed part from the chunks themselves
(:mod:`quire.spark.tier2_reads`), the tail through the segment store
(:mod:`quire.spark.stream_read`).
"""

from __future__ import annotations

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
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from quire.spark._runtime import runtime
from quire.spark.stream_options import (
    EARLIEST,
    LATEST,
    Cut,
    StreamOptions,
    cut_from_json,
    cut_to_json,
)
from quire.spark.stream_plan import Budget, CutPlanner, SegmentSpan, StreamDataLossError
from quire.spark.stream_read import SegmentRange, read_segment_range, stream_clients
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
])
"""The rows of a stream."""

__all__ = ["STREAM_SCHEMA", "StreamBatchReader", "StreamDataLossError", "StreamMicroBatchReader",
           "check_stream_schema", "is_stream_read"]


def is_stream_read(options: Any) -> bool:
    """The options name a stream (``stream``), not a log."""
    return bool(options.get("stream"))


def check_stream_schema(schema: StructType) -> StructType:
    """Stream reads produce :data:`STREAM_SCHEMA`'s columns; a user schema
    may only change nullability."""
    ours = [(f.name, f.dataType) for f in STREAM_SCHEMA.fields]
    if [(f.name, f.dataType) for f in schema.fields] != ours:
        raise ValueError(f"the quire data source reads a stream as "
                         f"{STREAM_SCHEMA.simpleString()}, not {schema.simpleString()}")
    return schema


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


async def _planner(opts: StreamOptions) -> CutPlanner:
    controller, segments = await stream_clients(opts.access, opts.read_bytes)
    return CutPlanner(controller, segments, opts.scope, opts.stream,
                      fail_on_data_loss=opts.fail_on_data_loss, read_bytes=opts.read_bytes)


async def _cut(planner: CutPlanner, which: str | Cut) -> Cut:
    if which == EARLIEST:
        return await planner.head_cut()
    if which == LATEST:
        return await planner.tail_cut()
    assert isinstance(which, dict)
    return dict(which)


async def _partitions(opts: StreamOptions, spans: list[SegmentSpan]) -> list[SegmentRange]:
    layouts = {}
    if opts.tier2 is not None and spans:
        layouts = await plan_layouts(opts.tier2, [
            segment_name(opts.scope, opts.stream, s.segment_id) for s in spans])
    return [SegmentRange(
        controller=opts.controller, scope=opts.scope, stream=opts.stream,
        segment_id=s.segment_id, first=s.first, last=s.last,
        tier2=layouts.get(segment_name(opts.scope, opts.stream, s.segment_id)),
        fail_on_data_loss=opts.fail_on_data_loss, read_bytes=opts.read_bytes,
        batch_rows=opts.batch_rows, tls_ca=opts.tls_ca, credentials=opts.credentials)
        for s in spans]


def _read(partition: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, SegmentRange):
        return iter(())  # Spark's stand-in partition when there are none
    return read_segment_range(partition, _arrow_schema(schema))


class StreamBatchReader(DataSourceReader):
    """A batch read of the events between two stream cuts."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts

        async def plan() -> list[SegmentRange]:
            planner = await _planner(opts)
            start, end = await _cut(planner, opts.start), await _cut(planner, opts.end)
            spans, _ = await planner.plan_between(start, end)
            return await _partitions(opts, spans)

        return runtime().run(plan())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self._schema)


class StreamMicroBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over a stream; offsets are stream cuts (module docstring)."""

    def __init__(self, opts: StreamOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema
        self._target: Cut | None = None

    def initialOffset(self) -> dict[str, int]:
        opts = self._opts

        async def initial() -> Cut:
            return await _cut(await _planner(opts), opts.start)

        return cut_to_json(runtime().run(initial()))

    def prepareForTriggerAvailableNow(self) -> None:
        async def target() -> Cut:
            return await (await _planner(self._opts)).tail_cut()

        self._target = runtime().run(target())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self._opts.max_rows_per_trigger)
        if self._opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def _budget(self, limit: ReadLimit) -> Budget | None:
        opts = self._opts
        if isinstance(limit, ReadAllAvailable):
            return None
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_rows_per_trigger
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) \
            else opts.max_bytes_per_trigger
        return Budget(rows=rows, bytes=size)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        opts, target, budget = self._opts, self._target, self._budget(limit)

        async def latest() -> Cut:
            planner = await _planner(opts)
            end = target if target is not None else await planner.tail_cut()
            _spans, cut = await planner.plan_between(cut_from_json(start), end, budget)
            return cut

        return cut_to_json(runtime().run(latest()))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        if start == end:
            return []
        opts = self._opts

        async def plan() -> list[SegmentRange]:
            planner = await _planner(opts)
            spans, _ = await planner.plan_between(cut_from_json(start), cut_from_json(end))
            return await _partitions(opts, spans)

        return runtime().run(plan())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self._schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint."""
