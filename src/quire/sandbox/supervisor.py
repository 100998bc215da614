"""Keeping a sandbox's processes running: restarts with backoff."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quire.errors import QuireError
from quire.sandbox.processes import ServiceProcess


@dataclass(frozen=True)
class RestartPolicy:
    """How :class:`ServiceSupervisor` restarts a bookie that exited."""

    first_delay_ms: int = 500
    """Wait before the first restart; it doubles after each failed one."""
    max_delay_ms: int = 30_000
    """The longest wait between two restarts."""
    ready_timeout_ms: int = 60_000
    """A restarted bookie not ready in this time is killed: a failed restart."""
    stable_after_ms: int = 30_000
    """A bookie that served this long before it exited starts over from
    ``first_delay_ms``; one that exits sooner keeps backing off."""


class ServiceSupervisor:
    """Keeps a sandbox's processes (bookies, segment stores, the controller)
    running: call :meth:`poll` often (it never blocks).  A process that
    exited is restarted, on its address, after a delay that starts at
    ``first_delay_ms`` and doubles up to ``max_delay_ms`` while restarts
    fail (exit before ready, not ready in time, or the process could not
    even be started); each event is told to ``say``.  The others are not
    touched, so one crash-looping process never stops the rest."""

    def __init__(self, processes: Sequence[ServiceProcess], say: Callable[[str], None],
                 policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._say = say
        self._policy = policy
        self._clock = clock
        first_delay_s = policy.first_delay_ms / 1000
        self._states = {(p.service, p.name): _Watch(p, ready_at=clock(), delay_s=first_delay_s)
                        for p in processes}

    def poll(self) -> None:
        for watch in self._states.values():
            self._step(watch, self._clock())

    def _step(self, watch: _Watch, now: float) -> None:
        process = watch.process
        if watch.restart_at is not None:
            if now >= watch.restart_at:
                watch.restart_at = None
                try:
                    process.start(expect_ready=False)
                except OSError as e:
                    self._failed(watch, now, f"could not start it: {e}")
                    return
                watch.starting_since = now
        elif watch.starting_since is not None:
            try:
                ready = process.check_ready()
            except QuireError as e:
                self._failed(watch, now, str(e))
                return
            if ready:
                watch.starting_since = None
                watch.ready_at = now
                self._say(f"{process.service} {process.name} is back on {process.address}")
            elif now - watch.starting_since > self._policy.ready_timeout_ms / 1000:
                process.kill9()
                self._failed(watch, now, "not ready in time; killed it")
        elif not process.running:
            status = process.proc.returncode if process.proc is not None else None
            if now - watch.ready_at >= self._policy.stable_after_ms / 1000:
                watch.delay_s = self._policy.first_delay_ms / 1000
            watch.restart_at = now + watch.delay_s
            self._say(f"{process.service} {process.name} exited (status {status}); restarting "
                      f"in {watch.delay_s:g} s")
            self._back_off(watch)

    def _failed(self, watch: _Watch, now: float, why: str) -> None:
        watch.starting_since = None
        watch.restart_at = now + watch.delay_s
        self._say(f"restart of {watch.process.service} {watch.process.name} failed: {why}; "
                  f"retrying in {watch.delay_s:g} s")
        self._back_off(watch)

    def _back_off(self, watch: _Watch) -> None:
        watch.delay_s = min(watch.delay_s * 2, self._policy.max_delay_ms / 1000)


@dataclass
class _Watch:
    """One supervised process: restart pending (``restart_at``), starting
    (``starting_since``), or serving (neither); times on the supervisor's clock."""

    process: ServiceProcess
    ready_at: float
    delay_s: float
    restart_at: float | None = None
    starting_since: float | None = None
