"""Options and columns of Spark writes to streams (quire.spark.stream_sink),
and the records of quire.spark.stream_commits, without Spark or servers."""

from __future__ import annotations

import pyspark  # noqa: F401  (a missing dependency fails, never skips)
import pytest
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from quire.spark.stream_commits import CommitRecord, SinkRecord, sink_batch_write_id
from quire.spark.stream_sink import StreamSinkOptions, _columns


def test_options_parse_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUIRE_CONTROLLER", raising=False)
    opts = StreamSinkOptions.parse({"stream": "shop/orders"})
    assert (opts.scope, opts.stream) == ("shop", "orders")
    assert opts.controller == "tcp://127.0.0.1:9090"
    assert opts.txn_lease_ms == 120_000 and opts.sink_id is None
    monkeypatch.setenv("QUIRE_CONTROLLER", "tcp://ctl:9191")
    opts = StreamSinkOptions.parse({"stream": "a/b", "txn_lease": "90s", "sink_id": "etl"})
    assert opts.controller == "tcp://ctl:9191"
    assert opts.txn_lease_ms == 90_000 and opts.sink_id == "etl"


@pytest.mark.parametrize(("options", "message"), [
    ({}, "scope/stream"),
    ({"stream": "orders"}, "scope/stream"),
    ({"stream": "a/b/c"}, "scope/stream"),
    ({"stream": "a/b", "controller": "http://x"}, "controller"),
    ({"stream": "a/b", "txn_lease": "soon"}, "duration"),
    ({"stream": "a/b", "sink_id": "x/y"}, "sink_id"),
])
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamSinkOptions.parse(options)


def test_columns_event_and_optional_routing_key() -> None:
    assert _columns(StructType([StructField("Event", BinaryType())])) == ("Event", None)
    assert _columns(StructType([StructField("event", StringType()),
                                StructField("routing_key", StringType()),
                                StructField("other", LongType())])) == ("event", "routing_key")
    with pytest.raises(ValueError, match="column 'event'"):
        _columns(StructType([StructField("payload", BinaryType())]))
    with pytest.raises(ValueError, match="binary or string"):
        _columns(StructType([StructField("event", LongType())]))
    with pytest.raises(ValueError, match="routing_key must be a string"):
        _columns(StructType([StructField("event", StringType()),
                             StructField("routing_key", LongType())]))


def test_records_round_trip() -> None:
    record = CommitRecord("sc", "st", (1 << 127 | 5, 7), 123)
    assert CommitRecord.from_json(record.to_json()) == record
    sink = SinkRecord(4, (9, 1 << 100))
    assert SinkRecord.from_json(sink.to_json()) == sink
    assert SinkRecord.from_json(SinkRecord(5).to_json()).txns == ()
    assert sink_batch_write_id("sc", "st", "etl", 3) == "sink/sc/st/etl/3"
