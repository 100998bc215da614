"""BP-46's ``kill -9`` loop (tests/support/kill_loop.py) on four real
bookie processes: continuous E3 W3 A2 writes and concurrent recoveries, one
bookie at a time killed, power-lost and restarted, the next kill only once
it cleared its limbo.  Nothing acknowledged may be lost, read back
different, or left past the end its ledger was closed at.  Journal off with
the protection on, and journal on, to show both modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kill_loop import KillLoopParams, kill_loop_cluster, run_kill_loop


@pytest.mark.parametrize(("journal_write_data", "cycles"), [(False, 3), (True, 2)],
                         ids=["journal-off", "journal-on"])
async def test_kill_loop_loses_nothing_acknowledged(tmp_path: Path, journal_write_data: bool,
                                                    cycles: int) -> None:
    params = KillLoopParams(cycles=cycles, journal_write_data=journal_write_data)
    cluster = kill_loop_cluster(tmp_path / "cluster", params).start()
    try:
        report = await run_kill_loop(cluster, params)
    finally:
        cluster.close()
    assert report.losses == []
    assert report.cycles == cycles
    assert report.entries_verified == report.entries_acknowledged > cycles * 1000
    assert report.recoveries >= 1 and report.ledgers >= 2
    if not journal_write_data:  # the power losses cost entries that phase two copied back
        assert report.entries_copied > 0
