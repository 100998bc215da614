"""``benchmarks/append_bytecodes.py`` in a small run: it counts the segment
append path's bytecodes by function, within 2% in two runs (under 0.1% on
a quiet machine, up to 1% seen beside a soak, where more appends share a
batch), and its machine instructions under valgrind, within 5% (what lets
it tell a change's cost where CPU time cannot: this VM's runs of one tree
move 30%)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.benchmarks import run_benchmark

REPO = Path(__file__).resolve().parents[2]


def counts(*extra: str, appends: int = 500) -> list[dict[str, object]]:
    stdout = run_benchmark("append_bytecodes.py", "--appends", str(appends), "--segments", "10",
                           "--size", "100", "--json", *extra, timeout_s=300)
    rows: list[dict[str, object]] = json.loads(stdout)
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
        assert abs(a["bytecodes_per_append"] / b["bytecodes_per_append"] - 1) < 0.02  # type: ignore[operator]


def test_counts_the_append_paths_instructions_the_same_each_run() -> None:
    """Two trees that are the same tree: each mode's count within 5% (the
    count is a difference of two runs' totals, each moved by a few million
    instructions of start-up and timers: 2.3% at most seen here)."""
    rows = counts("--instructions", "--tree", str(REPO), "--tree", str(REPO), appends=3000)
    assert [r["mode"] for r in rows] == ["plain", "writer", "plain", "writer"]
    for row in rows:
        assert 2_000 < row["instructions_per_append"] < 500_000  # type: ignore[operator]
    assert rows[1]["instructions_per_append"] > rows[0]["instructions_per_append"]  # type: ignore[operator]
    for a, b in zip(rows[:2], rows[2:], strict=True):
        assert abs(a["instructions_per_append"] / b["instructions_per_append"] - 1) < 0.05  # type: ignore[operator]
