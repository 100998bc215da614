"""A segment store host that does not run exactly its assigned containers
says so: after ``warn_after_s``, one warning per distinct state naming what
each container waits for, and ``/metrics``' gauge of seconds unconverged."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from quire.hosts.convergence import ConvergenceWatchdog
from quire.hosts.segmentstore_admin import SegmentStoreAdmin


class Ownership:
    def __init__(self) -> None:
        self.state: dict[str, Any] = {"assigned": [2, 3], "running": [3], "failed": [],
                                      "starting": [], "stopping": {}}

    def converged(self) -> bool:
        return self.state["assigned"] == self.state["running"] and not self.state["stopping"]

    def convergence(self) -> dict[str, Any]:
        return dict(self.state)


def watchdog() -> tuple[ConvergenceWatchdog, Ownership, list[float]]:
    admin = SegmentStoreAdmin()
    admin.host_id = "ss-1"
    ownership = Ownership()
    admin.ownership = ownership  # type: ignore[assignment]
    now = [100.0]
    return ConvergenceWatchdog(admin, warn_after_s=30, monotonic=lambda: now[0]), ownership, now


def test_a_host_stuck_converging_is_named_once_per_state(caplog: pytest.LogCaptureFixture) -> None:
    dog, ownership, now = watchdog()
    caplog.set_level(logging.WARNING, "quire.hosts.convergence")
    dog.check()
    now[0] += 29
    dog.check()
    assert caplog.records == []  # not yet: starts and stops take time
    assert dog.unconverged_s() == 29
    now[0] += 2
    dog.check()
    dog.check()
    assert len(caplog.records) == 1
    assert "ss-1" in caplog.text and '"assigned": [2, 3]' in caplog.text
    ownership.state["stopping"] = {"2": "its queued operations and tier-1 log"}
    dog.check()
    assert len(caplog.records) == 2 and "its queued operations" in caplog.records[1].getMessage()


def test_converged_again_resets_the_gauge_and_the_warning() -> None:
    dog, ownership, now = watchdog()
    dog.check()
    now[0] += 40
    assert dog.unconverged_s() == 40
    ownership.state["running"] = [2, 3]
    dog.check()
    assert dog.unconverged_s() == 0


def test_a_stop_stuck_on_its_writer_cancels_it_again_and_says_where_it_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    dog, ownership, now = watchdog()
    cancelled: list[int] = []

    class Store:
        def cancel_writer_again(self, container_id: int) -> str | None:
            cancelled.append(container_id)
            return "  File storage_writer.py, in run\n"
    dog._admin.store = Store()  # type: ignore[assignment]
    ownership.state["stopping"] = {2: "its storage writer"}
    caplog.set_level(logging.WARNING, "quire.hosts.convergence")
    dog.check()
    assert cancelled == []  # not before warn_after_s
    now[0] += 30
    dog.check()
    dog.check()
    assert cancelled == [2, 2]  # again at every look
    assert len(caplog.records) == 1  # said once per state
    assert "container 2's storage writer, cancelled again, waits at" in caplog.text
    assert "in run" in caplog.text
