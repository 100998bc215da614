"""``quire segmentstore status``: each container's owner and health, from the segment stores.

:func:`cluster_status` reads, from the metadata store, the container count,
the assignment (which host owns which container) and each live host's
registration (its HTTP address, ``metrics``), then asks each host's
``/api/v1/health`` (:mod:`quire.hosts.segmentstore_admin`,
:func:`quire.segmentstore.health.store_health`; over HTTPS with a CA,
with the credentials of a user with READ on ``prn::/`` when the hosts
authenticate: the unauthenticated ``/health`` says only ``ok`` or
``degraded``, never causes or segment names) and gives, per
container, its owner and what that owner says: ``ok``; ``degraded: tier-2
unavailable since <UTC> (<cause>)``; throttled at its tier-1 ceiling;
quarantined segments; or why it cannot be told (no owner, an owner
without an HTTP endpoint, one that does not answer, one that does not
host it yet).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Any

from quire.errors import MetadataNotFoundError, QuireError
from quire.hosts.segmentstore_admin import HEALTH_DETAIL_PATH
from quire.http.client import request_json
from quire.metadata import MetadataStore
from quire.segmentstore.names import CONTAINER_COUNT_KEY
from quire.segmentstore.ownership import host_registrations, read_assignment


@dataclass
class ContainerStatus:
    """One container as ``quire segmentstore status`` shows it."""

    container_id: int
    owner: str | None
    status: str
    """``ok``, ``degraded: ...``, ``failed: ...``, or why it is not known."""
    health: dict[str, Any] = field(default_factory=dict)
    """What its owner's ``/health`` says of it (empty if it said nothing)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and not self.health.get("quarantined") \
            and not self.health.get("throttled_since")

    def lines(self) -> list[str]:
        """``container N: <owner>: <status>`` and what else it should show."""
        h = self.health
        backlog = "" if "tier1_backlog_bytes" not in h else \
            f" (tier-1 {h['tier1_backlog_bytes']:,} B" + (
                f", tier-2 backlog {h['tier2_backlog_bytes']:,} B)"
                if h.get("tier2_backlog_bytes") is not None else ")")
        out = [f"container {self.container_id}: {self.owner or '-'}: {self.status}"
               f"{backlog if self.status == 'ok' else ''}"]
        if h.get("throttled_since"):
            out.append(f"  appends throttled since {h['throttled_since']}: tier-1 holds "
                       f"{h['tier1_backlog_bytes']:,} B, over its ceiling of "
                       f"{h['tier1_ceiling_bytes']:,} B")
        for q in h.get("quarantined", ()):
            out.append(f"  quarantined since {q['since']}: {q['segment']} ({q['cause']})")
        return out

    def as_json(self) -> dict[str, Any]:
        return {"container": self.container_id, "owner": self.owner, "status": self.status,
                "ok": self.ok, **{k: v for k, v in self.health.items()
                                  if k not in ("container", "status")}}


async def cluster_status(metadata: MetadataStore, *, timeout_s: float = 10.0,
                         tls: ssl.SSLContext | None = None,
                         authorization: str | None = None) -> list[ContainerStatus]:
    """Every container's owner and health (see the module docstring)."""
    try:
        count = int((await metadata.read_record(CONTAINER_COUNT_KEY)).value)
    except MetadataNotFoundError:
        count = 0
    assignment, _version = await read_assignment(metadata)
    hosts = await host_registrations(metadata)

    async def ask(host: str) -> dict[str, Any] | str:
        address = hosts[host].get("metrics")
        if not address:
            return "its owner serves no HTTP endpoint (metrics_port = -1)"
        try:
            return await asyncio.to_thread(request_json, "GET", address, HEALTH_DETAIL_PATH,
                                           timeout_s=timeout_s, tls=tls,
                                           authorization=authorization)
        except QuireError as e:
            return f"its owner does not answer: {e}"
    owners = sorted({h for h in assignment.values() if h in hosts})
    answers = dict(zip(owners, await asyncio.gather(*(ask(h) for h in owners)), strict=True))
    out = []
    for cid in range(max(count, max(assignment, default=-1) + 1)):
        host = assignment.get(cid)
        if host is None or host not in hosts:
            out.append(ContainerStatus(cid, host, "no live owner"))
            continue
        answer = answers[host]
        if isinstance(answer, str):
            out.append(ContainerStatus(cid, host, answer))
            continue
        found = [c for c in answer.get("containers", ()) if c.get("container") == cid]
        if not found:
            out.append(ContainerStatus(cid, host, "its owner does not host it yet"))
            continue
        out.append(ContainerStatus(cid, host, str(found[0].get("status", "?")), found[0]))
    return out
