"""``benchmarks/fuzz_bookie.py`` in a short run (issue 28; the full run is
1,000,000 frames): 20,000 mutated frames from 8 connections at a real bookie
process, with a fixed seed.  The bookie stays alive, the valid traffic on
other connections is never stalled or closed, and it reads back exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_short_fuzz_run_keeps_the_bookie_and_valid_traffic_whole() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fuzz_bookie.py"), "--frames", "20000",
         "--connections", "8", "--seed", "28", "--timeout", "10", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert done.stdout, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["bookie_alive"], result
    assert result["valid_failures"] == [], result
    assert result["io_error_frames"] == [], result  # no handler failed on a fuzz frame
    assert result["frames"] == 20000
    assert result["valid_entries"] > 0 and result["valid_max_latency_s"] < 10
    assert result["closed_by_bookie"] > 0  # malformed frames were sent, and seen as such
    assert sum(result["answers_by_status"].values()) > 0  # and some fuzz frames were served
    assert result["ok"] and done.returncode == 0, result
