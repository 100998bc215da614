"""Options of the wide Spark source and sink, without Spark or servers:
several streams and a pattern, time bounds, the retention hold's name,
read_mode tier2, and the policies a write creates a stream with."""

from __future__ import annotations

import pytest

from quire.spark.sink_options import StreamPolicies, StreamSinkOptions
from quire.spark.stream_options import StreamOptions, parse_time_ms


def test_several_streams_and_a_pattern() -> None:
    opts = StreamOptions.parse({"streams": " sc/a, sc/b ,other/c,sc/a"})
    assert opts.streams == (("sc", "a"), ("sc", "b"), ("other", "c"))  # once each, in order
    assert opts.matches("other", "c") and not opts.matches("sc", "c")
    with pytest.raises(ValueError, match="exactly one stream"):
        _ = opts.stream
    pattern = StreamOptions.parse({"stream_pattern": "sc/orders-.*"})
    assert pattern.pattern == ("sc", "orders-.*") and pattern.scope == "sc"
    assert pattern.matches("sc", "orders-eu")
    assert not pattern.matches("sc", "x-orders-eu")  # the whole name matches
    assert not pattern.matches("other", "orders-eu")
    for bad in ({}, {"stream": "a/b", "streams": "a/c"}, {"streams": ","},
                {"stream_pattern": "sc/("}, {"stream_pattern": "nope"},
                {"streams": "a/b,a/c", "start_stream_cut": '{"0": 0}'}):
        with pytest.raises(ValueError):
            StreamOptions.parse(bad)


def test_times_bound_a_read() -> None:
    assert parse_time_ms("1764288000000", "t") == 1_764_288_000_000
    assert parse_time_ms("2025-11-28T00:00:00", "t") == 1_764_288_000_000  # UTC if none
    assert parse_time_ms("2025-11-28T01:00:00+01:00", "t") == 1_764_288_000_000
    assert parse_time_ms(" ", "t") is None
    opts = StreamOptions.parse({"stream": "a/b", "start_time": "1000", "end_time": "2000"})
    assert (opts.start_time_ms, opts.end_time_ms) == (1000, 2000)
    with pytest.raises(ValueError, match="start_time"):
        StreamOptions.parse({"stream": "a/b", "start_time": "yesterday"})
    with pytest.raises(ValueError, match="not both"):
        StreamOptions.parse({"stream": "a/b", "start_time": "1", "start_stream_cut": "latest"})


def test_retention_hold_and_tier2_mode() -> None:
    opts = StreamOptions.parse({"stream": "a/b"})
    assert opts.hold_retention and opts.subscriber is None
    assert opts.read_mode == "cluster" and opts.split_bytes == 64 << 20
    opts = StreamOptions.parse({"stream": "a/b", "hold_retention": "false",
                                "subscriber": "etl-1", "tier2": "file:///t",
                                "read_mode": "TIER2", "split_bytes": "1024"})
    assert not opts.hold_retention and opts.subscriber == "etl-1"
    assert (opts.read_mode, opts.split_bytes) == ("tier2", 1024)
    for bad in ({"subscriber": "a/b"}, {"read_mode": "tier2"}, {"read_mode": "fast"}):
        with pytest.raises(ValueError):
            StreamOptions.parse({"stream": "a/b", **bad})


def test_created_streams_take_the_policies_given() -> None:
    assert StreamPolicies.parse({}) == StreamPolicies()
    assert StreamPolicies.parse({"default_num_segments": "3",
                                 "default_segment_target_rate_bytes_per_sec": "4096",
                                 "default_retention_size_bytes": "1000000",
                                 "retention_max": "5000000"}) == StreamPolicies(
        3, "kbytes", 4, 2, "size", 1_000_000, 5_000_000)
    assert StreamPolicies.parse({"default_segment_target_rate_events_per_sec": "100",
                                 "default_scale_factor": "3",
                                 "default_retention_duration_milliseconds": "60000"}) == \
        StreamPolicies(1, "events", 100, 3, "time", 60_000, 0)
    with pytest.raises(ValueError, match="one target rate"):
        StreamPolicies.parse({"default_segment_target_rate_events_per_sec": "1",
                              "default_segment_target_rate_bytes_per_sec": "1"})
    routed = StreamSinkOptions.parse({"create": "false"}, routed=True)
    assert (routed.scope, routed.stream, routed.create) == ("", "", False)
    with pytest.raises(ValueError, match="scope/stream"):
        StreamSinkOptions.parse({})  # not routed: option stream is needed


def test_zookeeper_options_reach_the_ledger_client(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from quire.spark.options import QuireOptions

    digest = tmp_path / "zk.digest"
    opts = QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events",
                               "zookeeper_digest_file": str(digest)})
    assert opts.client_config.zookeeper.zookeeper_digest_file == str(digest)
    monkeypatch.setenv("QUIRE_ZOOKEEPER_TLS_CA_FILE", "/etc/zk-ca.pem")
    from_env = QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events"})
    assert from_env.client_config.zookeeper.zookeeper_tls_ca_file == "/etc/zk-ca.pem"
    with pytest.raises(ValueError, match="zookeeper_tls_cert_file"):
        QuireOptions.parse({"metadata": "zk://zk1:2181/q", "log": "events",
                            "zookeeper_tls_cert_file": "/c.pem"})  # without its key
