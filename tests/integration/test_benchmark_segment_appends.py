"""``benchmarks/segment_appends.py`` in a tiny run (a few hundred appends,
a few MB for the reopen): every shape reports figures that parse.  The
issue's goals are measured by the full run (``--reopen-gib 1``), not here."""

from __future__ import annotations

import json

import pytest

from tests.support.benchmarks import run_benchmark


def test_tiny_run_reports_every_shape_and_the_reopen() -> None:
    stdout = run_benchmark("segment_appends.py", "--appends", "300", "--sizes", "100,1024",
                           "--segments", "1,10", "--reopen-gib", "0.005", "--warmup", "200",
                           "--json", timeout_s=100)
    results = json.loads(stdout)
    rows = {r["what"]: r for r in results}
    # single events of every size (bracketed by raw rows), then the blocks
    order = [r["what"] for r in results]
    assert order[:8] == [
        "raw ledger.append, 100 B (before)", "1 segment(s), 1 event of 100 B",
        "10 segment(s), 1 event of 100 B", "raw ledger.append, 100 B (after)",
        "raw ledger.append, 1024 B (before)", "1 segment(s), 1 event of 1024 B",
        "10 segment(s), 1 event of 1024 B", "raw ledger.append, 1024 B (after)"]
    assert all("100 events" in w for w in order[8:12])
    # the bookies' CPU is read in clock ticks (10 ms): a tiny row may show
    # none, the whole run not
    assert all(r["bookies_cpu_us"] >= 0 for r in rows.values() if "per_s" in r)
    assert sum(r.get("bookies_cpu_us", 0) for r in rows.values()) > 0
    for size in (100, 1024):
        before, after = (rows[f"raw ledger.append, {size} B ({when})"]
                         for when in ("before", "after"))
        # every ratio is to the mean of the two raw rows
        base = (before["per_s"] + after["per_s"]) / 2
        assert before["x_raw_events"] + after["x_raw_events"] == pytest.approx(2.0)
        assert before["client_cpu_us"] > 0 and after["client_cpu_us"] > 0
        single = rows[f"10 segment(s), 1 event of {size} B"]
        assert single["x_raw_events"] == pytest.approx(single["per_s"] / base)
        for count in (1, 10):
            for shape, events in ((f"1 event of {size} B", 1), (f"100 events of {size} B", 100)):
                row = rows[f"{count} segment(s), {shape}"]
                assert row["per_s"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
                assert row["events_per_s"] == row["per_s"] * events
                assert row["mb_per_s"] > 0 and row["x_raw_events"] > 0
                assert row["client_cpu_us"] > 0
                # the phases: frames written and acknowledged by tier-1, the collector
                assert row["frames"] >= 1 and row["frame_kib"] > 0
                assert 1 <= row["ops_per_frame"] < 310  # 300 appends, a checkpoint or so
                assert row["frame_ack_max_ms"] >= row["frame_ack_p99_ms"] \
                    >= row["frame_ack_p50_ms"] > 0
                assert len(row["gc_collections"]) == 3 and row["gc_ms"] >= 0
    fill = rows["fill to 0.005 GiB of tier-1, appends of 512 KiB"]
    assert fill["mb_per_s"] > 0
    (reopen,) = [r for w, r in rows.items() if w.startswith("reopen the container")]
    assert reopen["tier1_mb"] >= 0.005 * (1 << 30) / 1e6 and reopen["seconds"] > 0


def test_cpu_per_append_tiny_run_reports_every_row() -> None:
    stdout = run_benchmark("segment_append_cpu.py", "--appends", "300", "--reps", "2", "--sizes",
                           "100,1024", "--segments", "1,10", "--json", timeout_s=100)
    rows = {r["what"]: r for r in json.loads(stdout)}
    assert set(rows) == {"1 segment(s), 100 B", "10 segment(s), 100 B", "1 segment(s), 1024 B",
                         "10 segment(s), 1024 B", "the driver alone"}
    driver = rows.pop("the driver alone")["driver_cpu_us"]
    assert driver > 0
    for row in rows.values():
        # every row includes the driver's own cost
        assert row["plain_cpu_us"] > 0 and row["writer_cpu_us"] > 0
