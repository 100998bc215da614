"""A segment store's own HTTP routes beside ``/metrics``: what it hosts, for the controller's page.

* ``GET /api/v1/containers``: the containers this host runs (id, tier-1
  frames, segments, tier-2 backlog, read-index bytes, a failure if any);
* ``GET /api/v1/segments?prefix=P``: the live segments of those
  containers whose name starts with ``P`` (name, type, length, sealed):
  how the controller finds the reader groups' state tables of a scope
  (``S/<group>_kvtable/...``), which no RPC lists;
* ``GET /api/v1/health``: this host's id, its status (``ok``, or
  ``degraded`` while a container is not) and each hosted container's
  health (:func:`quire.segmentstore.health.store_health`: its flushing's
  cause, tier-1 backlog and throttle, quarantined segment names), what
  ``quire segmentstore status`` shows.

Reading only (READ on ``prn::/`` when authentication is on).  ``/ready``
answers 200 once the host runs every container assigned to it; the
unauthenticated ``/health`` says only the status word (:meth:`status`):
the causes and segment names are for an authenticated reader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quire.http import Route, json_response
from quire.segmentstore.health import store_health

log = logging.getLogger(__name__)

HEALTH_DETAIL_PATH = "/api/v1/health"
"""Each hosted container's health, for an authenticated reader."""

if TYPE_CHECKING:
    from aiohttp import web

    from quire.segmentstore import ContainerOwnership, SegmentStore


class SegmentStoreAdmin:
    """The routes over a host's store and ownership (both set once started)."""

    def __init__(self) -> None:
        self.store: SegmentStore | None = None
        self.ownership: ContainerOwnership | None = None
        self.host_id = ""

    def routes(self) -> list[Route]:
        return [Route("GET", "/api/v1/containers", self._containers),
                Route("GET", "/api/v1/segments", self._segments),
                Route("GET", HEALTH_DETAIL_PATH, self._health)]

    def readiness(self) -> tuple[bool, str]:
        if self.ownership is None or self.store is None:
            return False, "starting"
        if not self.ownership.converged():
            return False, "opening the containers assigned to this host: " + \
                json.dumps(self.ownership.convergence())
        return True, ""

    def containers(self) -> list[dict[str, Any]]:
        store = self.store
        if store is None:
            return []
        out = []
        for cid in sorted(store.container_ids):
            container = store.container(cid)
            writer = store.writers.get(cid)
            live = [s for s in container.committed.segments.values() if not s.deleted]
            failure = container.failure or (writer.failure if writer is not None else None)
            out.append({"id": cid, "segments": len(live),
                        "tier1Frames": container.operation_log.frames_written,
                        "tier2BacklogBytes": writer.backlog_bytes() if writer else None,
                        "readIndexBytes": container.read_index.cached_bytes,
                        "failure": None if failure is None else
                        f"{type(failure).__name__}: {failure}"})
        return out

    def health(self) -> dict[str, Any]:
        """``/api/v1/health``'s answer (module docstring)."""
        return {"host": self.host_id, **store_health(self.store)}

    def status(self) -> str:
        """``/health``'s status word: ``ok`` or ``degraded``."""
        return str(store_health(self.store)["status"])

    async def _health(self, _request: web.Request) -> web.StreamResponse:
        return json_response(200, self.health())

    async def _containers(self, _request: web.Request) -> web.StreamResponse:
        return json_response(200, {"containers": self.containers()})

    async def _segments(self, request: web.Request) -> web.StreamResponse:
        prefix = request.query.get("prefix", "")
        store = self.store
        found = []
        if store is not None:
            for cid in sorted(store.container_ids):
                for s in store.container(cid).committed.segments.values():
                    if not s.deleted and s.name.startswith(prefix):
                        found.append({"name": s.name, "type": s.type.name.lower(),
                                      "length": s.length, "sealed": s.sealed,
                                      "container": cid})
        return json_response(200, {"segments": sorted(found, key=lambda s: s["name"])})


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
        convergence = ownership.convergence()
        state = json.dumps(convergence, sort_keys=True)
        if now - self._since < self.warn_after_s:
            return
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
