"""What a segment store says of its containers' health (``/health``, ``quire segmentstore status``).

:func:`store_health` is the segment store's part of its HTTP server's
``/health`` answer: for each container it hosts, its status (``ok``;
``degraded: tier-2 unavailable since <UTC> (<cause>)`` while its storage
writer fails; ``failed: ...`` once the container stopped serving), its
tier-1 backlog (bytes its log holds from its truncation point) and whether
appends are throttled at its ceiling, its tier-2 backlog (committed bytes
not yet flushed), and its quarantined segments with their causes.  The
store is ``degraded`` when any container is not ``ok``.
"""

from __future__ import annotations

from typing import Any

from quire.segmentstore.flush_health import utc
from quire.segmentstore.store import SegmentStore


def container_health(store: SegmentStore, container_id: int) -> dict[str, Any]:
    """One hosted container's health (see the module docstring)."""
    container = store.container(container_id)
    writer = store.writers.get(container_id)
    throttle = container.throttle
    found: dict[str, Any] = {
        "container": container_id, "status": "ok",
        "tier1_backlog_bytes": container.committed_side.tier1_bytes,
        "tier1_ceiling_bytes": throttle.ceiling_bytes if throttle.active else None,
        "throttled_since": None if throttle.throttled_since_ms is None
        else utc(throttle.throttled_since_ms),
    }
    if writer is not None:
        found.update(writer.health.as_json())
        found["tier2_backlog_bytes"] = writer.backlog_bytes()
        found["flush_iterations"] = writer.iterations
        found["quarantined"] = [{"segment": q.segment, "since": utc(q.since_ms),
                                 "cause": q.cause}
                                for q in writer.quarantine.quarantined.values()]
    failure = container.failure
    if failure is not None:
        found["status"] = f"failed: {type(failure).__name__}: {failure}"
    return found


def store_health(store: SegmentStore | None) -> dict[str, Any]:
    """The store's containers' health, and ``degraded`` if one is not ``ok``."""
    containers = [] if store is None else [container_health(store, c)
                                           for c in store.container_ids]
    degraded = any(c["status"] != "ok" or c.get("quarantined") or c["throttled_since"]
                   for c in containers)
    return {"status": "degraded" if degraded else "ok", "containers": containers}
