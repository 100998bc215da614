"""A segment store host's watch on its own convergence: whether it runs
exactly the containers assigned to it, all open.

:class:`ConvergenceWatchdog` looks every few seconds; a host unconverged
for ``warn_after_s`` is logged once per distinct state (assigned, running,
failed, starting, stopping with the step each waits for), and a stop still
waiting for its storage writer cancels that writer again
(:meth:`~quire.segmentstore.SegmentStore.cancel_writer_again`), logging
where it waited.  :meth:`ConvergenceWatchdog.unconverged_s` is
``/metrics``' ``quire_segmentstore_unconverged_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quire.hosts.segmentstore_admin import SegmentStoreAdmin

log = logging.getLogger(__name__)


class ConvergenceWatchdog:
    """Says when a host has not run exactly its assigned containers for
    ``warn_after_s``: one warning per distinct state (assigned, running,
    failed, starting, stopping with the step each waits for), so a start or
    stop that hangs is named in the log, not only felt as a missing
    container; :meth:`unconverged_s` is ``/metrics``' gauge."""

    def __init__(self, admin: SegmentStoreAdmin, warn_after_s: float = 30.0,
                 poll_s: float = 5.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._admin = admin
        self._monotonic = monotonic
        self.warn_after_s = warn_after_s
        self.poll_s = poll_s
        self._since: float | None = None
        self._said: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="quire-convergence-watchdog")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None

    def unconverged_s(self) -> float:
        return 0.0 if self._since is None else self._monotonic() - self._since

    def check(self) -> None:
        """One look (what the watch does every ``poll_s``)."""
        ownership = self._admin.ownership
        if ownership is None or ownership.converged():
            self._since, self._said = None, None
            return
        now = self._monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < self.warn_after_s:
            return
        convergence = ownership.convergence()
        state = json.dumps(convergence, sort_keys=True)
        stacks = self._cancel_stuck_writers(convergence["stopping"])
        if state != self._said:
            self._said = state
            log.warning("host %s has not run exactly its assigned containers for %.0f s: %s%s",
                        self._admin.host_id, now - self._since, state,
                        "".join(f"\ncontainer {c}'s storage writer, cancelled again, "
                                f"waits at:\n{stack}" for c, stack in stacks.items()))

    def _cancel_stuck_writers(self, stopping: dict[int, str]) -> dict[int, str]:
        """Each stop still waiting for its storage writer cancels it again
        (:meth:`~quire.segmentstore.SegmentStore.cancel_writer_again`); where
        each waited."""
        store = self._admin.store
        if store is None:
            return {}
        stacks = {c: store.cancel_writer_again(c) for c in stopping}
        return {c: stack for c, stack in stacks.items() if stack is not None}

    async def _watch(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.poll_s)  # polling the host's own state
