"""``benchmarks/journal_bytes.py`` in its short mode: it runs both modes on
real bookie processes and prints figures that parse and add up.  The issue's
goals are measured by the full run, not checked here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.benchmarks import run_benchmark

ENTRIES = 20_000
ENTRY_BYTES = 1024
WRITE_QUORUM = 3


def test_short_run_reports_both_modes_and_where_the_bytes_went(tmp_path: Path) -> None:
    stdout = run_benchmark("journal_bytes.py", "--entries", str(ENTRIES), "--entry-bytes",
                           str(ENTRY_BYTES), "--tmpdir", str(tmp_path), "--json", "--quiet",
                           timeout_s=100)
    report = json.loads(stdout)

    replicated_payload = ENTRIES * ENTRY_BYTES * WRITE_QUORUM
    assert set(report["results"]) == {"journal on", "journal off"}
    for mode, result in report["results"].items():
        assert result["entries"] == ENTRIES, mode
        for figure in ("entries_per_s", "p50_ms", "p99_ms", "bytes_per_byte"):
            assert result[figure] > 0, (mode, figure)
        written = result["bytes"]
        # every acknowledged byte reached each replica's entry logs, and
        # /proc counted at least what the files grew by
        assert written["entry_logs"] >= replicated_payload, mode
        assert written["write_bytes"] >= written["entry_logs"] + written["index"], mode
        assert result["bytes_per_byte"] == written["write_bytes"] / replicated_payload
    # the journal counter sees the entries with the journal on and none without
    assert report["results"]["journal on"]["bytes"]["journal"] >= replicated_payload
    assert report["results"]["journal off"]["bytes"]["journal"] < replicated_payload // 100
    for ratio in report["ratios"].values():
        assert ratio > 0
    assert set(report["goals"]) == {"journal_off_bytes_per_byte",
                                    "journal_off_over_on_entries_per_s"}
