"""One segment store process: ``quire segmentstore start`` runs :func:`run_segment_store`.

Start order: the tier-1 ledger password read from its file (a file others
may read refuses the start), the metadata store session (its lease is this
host's life), a ledger client over it (TLS with ``tier1_tls_ca_file``), the
SegmentStore (no container yet), the wire server (so the address is
known), then :class:`ContainerOwnership`, which registers the host and
opens the containers the assignment gives it.
Until a container is open the server answers WrongHost for its segments,
so a client retries rather than being told a segment does not exist.
Stop order is the reverse: containers are closed (their queued operations
drained) before the server and the session go.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from quire.auth import server_security
from quire.client import Client, ClientConfig, LedgerPasswords
from quire.config import ServerAddressConfig
from quire.errors import ConfigError
from quire.hosts.convergence import ConvergenceWatchdog
from quire.hosts.process import run
from quire.hosts.segmentstore_admin import SegmentStoreAdmin
from quire.hosts.segmentstore_metrics import HealthCollector
from quire.http import HttpServer
from quire.log import WriterOptions
from quire.metadata import MetadataStore, open_leased_store
from quire.security import SecurityConfig, TokenSigner, read_secret
from quire.segmentserver import (
    SegmentServer,
    SegmentServerConfig,
    SegmentServerMetrics,
    WireAuth,
)
from quire.segmentstore import (
    ContainerConfig,
    ContainerOwnership,
    OwnershipSettings,
    SegmentStore,
    SegmentStoreConfig,
)
from quire.segmentstore.scale_requests import AutoScaleReporter, ScaleRequests
from quire.segmentstore.segment_rates import AutoScalerConfig
from quire.segmentstore.storage_writer import StorageWriterConfig
from quire.segmentstore.store import tier1_passwords

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentStoreHostConfig(ServerAddressConfig):
    """``host``, ``listen_host`` and ``advertised_host``: see
    :class:`~quire.config.ServerAddressConfig` (the wire server and
    ``/metrics`` listen on the listen host; the host record, which the
    controller's ``getURI`` answers from, carries the advertised one)."""

    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    host_id: str = ""
    """This host's name in the ownership records ("" :
    ``segmentstore-<advertised host>-<port>``)."""
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
    tier1_ledger_roll_bytes: int = 256 << 20
    tier1_ledger_roll_age_ms: int = 3_600_000
    """A container's tier-1 log moves to a new ledger once its current one
    holds this much or is this old.  Truncation behind tier-2 deletes whole
    ledgers, so each bookie keeps up to one ledger of this size per
    container beyond the tier-1 backlog (Pravega's ``bkLedgerMaxSize``)."""
    lease_ms: int = 0
    """The metadata session's lease: the embedded drivers' lease, or
    ZooKeeper's session timeout (0: the driver's default).  A host cut off
    from the store this long loses its host record, and its containers
    move to the others."""
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
    see :class:`~quire.security.SecurityConfig`): the wire server and
    ``/metrics`` serve over TLS; with ``auth_enabled`` the wire checks every
    request's delegation token (signed with ``auth_token_secret_file``,
    which it then needs) and ``/metrics`` authenticates against the
    metadata store's users."""
    wire: SegmentServerConfig = field(default_factory=SegmentServerConfig)
    """The wire server's settings and limits (flat keys ``tail_read_wait_ms``,
    ``max_connections``, ``max_connections_per_peer``, ``idle_timeout_ms``,
    ``max_buffered_reply_bytes``, ``max_outstanding_bytes``..., see
    :class:`~quire.segmentserver.SegmentServerConfig`)."""
    autoscale_windows_s: tuple[int, ...] = (120, 300, 600, 1200)
    autoscale_cooldown_s: int = 600
    autoscale_mute_s: int = 600
    autoscale_tick_ms: int = 5_000
    """Auto-scaling's rate windows (2, 5, 10 and 20 minutes), cooldown, mute
    and tick, Pravega's defaults (see
    :class:`~quire.segmentstore.segment_rates.AutoScalerConfig`)."""
    ledger_password_file: str = ""
    """The password of the containers' tier-1 ledgers, one secret per
    cluster, in a file (mode 0600: a store refuses to start when its group
    or others may read it).  Ledgers made before with the built-in password
    still open (:func:`~quire.segmentstore.store.tier1_passwords`).  "" : the
    built-in password, with a warning at start."""
    tier1_tls_ca_file: str = ""
    """PEM CA certificates of the bookies: set, the tier-1 ledger client
    reaches them over TLS ("" : plaintext).  Independent of the wire
    server's own TLS (``tls_*_file``); a deployment may name the same files."""
    tier1_tls_cert_file: str = ""
    """PEM client certificate shown to bookies with mutual TLS (they
    authorize its role, e.g. ``segmentstore``)."""
    tier1_tls_key_file: str = ""
    """PEM private key of ``tier1_tls_cert_file`` (a secret file, mode 0600)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.container_count < 0:
            raise ConfigError("container_count must be 0 (the stored one) or positive")
        if self.read_index_budget_bytes < 0 or self.tier1_ceiling_bytes <= 0:
            raise ConfigError("read_index_budget_bytes must not be negative, "
                              "tier1_ceiling_bytes must be positive")
        if self.rebalance_interval_ms <= 0 or self.tier1_ledger_roll_bytes <= 0 \
                or self.tier1_ledger_roll_age_ms < 0:
            raise ConfigError("rebalance_interval_ms and tier1_ledger_roll_bytes must be "
                              "positive, tier1_ledger_roll_age_ms not negative")
        if not 1 <= self.tier1_ack_quorum_size <= self.tier1_write_quorum_size \
                <= self.tier1_ensemble_size:
            raise ConfigError("need 1 <= tier1_ack_quorum_size <= tier1_write_quorum_size "
                              "<= tier1_ensemble_size")
        self.tier1_client()  # ConfigError for TLS files that do not go together
        self.autoscaler()  # checks the auto-scaling settings

    def autoscaler(self) -> AutoScalerConfig:
        return AutoScalerConfig(self.autoscale_windows_s, self.autoscale_cooldown_s,
                                self.autoscale_mute_s, self.autoscale_tick_ms)

    def tier1_client(self) -> ClientConfig:
        """The settings of the ledger client of the tier-1 logs."""
        return ClientConfig(tls_ca=self.tier1_tls_ca_file, tls_cert=self.tier1_tls_cert_file,
                            tls_key=self.tier1_tls_key_file)

    def tier1_passwords(self) -> LedgerPasswords:
        """The tier-1 ledgers' passwords (reads ``ledger_password_file``:
        InsecureSecretFileError or ConfigError if it is unsafe or unreadable)."""
        if not self.ledger_password_file:
            log.warning("ledger_password_file is not set: the tier-1 ledgers use the "
                        "built-in password, which anyone who reaches a bookie can use to "
                        "fence or write them; set one secret per cluster")
            return tier1_passwords(None)
        return tier1_passwords(read_secret(self.ledger_password_file))


def wire_auth(security: SecurityConfig) -> WireAuth | None:
    """The wire's token check of a segment store's settings (None without
    ``auth_enabled``); ConfigError if the cluster secret is missing or
    open to others."""
    if not security.auth_enabled:
        return None
    if not security.auth_token_secret_file:
        raise ConfigError("auth_enabled on a segment store needs auth_token_secret_file (the "
                          "cluster secret its controllers sign delegation tokens with)")
    return WireAuth(TokenSigner.from_file(security.auth_token_secret_file))


def warn_of_ip_under_tls(cfg: SegmentStoreHostConfig) -> None:
    """Log that clients will be given an IP address under TLS, which the
    official Pravega client cannot check against a certificate."""
    host = cfg.resolved_advertised_host
    if cfg.security.tls_enabled and _is_ip_literal(host):
        log.warning("TLS is on but clients are given the IP address %s: the official Pravega "
                    "client cannot check it (set advertised_host to a DNS name the "
                    "certificate covers, e.g. localhost)", host)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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
        tier1_queued = GaugeMetricFamily("quire_segmentstore_tier1_queued_bytes",
                                         "Bytes of operations queued for tier-1, not yet in a "
                                         "frame written (the tier-1 backlog)",
                                         labels=["container"])
        read_index = GaugeMetricFamily("quire_segmentstore_read_index_bytes",
                                       "Bytes the container's read index holds in memory",
                                       labels=["container"])
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
                read_index.add_metric(label, container.read_index.cached_bytes)
                tier1_queued.add_metric(label, container.operation_log.queued_bytes)
                writer = store.writers.get(c)
                if writer is not None:
                    backlog.add_metric(label, writer.backlog_bytes())
                    iterations.add_metric(label, writer.iterations)
        ownership = self._host.ownership
        assigned.add_metric([], len(ownership.mine) if ownership is not None else 0)
        posted = GaugeMetricFamily("quire_segmentstore_autoscale_requests_posted",
                                   "Hot and cold segments reported to the controller since "
                                   "the process started")
        reporter = self._host.autoscaler
        posted.add_metric([], reporter.posted if reporter is not None else 0)
        unconverged = GaugeMetricFamily(
            "quire_segmentstore_unconverged_seconds",
            "Seconds since this process last ran exactly the containers assigned to it, "
            "all open (0 while it does)")
        unconverged.add_metric([], self._host.watchdog.unconverged_s())
        yield from (hosted, assigned, frames, operations, segments, stored, backlog, iterations,
                    read_index, tier1_queued, posted, unconverged)


class SegmentStoreHost:
    """See the module docstring."""

    def __init__(self, config: SegmentStoreHostConfig) -> None:
        self.config = config
        self.metadata: MetadataStore | None = None
        self.client: Client | None = None
        self.segments: SegmentStore | None = None
        self.server: SegmentServer | None = None
        self.ownership: ContainerOwnership | None = None
        self.autoscaler: AutoScaleReporter | None = None
        self.address = ""
        self.host_id = config.host_id
        self.metrics_address: str | None = None
        self.registry = CollectorRegistry()
        self._http: HttpServer | None = None
        self._admin = SegmentStoreAdmin()
        self.watchdog = ConvergenceWatchdog(self._admin)
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        try:
            passwords = cfg.tier1_passwords()
            self.metadata = await open_leased_store(
                cfg.metadata_uri, cfg.lease_ms, **cfg.security.zookeeper.store_options())
            self.client = await Client.over(self.metadata, cfg.tier1_client())
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
                                        ack_quorum_size=cfg.tier1_ack_quorum_size,
                                        roll_bytes=cfg.tier1_ledger_roll_bytes,
                                        roll_age_ms=cfg.tier1_ledger_roll_age_ms),
                    tier1_passwords=passwords))
            security = server_security(cfg.security, self.metadata)
            self.server = SegmentServer(self.segments, cfg.wire,
                                        SegmentServerMetrics(self.registry), tls=security.tls,
                                        auth=wire_auth(cfg.security))
            await self.server.start(cfg.resolved_listen_host, cfg.port)
            self.address = cfg.advertised_address(self.server.port)
            warn_of_ip_under_tls(cfg)
            self.host_id = cfg.host_id or \
                f"segmentstore-{cfg.resolved_advertised_host}-{self.server.port}"
            self._admin.host_id = self.host_id
            if cfg.metrics_port >= 0:  # before ownership: it registers the address
                self.registry.register(_StoreCollector(self))
                self.registry.register(HealthCollector(self))
                self._http = HttpServer(self.registry, self._admin.routes(), tls=security.tls,
                                        authenticator=security.authenticator,
                                        ready=self._admin.readiness,
                                        health=self._admin.status)
                http_port = await self._http.start(cfg.resolved_listen_host, cfg.metrics_port)
                self.metrics_address = cfg.advertised_address(http_port)
            self.ownership = ContainerOwnership(
                self.metadata, self.segments, self.host_id, self.address,
                OwnershipSettings(rebalance_interval_ms=cfg.rebalance_interval_ms),
                metrics_address=self.metrics_address)
            self._admin.store, self._admin.ownership = self.segments, self.ownership
            await self.ownership.start()
            self.watchdog.start()
            segments = self.segments
            self.autoscaler = AutoScaleReporter(
                lambda: [segments.container(c) for c in segments.container_ids],
                ScaleRequests(self.metadata), cfg.autoscaler(), segments.clock.wall_ms)
            self.autoscaler.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close containers (draining their queued operations), then the
        server, the client and the metadata session (idempotent); ``/metrics``
        first (its authenticator reads the metadata store)."""
        await self.watchdog.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.autoscaler is not None:
            await self.autoscaler.close()
            self.autoscaler = None
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

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def ready_event(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "address": self.address,
                "metrics": self.metrics_address}


def run_segment_store(config: SegmentStoreHostConfig) -> None:
    """Blocking entry point of ``quire segmentstore start``."""
    run(lambda: SegmentStoreHost(config), config.gc_gen0_threshold_allocations)
