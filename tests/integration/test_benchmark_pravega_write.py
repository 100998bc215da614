"""``benchmarks/pravega_write.py`` in a tiny run (half a second per writer,
a small window): real bookie, segment store and controller processes, the
real Pravega client, Quire's StreamWriter, a reader group and Redis all
report figures that parse, and the reader group read every event both
writers wrote.  The goal is measured by the full run, not here."""

from __future__ import annotations

import json

from tests.support.benchmarks import run_benchmark


def test_tiny_run_reports_every_writer_the_reader_group_and_redis() -> None:
    stdout = run_benchmark("pravega_write.py", "--seconds", "0.5", "--outstanding", "32", "--json",
                           "--quiet", timeout_s=120)
    report = json.loads(stdout)
    names = ("pravega_client", "pravega_client_inflight", "quire_stream_writer")
    writers = [report["pravega_client"], report["quire_stream_writer"],
               *report["redis"].values()]
    assert set(report["redis"]) == {"hiredis/1", "hiredis/4"}
    for r in writers:
        assert r["entries"] > 0 and r["entries_per_s"] > 0
        assert r["p99_ms"] >= r["p50_ms"] > 0
    read = report["reader_group"]
    assert read["events"] == sum(report[name]["entries"] for name in names)
    inflight = report["pravega_client_inflight"]  # rate only
    assert inflight["entries"] > 0 and inflight["entries_per_s"] > 0
    assert inflight["p50_ms"] is None
    for name in names:
        goal = report["goals"][name]
        assert goal["ratio"] == (report[name]["entries_per_s"]
                                 / report["redis"]["hiredis/1"]["entries_per_s"])
        assert goal["met"] == (goal["ratio"] >= 1.5)
