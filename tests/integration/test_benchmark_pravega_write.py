"""``benchmarks/pravega_write.py`` in a tiny run (half a second per writer,
a small window): real bookie, segment store and controller processes, the
real Pravega client, Quire's StreamWriter, a reader group and Redis all
report figures that parse, and the reader group read every event both
writers wrote.  The goal is measured by the full run, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_tiny_run_reports_every_writer_the_reader_group_and_redis() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pravega_write.py"), "--seconds", "0.5",
         "--outstanding", "32", "--json", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
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
