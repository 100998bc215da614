"""``benchmarks/soak_month.py`` for 90 seconds, with a leak planted.

The whole sandbox (3 bookies, 2 segment stores, the controller) under the
soak's mixed load, sampled every 5 s; the second segment store runs with
:mod:`quire.testing.planted_leak` (every append kept in a list).  The slope
test must flag that store's resident memory and nothing else: every other
process's memory and descriptors, the bookies' and tier-2's disks, the
tier-1 backlog and the tables stay flat over the last half while the load
creates and deletes streams, scales them, updates a table, runs reader
groups and transactions, without one error.  The run exits 1 (a series
grows), prints its table and draws its PNG.  The lead's 60-minute run is
the same without ``--plant-leak``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.soak_month import verdicts

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def test_the_slope_test_flags_growth_at_the_end_not_warming_up() -> None:
    times = [float(t) for t in range(0, 100, 5)]
    flat = [100.0 * MIB] * len(times)
    warming = [50.0 * MIB + min(t, 40.0) * 2 * MIB for t in times]
    leaking = [100.0 * MIB + t * 2 * MIB for t in times]
    judged = {v.series: v for v in verdicts(times, {"rss:flat": flat, "rss:warming": warming,
                                                    "rss:leaking": leaking})}
    assert not judged["rss:flat"].grows and not judged["rss:warming"].grows
    assert judged["rss:leaking"].grows and judged["rss:leaking"].rise == 90 * MIB
    assert not verdicts(times[:5], {"fds:few": [1.0, 2, 3, 4, 5]})[0].grows  # too few


def test_90_seconds_of_the_soak_catch_the_planted_leak_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak_month.py"), "--minutes", "1.5",
         "--sample-s", "5", "--rotate-s", "10", "--plant-leak", "--dir", str(tmp_path / "run"),
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out.with_suffix(".json")).read_text())
    grown = [v["series"] for v in result["verdicts"] if v["grows"]]
    assert grown == ["rss:segmentstore-2"], done.stdout[-4000:]
    assert len(result["verdicts"]) == 18 and len(result["times"]) >= 15
    load = result["load"]
    assert load["errors"] == {}, load
    for activity in ("events", "streams_created", "streams_deleted", "scales", "table_updates",
                     "groups_created", "groups_deleted", "txns_committed", "txns_aborted"):
        assert load[activity] > 0, (activity, load)
    assert "GROWS  rss:segmentstore-2" in done.stdout and "t_s  disk:bookie-1" in done.stdout
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
