"""A segment store's health as an operator sees it: ``/api/v1/health`` (and
the status word on ``/health``), the gauges on ``/metrics`` and what
``quire segmentstore status`` gathers from them.

A segment store host runs in-process over fake bookies and a memory://
tier-2; its writers' tier-2 is then made to refuse everything: the
container is shown ``degraded: tier-2 unavailable since <UTC> (<cause>)``
in ``/api/v1/health`` and by :func:`~quire.hosts.segmentstore_status.cluster_status`,
``quire_segmentstore_container_degraded`` is 1 and the failures are
counted by cause; once tier-2 accepts again, all is ok."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from collections.abc import AsyncIterator

import pytest

from quire.hosts import SegmentStoreHost, SegmentStoreHostConfig
from quire.hosts.segmentstore_admin import HEALTH_DETAIL_PATH
from quire.hosts.segmentstore_status import cluster_status
from quire.http import HEALTH_PATH
from quire.http.client import request_json
from quire.metadata import open_store
from tests.support.fake_bookie import FakeCluster
from tests.support.faulty_storage import FaultyStorage


async def until(condition: object, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)  # polling the host's state, with a deadline


@pytest.fixture
async def host() -> AsyncIterator[SegmentStoreHost]:
    fake = await FakeCluster.start(3)
    config = SegmentStoreHostConfig(
        metadata_uri=fake.uri, port=0, metrics_port=0, container_count=2,
        rebalance_interval_ms=50, tier2_uri=f"memory://{uuid.uuid4().hex}",
        tier2_flush_threshold_bytes=1, tier2_flush_threshold_ms=0, tier2_flush_interval_ms=20)
    started = SegmentStoreHost(config)
    await started.start()
    segments = started.segments
    assert segments is not None
    await until(lambda: len(segments.container_ids) == 2 and len(segments.writers) == 2)
    yield started
    await started.stop()
    await fake.close()


def scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
            for line in text.splitlines() if line and not line.startswith("#")}


async def test_a_degraded_container_is_shown_everywhere_and_recovers(
        host: SegmentStoreHost) -> None:
    store = host.segments
    assert store is not None and host.metrics_address is not None
    metadata = await open_store(host.config.metadata_uri)
    try:
        healthy = await cluster_status(metadata)
        assert [(c.container_id, c.owner, c.status) for c in healthy] == [
            (0, host.host_id, "ok"), (1, host.host_id, "ok")]
        assert healthy[0].lines()[0].startswith(f"container 0: {host.host_id}: ok (tier-1 ")
        faulty = {}
        for cid, writer in store.writers.items():
            faulty[cid] = writer.storage = FaultyStorage(writer.storage)  # type: ignore[assignment]
            faulty[cid].refuse_all = True
        for i in range(4):
            name = f"sc/st/{i}.#epoch.0"
            await store.create_segment(name)
            await store.append(name, b"data")
        await until(lambda: all(w.health.degraded is not None for w in store.writers.values()))
        health = await asyncio.to_thread(request_json, "GET", host.metrics_address,
                                         HEALTH_DETAIL_PATH, timeout_s=10)
        assert health["status"] == "degraded" and health["host"] == host.host_id
        probe = await asyncio.to_thread(request_json, "GET", host.metrics_address,
                                        HEALTH_PATH, timeout_s=10)
        assert probe == {"status": "degraded"}  # no cause, no segment name
        assert [c["status"].startswith("degraded: tier-2 unavailable since ")
                for c in health["containers"]] == [True, True]
        assert health["containers"][0]["cause"] == "Tier2RefusedError"
        status = await cluster_status(metadata)
        assert all(c.status.startswith("degraded: tier-2 unavailable since ") and not c.ok
                   for c in status)
        assert "(Tier2RefusedError at " in status[1].lines()[0]
        metrics = await asyncio.to_thread(scrape, host.metrics_address)
        assert metrics['quire_segmentstore_container_degraded{container="0"}'] == 1
        assert metrics['quire_segmentstore_tier2_flush_failures_total{cause="Tier2RefusedError"}'] \
            >= 2
        assert 'quire_segmentstore_tier1_backlog_bytes{container="1"}' in metrics
        for storage in faulty.values():
            storage.refuse_all = False
        await until(lambda: all(w.health.degraded is None and w.backlog_bytes() == 0
                                for w in store.writers.values()))
        assert all(c.ok for c in await cluster_status(metadata))
        probe = await asyncio.to_thread(request_json, "GET", host.metrics_address,
                                        HEALTH_PATH, timeout_s=10)
        assert probe == {"status": "ok"}
        metrics = await asyncio.to_thread(scrape, host.metrics_address)
        assert metrics['quire_segmentstore_container_degraded{container="0"}'] == 0
    finally:
        await metadata.close()
