"""``benchmarks/pravega_client_ceiling.py`` in a tiny run (one round, a
third of a second per row, a small window, the awaiting variants too):
the null endpoint, the full stack (real bookie, segment store and
controller processes) and Redis all report figures that parse, each
row's ratio is its rate over the round's Redis rate, and the verdict is
the best null-endpoint async row's ratio against the goal.  What the
ceiling is gets measured by the full run."""

from __future__ import annotations

import json
import os

from tests.support.benchmarks import run_benchmark

ROWS = {"null/async/asyncio", "null/async/uvloop", "null/write_event",
        "null/async/uvloop/each-timed", "null/async/uvloop/gather",
        "full/async/asyncio", "full/async/uvloop", "redis"}


def test_tiny_run_reports_the_null_endpoint_the_full_stack_and_redis() -> None:
    stdout = run_benchmark("pravega_client_ceiling.py", "--seconds", "0.3", "--rounds", "1",
                           "--outstanding", "32", "--await-variants", "--json", "--quiet",
                           timeout_s=180)
    report = json.loads(stdout)
    (only,) = report["rounds"]
    assert set(only) == set(report["rows"]) == ROWS
    redis = only["redis"]["entries_per_s"]
    for name, run in only.items():
        assert run["entries"] > 0 and run["entries_per_s"] > 0, name
        assert run["client_cpu_us_per_event"]["python"] > 0, name
        row = report["rows"][name]
        assert row["runs_ratio_to_redis"] == [run["entries_per_s"] / redis]
        assert row["ratio_to_redis"] == run["entries_per_s"] / redis
        if name.startswith(("null/", "full/")):
            # the server saw the events, in blocks of at least one
            assert run["server_events_per_block"] >= 1, name
            assert run["cpu_bound_events_per_s"] == (
                os.cpu_count() or 1) / run["all_cpu_us_per_event"] * 1e6
            assert run["all_cpu_us_per_event"] >= sum(run["client_cpu_us_per_event"].values())
        if "/async/" in name:
            assert run["p99_ms"] >= run["p50_ms"] > 0, name
    assert only["null/write_event"]["p50_ms"] is None
    assert only["full/async/uvloop"]["server_block_ms"] > 0
    ceiling = max(report["rows"][n]["ratio_to_redis"] for n in ROWS
                  if n.startswith("null/async/"))
    assert report["ceiling_ratio"] == ceiling
    assert report["ceiling_reaches_goal"] == (ceiling >= report["goal"] == 1.5)
