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

import json
from typing import TYPE_CHECKING, Any

from quire.http import Route, json_response
from quire.segmentstore.health import store_health

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

