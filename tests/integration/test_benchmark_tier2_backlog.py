"""``benchmarks/tier2_backlog.py`` in a tiny run (2 s of appends to 4
segments): the figures parse, the writer flushed and truncated tier-1, and
the backlog drained once appends stopped.  The issue's figure is the 60 s
run (``docs/performance.md``)."""

from __future__ import annotations

import json

from tests.support.benchmarks import run_benchmark


def test_tiny_run_reports_the_backlog_against_its_bound() -> None:
    stdout = run_benchmark("tier2_backlog.py", "--seconds", "2", "--segments", "4",
                           "--flush-threshold-kib", "64", "--iteration-interval-ms", "100",
                           "--json", timeout_s=120)
    result = json.loads(stdout)
    assert result["appends"] > 0 and result["appends_per_s"] > 0 and result["samples"] > 5
    assert result["goal_bound_bytes"] == 2 * 64 * 1024 * 4
    assert 0 < result["max_backlog_bytes"] >= result["max_backlog_last_third"]
    assert result["x_bound"] == result["max_backlog_bytes"] / result["goal_bound_bytes"]
    assert result["iterations"] > 0 and result["tier1_truncated"]
    assert result["drain_seconds"] >= 0
