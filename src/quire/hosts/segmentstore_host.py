"""One segment store process: ``quire segmentstore start`` runs :func:`run_segment_store`.

Start order: the metadata store session (its lease is this host's life),
a ledger client over it, the SegmentStore (no container yet), the wire
server (so the address is known), then :class:`ContainerOwnership`, which
registers the host and opens the containers the assignment gives it.
Until a container is open the server answers WrongHost for its segments,
so a client retries rather than being told a segment does not exist.
Stop order is the reverse: containers are closed (their queued operations
drained) before the server and the session go.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from quire.auth import server_security
from quire.client import Client, ClientConfig
from quire.errors import ConfigError
from quire.hosts.process import run
from quire.hosts.segmentstore_metrics import HealthCollector
from quire.http import HttpServer
from quire.log import WriterOptions
from quire.metadata import MetadataStore, open_store
from quire.security import SecurityConfig
from quire.segmentserver import SegmentServer, SegmentServerConfig, SegmentServerMetrics
from quire.segmentstore import (
    ContainerConfig,
    ContainerOwnership,
    OwnershipSettings,
    SegmentStore,
    SegmentStoreConfig,
)
from quire.segmentstore.health import store_health
from quire.segmentstore.storage_writer import StorageWriterConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentStoreHostConfig:
    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    host_id: str = ""
    """This host's name in the ownership records ("" : ``segmentstore-<host>-<port>``)."""
    host: str = "127.0.0.1"
    port: int = 12345
    """The wire server's port (Pravega's default; 0: any free one)."""
    metrics_port: int = -1
    """``/metrics`` (Prometheus) on this port; 0: any free one; -1: off."""
    container_count: int = 0
    """The cluster's container count, fixed at first use (0: the stored one,
    or the default if none is stored)."""
    rebalance_interval_ms: int = 1000
    tier1_ensemble_size: int = 3
    tier1_write_quorum_size: int = 3
    tier1_ack_quorum_size: int = 2
    """The containers' tier-1 ledgers: E3 W3 A2 unless the cluster is smaller."""
    lease_ms: int = 0
    """The metadata session's lease for the embedded drivers (0: the
    driver's default); ZooKeeper uses its session timeout."""
    tail_read_wait_ms: int = 5_000
    tier2_uri: str = ""
    """Long-term storage (``file:///abs/path``, ``s3://bucket/prefix?...``):
    each container's storage writer flushes there and tier-1 is truncated
    behind it ("" : none, tier-1 keeps everything)."""
    tier2_flush_threshold_bytes: int = 4 << 20
    tier2_flush_threshold_ms: int = 30_000
    tier2_flush_interval_ms: int = 1_000
    """The storage writer's flush thresholds and iteration interval (see
    :class:`~quire.segmentstore.storage_writer.StorageWriterConfig`, whose
    defaults these are); tests and benchmarks lower them to flush at once."""
    read_index_budget_bytes: int = 256 << 20
    """Each container's in-memory data (its read index, Pravega's cache):
    recent appends are served from it; older data is read back from tier-1,
    or from tier-2 once flushed there."""
    tier1_ceiling_bytes: int = 2 << 30
    """With tier-2: what each container's tier-1 log may hold before its
    appends are acknowledged only as tier-2 takes the backlog (see
    :class:`~quire.segmentstore.ContainerConfig`)."""
    gc_gen0_threshold_allocations: int = 50_000
    """Python's gen-0 collection threshold (the default 700 collects every
    few hundred appends on a busy host)."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """TLS and authentication (flat keys ``tls_cert_file``, ``auth_enabled``...,
    see :class:`~quire.security.SecurityConfig`): ``/metrics`` serves over
    TLS and authenticates against the metadata store's users when set."""

    def __post_init__(self) -> None:
        if self.container_count < 0:
            raise ConfigError("container_count must be 0 (the stored one) or positive")
        if self.read_index_budget_bytes < 0 or self.tier1_ceiling_bytes <= 0:
            raise ConfigError("read_index_budget_bytes must not be negative, "
                              "tier1_ceiling_bytes must be positive")
        if self.rebalance_interval_ms <= 0:
            raise ConfigError("rebalance_interval_ms must be positive")
        if not 1 <= self.tier1_ack_quorum_size <= self.tier1_write_quorum_size \
                <= self.tier1_ensemble_size:
            raise ConfigError("need 1 <= tier1_ack_quorum_size <= tier1_write_quorum_size "
                              "<= tier1_ensemble_size")


class _StoreCollector(Collector):
    """Gauges read from the store at scrape time (nothing on the append path)."""

    def __init__(self, host: SegmentStoreHost) -> None:
        self._host = host

    def collect(self):  # type: ignore[no-untyped-def]
        store = self._host.segments
        hosted = GaugeMetricFamily("quire_segmentstore_containers_hosted",
                                   "Segment containers open in this process")
        assigned = GaugeMetricFamily("quire_segmentstore_containers_assigned",
                                     "Segment containers the assignment gives this process")
        frames = GaugeMetricFamily("quire_segmentstore_tier1_frames",
                                   "Data frames written to tier-1 since the container opened",
                                   labels=["container"])
        operations = GaugeMetricFamily("quire_segmentstore_tier1_operations",
                                       "Operations written to tier-1 since the container opened",
                                       labels=["container"])
        segments = GaugeMetricFamily("quire_segmentstore_segments",
                                     "Live segments in the container", labels=["container"])
        stored = GaugeMetricFamily("quire_segmentstore_segment_bytes",
                                   "Bytes of the container's live segments", labels=["container"])
        backlog = GaugeMetricFamily("quire_segmentstore_tier2_backlog_bytes",
                                    "Committed bytes not yet in tier-2", labels=["container"])
        iterations = GaugeMetricFamily("quire_segmentstore_flush_iterations",
                                       "Storage writer flush iterations since the container "
                                       "opened", labels=["container"])
        if store is not None:
            ids = store.container_ids
            hosted.add_metric([], len(ids))
            for c in ids:
                container = store.container(c)
                label = [str(c)]
                frames.add_metric(label, container.operation_log.frames_written)
                operations.add_metric(label, container.operation_log.operations_written)
                live = [s for s in container.committed.segments.values() if not s.deleted]
                segments.add_metric(label, len(live))
                stored.add_metric(label, sum(s.length - s.start_offset for s in live))
                writer = store.writers.get(c)
                if writer is not None:
                    backlog.add_metric(label, writer.backlog_bytes())
                    iterations.add_metric(label, writer.iterations)
        ownership = self._host.ownership
        assigned.add_metric([], len(ownership.mine) if ownership is not None else 0)
        yield from (hosted, assigned, frames, operations, segments, stored, backlog, iterations)


class SegmentStoreHost:
    """See the module docstring."""

    def __init__(self, config: SegmentStoreHostConfig) -> None:
        self.config = config
        self.metadata: MetadataStore | None = None
        self.client: Client | None = None
        self.segments: SegmentStore | None = None
        self.server: SegmentServer | None = None
        self.ownership: ContainerOwnership | None = None
        self.address = ""
        self.host_id = config.host_id
        self.metrics_address: str | None = None
        self.registry = CollectorRegistry()
        self._http: HttpServer | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        try:
            options = {"lease_ms": cfg.lease_ms} if cfg.lease_ms and \
                not cfg.metadata_uri.startswith("zk://") else {}
            self.metadata = await open_store(cfg.metadata_uri, **options)
            self.client = await Client.over(self.metadata, ClientConfig())
            self.segments = await SegmentStore.open(
                self.client, (), cfg.tier2_uri or None, config=SegmentStoreConfig(
                    container_count=cfg.container_count or None,
                    container=ContainerConfig(
                        read_index_budget_bytes=cfg.read_index_budget_bytes,
                        tier1_ceiling_bytes=cfg.tier1_ceiling_bytes),
                    storage_writer=StorageWriterConfig(
                        flush_threshold_bytes=cfg.tier2_flush_threshold_bytes,
                        flush_threshold_ms=cfg.tier2_flush_threshold_ms,
                        iteration_interval_ms=cfg.tier2_flush_interval_ms),
                    tier1=WriterOptions(ensemble_size=cfg.tier1_ensemble_size,
                                        write_quorum_size=cfg.tier1_write_quorum_size,
                                        ack_quorum_size=cfg.tier1_ack_quorum_size)))
            self.server = SegmentServer(self.segments, SegmentServerConfig(
                tail_read_wait_ms=cfg.tail_read_wait_ms), SegmentServerMetrics(self.registry))
            await self.server.start(cfg.host, cfg.port)
            self.address = f"{cfg.host}:{self.server.port}"
            self.host_id = cfg.host_id or f"segmentstore-{cfg.host}-{self.server.port}"
            if cfg.metrics_port >= 0:  # before ownership: it registers the address
                security = server_security(cfg.security, self.metadata)
                self.registry.register(_StoreCollector(self))
                self.registry.register(HealthCollector(self))
                self._http = HttpServer(self.registry, tls=security.tls,
                                        authenticator=security.authenticator,
                                        health=self.health)
                http_port = await self._http.start(cfg.host, cfg.metrics_port)
                self.metrics_address = f"{cfg.host}:{http_port}"
            self.ownership = ContainerOwnership(
                self.metadata, self.segments, self.host_id, self.address,
                OwnershipSettings(rebalance_interval_ms=cfg.rebalance_interval_ms),
                metrics_address=self.metrics_address)
            await self.ownership.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close containers (draining their queued operations), then the
        server, the client and the metadata session (idempotent); ``/metrics``
        first (its authenticator reads the metadata store)."""
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.ownership is not None:
            await self.ownership.close()  # stops the containers, deregisters
            self.ownership = None
        elif self.segments is not None:
            await self.segments.close()
        if self.server is not None:
            await self.server.close()
            self.server = None
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.metadata is not None:
            await self.metadata.close()
            self.metadata = None
        self._stopped.set()

    def health(self) -> dict[str, Any]:
        """``/health``'s answer: this host and its containers' health."""
        return {"host": self.host_id, **store_health(self.segments)}

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def ready_event(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "address": self.address,
                "metrics": self.metrics_address}


def run_segment_store(config: SegmentStoreHostConfig) -> None:
    """Blocking entry point of ``quire segmentstore start``."""
    run(lambda: SegmentStoreHost(config), config.gc_gen0_threshold_allocations)
