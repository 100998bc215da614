"""``benchmarks/append_bytecodes.py`` in a small run: it counts the segment
append path's bytecodes by function, within 0.5% in two runs (what lets it
tell a change's cost where CPU time cannot: this VM's runs of one tree move
30%)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def counts() -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "append_bytecodes.py"), "--appends", "500",
         "--segments", "10", "--size", "100", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def test_counts_the_append_path_by_function_and_the_same_each_run() -> None:
    first, second = counts(), counts()
    assert [r["mode"] for r in first] == ["plain", "writer"]
    for row in first:
        functions = row["functions"]
        assert isinstance(functions, dict)
        assert "quire/segmentstore/container.py:append" in functions
        assert 100 < row["bytecodes_per_append"] < 5000  # type: ignore[operator]
    assert first[1]["bytecodes_per_append"] > first[0]["bytecodes_per_append"]  # type: ignore[operator]
    for a, b in zip(first, second, strict=True):
        assert abs(a["bytecodes_per_append"] / b["bytecodes_per_append"] - 1) < 0.005  # type: ignore[operator]
