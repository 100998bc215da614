"""Tables about streams: ``option("metadata_table", ...)`` (the Pravega
connector's ``metadata`` option; Quire's ``metadata`` is the metadata
store's URI).

``streams`` with ``option("scope", S)``: one row per stream of scope S::

    scope, stream, state, scaling, target_rate, scale_factor, min_segments,
    retention, retention_min, retention_max, tags, segment_count, size_bytes,
    head_cut, tail_cut

(``scaling``: fixed, events or kbytes; ``retention``: none, time or size;
``segment_count``: current segments; ``size_bytes``: bytes between the head
and the tail; the cuts in JSON, segment id -> offset).

``stream_info`` with ``option("stream", "scope/stream")``: one row per
segment the stream has (every epoch's, but those truncated away)::

    scope, stream, segment_id, epoch, number, min_key, max_key, current,
    start_offset, length, sealed, tier2_length

Both are read on the driver at planning (the controller's ``describeStream``
and each segment's info, and from the segment store how much of it tier-2
holds), handed to one task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from quire.errors import SegmentNotFoundError
from quire.spark._runtime import runtime
from quire.spark.stream_cuts import bytes_between, planner
from quire.spark.stream_options import StreamOptions, cut_to_json
from quire.spark.stream_read import stream_clients
from quire.streams.append_times import append_times
from quire.streams.model import segment_name

STREAMS_SCHEMA = StructType([
    StructField("scope", StringType(), False), StructField("stream", StringType(), False),
    StructField("state", StringType(), False), StructField("scaling", StringType(), False),
    StructField("target_rate", IntegerType(), False),
    StructField("scale_factor", IntegerType(), False),
    StructField("min_segments", IntegerType(), False),
    StructField("retention", StringType(), False),
    StructField("retention_min", LongType(), False),
    StructField("retention_max", LongType(), False),
    StructField("tags", ArrayType(StringType(), False), False),
    StructField("segment_count", IntegerType(), False),
    StructField("size_bytes", LongType(), False),
    StructField("head_cut", StringType(), False), StructField("tail_cut", StringType(), False),
])
STREAM_INFO_SCHEMA = StructType([
    StructField("scope", StringType(), False), StructField("stream", StringType(), False),
    StructField("segment_id", LongType(), False), StructField("epoch", IntegerType(), False),
    StructField("number", IntegerType(), False), StructField("min_key", DoubleType(), False),
    StructField("max_key", DoubleType(), False), StructField("current", BooleanType(), False),
    StructField("start_offset", LongType(), False), StructField("length", LongType(), False),
    StructField("sealed", BooleanType(), False),
    StructField("tier2_length", LongType(), False),
])
_SCALING = {0: "fixed", 1: "kbytes", 2: "events"}


def metadata_table_schema(options: Any) -> StructType | None:
    """The schema of the table ``metadata_table`` names (None: not a
    table read); ValueError for another name."""
    table = (options.get("metadata_table") or "").strip().lower()
    if not table:
        return None
    if table == "streams":
        return STREAMS_SCHEMA
    if table == "stream_info":
        return STREAM_INFO_SCHEMA
    raise ValueError(f"option metadata_table is streams or stream_info, not {table!r}")


@dataclass
class MetadataRows(InputPartition):
    """The table's rows, read at planning."""

    rows: list[tuple[Any, ...]]


def _cut_text(cut: dict[int, int]) -> str:
    return json.dumps(cut_to_json(cut))


async def stream_rows(opts: StreamOptions, scope: str) -> list[tuple[Any, ...]]:
    controller, _segments = await stream_clients(opts.access, opts.read_bytes)
    rows = []
    for stream in sorted(await controller.list_streams(scope)):
        described = await controller.admin("describeStream", {"scope": scope,
                                                              "stream": stream})
        config = described["config"]
        p = await planner(opts, scope, stream)
        head, tail = await p.head_cut(), await p.tail_cut()
        rows.append((scope, stream, described["state"],
                     _SCALING.get(int(config.get("scale_type", 0)), "fixed"),
                     int(config.get("target_rate", 0)), int(config.get("scale_factor", 0)),
                     int(config["min_segments"]), config["retention"],
                     int(config["retention_param"]), int(config["retention_max"]),
                     list(config["tags"]), len(described["epochs"][-1]["segments"]),
                     await bytes_between(p, head, tail), _cut_text(head), _cut_text(tail)))
    return rows


async def segment_rows(opts: StreamOptions, scope: str, stream: str) -> list[tuple[Any, ...]]:
    controller, segments = await stream_clients(opts.access, opts.read_bytes)
    described = await controller.admin("describeStream", {"scope": scope, "stream": stream})
    current = {s["id"] for s in described["epochs"][-1]["segments"]}
    seen: set[int] = set()
    rows = []
    for epoch in described["epochs"]:
        for s in epoch["segments"]:
            sid = int(s["id"])
            if sid in seen:
                continue
            seen.add(sid)
            name = segment_name(scope, stream, sid)
            try:
                info = await segments.get_info(name)
                stored, _entries = await append_times(segments, name, info.length,
                                                      info.length)
            except SegmentNotFoundError:
                continue  # truncated away
            rows.append((scope, stream, sid, sid >> 32, sid & 0xFFFF_FFFF, float(s["min_key"]),
                         float(s["max_key"]), sid in current, info.start_offset, info.length,
                         info.sealed, stored))
    return rows


class MetadataTableReader(DataSourceReader):
    """A batch read of one metadata table (module docstring)."""

    def __init__(self, options: Any) -> None:
        self._table = (options.get("metadata_table") or "").strip().lower()
        if self._table == "streams":
            scope = options.get("scope") or ""
            if not scope or "/" in scope:
                raise ValueError("metadata_table streams needs option scope")
            self._scope = scope
            self._opts = StreamOptions.parse({**options, "stream_pattern": f"{scope}/.*"})
        else:
            self._opts = StreamOptions.parse(options)
            self._scope = self._opts.scope

    def partitions(self) -> Sequence[InputPartition]:
        opts = self._opts
        if self._table == "streams":
            rows = runtime().run(stream_rows(opts, self._scope))
        else:
            rows = runtime().run(segment_rows(opts, opts.scope, opts.stream))
        return [MetadataRows(rows)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, MetadataRows):
            yield from partition.rows
