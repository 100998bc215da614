"""ServiceSupervisor (quire.sandbox) on stand-in bookies and a manual clock:
which bookie is restarted when, and that failed restarts back off, bounded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

from quire.bookie.storage.files import lock_directory, lock_holder
from quire.errors import QuireError, StorageError
from quire.sandbox import BookieProcess, RestartPolicy, ServiceSupervisor


class StandInBookie:
    """What the supervisor uses of a BookieProcess; ``outcomes`` say how each
    start ends: "ready", "dies" (exits before ready) or "oserror"."""

    service = "bookie"

    def __init__(self, bookie_id: str, outcomes: list[str]) -> None:
        self.bookie_id = self.name = bookie_id
        self.outcomes = outcomes
        self.running = True
        self.starts = 0
        self.address = ""
        self.proc: Any = None
        self._outcome = ""

    def start(self, expect_ready: bool = True) -> None:
        assert not expect_ready
        self.starts += 1
        self._outcome = self.outcomes.pop(0)
        if self._outcome == "oserror":
            raise FileExistsError("a file is in the way")
        self.running = True

    def check_ready(self) -> bool:
        if self._outcome == "dies":
            self.running = False
            raise QuireError(f"bookie {self.bookie_id} exited before it was ready")
        self.address = "127.0.0.1:1"
        return True

    def kill9(self) -> None:
        self.running = False


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_for(supervisor: ServiceSupervisor, clock: Clock, seconds: float) -> None:
    end = clock.now + seconds
    while clock.now < end:
        supervisor.poll()
        clock.now += 0.05


def make(bookies: list[StandInBookie], clock: Clock
         ) -> tuple[ServiceSupervisor, list[str]]:
    said: list[str] = []
    supervisor = ServiceSupervisor(cast(list[BookieProcess], bookies), said.append,
                                  RestartPolicy(first_delay_ms=500, max_delay_ms=4000,
                                                stable_after_ms=30_000), clock=clock)
    return supervisor, said


def test_failed_restarts_back_off_doubling_up_to_the_bound_and_others_are_untouched() -> None:
    clock = Clock()
    crashing = StandInBookie("bookie-1", ["dies"] * 6 + ["oserror", "ready"])
    healthy = StandInBookie("bookie-2", [])
    supervisor, said = make([crashing, healthy], clock)
    crashing.running = False
    attempts: list[float] = []
    while crashing.starts < 8:
        before = crashing.starts
        supervisor.poll()
        if crashing.starts > before:
            attempts.append(clock.now)
        clock.now += 0.01
        assert clock.now < 1100
    run_for(supervisor, clock, 1)
    gaps = [round(b - a, 1) for a, b in zip([1000.0, *attempts], attempts, strict=False)]
    assert gaps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert healthy.starts == 0
    assert sum("failed" in line for line in said) == 7
    assert said[-1] == "bookie bookie-1 is back on 127.0.0.1:1"


def test_a_bookie_that_served_long_enough_starts_over_from_the_first_delay() -> None:
    clock = Clock()
    bookie = StandInBookie("bookie-1", ["dies", "dies", "ready", "ready"])
    supervisor, said = make([bookie], clock)
    bookie.running = False
    run_for(supervisor, clock, 10)  # 0.5 + 1 + 2: ready again
    assert bookie.starts == 3 and bookie.running
    clock.now += 60
    bookie.running = False
    supervisor.poll()
    assert said[-1] == "bookie bookie-1 exited (status None); restarting in 0.5 s"


def test_a_held_directory_names_its_holder(tmp_path: Path) -> None:
    assert lock_holder(tmp_path) is None
    fd = lock_directory(tmp_path)
    try:
        assert lock_holder(tmp_path) is not None
        assert f"pid {os.getpid()} (" in str(lock_holder(tmp_path))
        with pytest.raises(StorageError, match=f"held by pid {os.getpid()} "):
            lock_directory(tmp_path)
    finally:
        os.close(fd)
    assert lock_holder(tmp_path) is None


def test_free_ports_are_outside_the_ephemeral_range_and_never_repeat() -> None:
    from quire.sandbox import _ephemeral_ports, free_port

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not any(port in _ephemeral_ports() for port in ports)
