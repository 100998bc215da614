"""The controller process: ``quire controller start`` runs :func:`run_controller`.

The controller keeps its state in ``_system`` table segments, which live
in segment containers like any segment; it reaches them, wherever their
containers are hosted, through :class:`~quire.streams.RemoteSegmentStore`
over Pravega's wire protocol, and finds a segment's owner in the ownership
records of the metadata store (the same records that ``getURI`` answers
from), so it follows containers as they move between segment stores.

Security: with TLS settings the gRPC port serves TLS, and the controller
speaks TLS to the segment stores too (trusting ``tls_ca_file``, or the
system's CAs); with ``auth_enabled`` it authenticates every call, issues
delegation tokens signed with the cluster secret
(``auth_token_secret_file``, required then), and carries the internal
identity's token on its own wire requests (its ``_system`` tables).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

from quire.auth import server_security
from quire.config import ServerAddressConfig
from quire.controller import Controller, ControllerConfig, NodeAddress
from quire.controller.cluster import MetadataCluster
from quire.controller.cluster_view import ClusterView, PeerHttp
from quire.controller.interceptor import ControllerRpcConfig
from quire.controller.page import ClusterPage
from quire.errors import ConfigError
from quire.hosts.process import run
from quire.http import SessionStore
from quire.metadata import MetadataStore, open_leased_store
from quire.security import SecurityConfig, TokenSigner, client_context
from quire.segmentstore import owner_address
from quire.segmentstore.scale_requests import ScaleRequests
from quire.streams import (
    NO_TOKENS,
    InternalTokens,
    RemoteSegmentStore,
    SegmentClientConfig,
    metadata_resolver,
)
from quire.streams.connection import split_address

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerHostConfig(ServerAddressConfig):
    """``host``, ``listen_host`` and ``advertised_host``: see
    :class:`~quire.config.ServerAddressConfig` (gRPC and the HTTP port
    listen on the listen host; the member record and the ready line carry
    the advertised one)."""

    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    port: int = 9090
    """The gRPC port (Pravega's default; 0: any free one)."""
    metrics_port: int = -1
    """``/metrics`` (Prometheus) on this port; 0: any free one; -1: off."""
    retention_interval_ms: int = 60_000
    """How often streams with a retention policy are truncated."""
    segment_request_timeout_ms: int = 30_000
    """How long one segment-store request may take (then its outcome is unknown)."""
    txn_max_lease_ms: int = 600_000
    """The longest transaction lease (Pravega's default maximum, 600 s)."""
    txn_sweep_interval_ms: int = 1_000
    """How often the leader looks for expired leases and half-done workflows."""
    autoscale_interval_ms: int = 1_000
    """How often the leader acts on the segment stores' auto-scaling requests."""
    autoscale_request_validity_ms: int = 600_000
    """Auto-scaling requests older than this are dropped (Pravega's 10 minutes)."""
    lease_ms: int = 0
    """The metadata session's lease: the embedded drivers' lease, or
    ZooKeeper's session timeout (0: the driver's default): how soon after
    this controller dies another takes over its duties and its half-done
    work."""
    workflow_pause_ms: int = 0
    """Pause after each workflow's intent is written (tests and demos)."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """TLS and authentication (flat keys ``tls_cert_file``, ``auth_enabled``...,
    see :class:`~quire.security.SecurityConfig`) of the gRPC port and
    ``/metrics`` (module docstring)."""
    rpc: ControllerRpcConfig = field(default_factory=ControllerRpcConfig)
    """gRPC limits and the delegation tokens' life (flat keys
    ``max_concurrent_rpcs``, ``grpc_max_connection_idle_ms``,
    ``grpc_max_connection_age_ms``, ``grpc_max_connection_age_grace_ms``,
    ``delegation_token_ttl_ms``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.segment_request_timeout_ms <= 0:
            raise ConfigError("segment_request_timeout_ms must be positive")
        if self.lease_ms < 0:
            raise ConfigError("lease_ms must not be negative")


def cluster_signer(security: SecurityConfig) -> TokenSigner | None:
    """The cluster secret's signer with ``auth_enabled`` (None without);
    ConfigError if the secret file is not set, missing or open to others."""
    if not security.auth_enabled:
        return None
    if not security.auth_token_secret_file:
        raise ConfigError("auth_enabled on a controller needs auth_token_secret_file (the "
                          "cluster secret that signs delegation tokens)")
    return TokenSigner.from_file(security.auth_token_secret_file)


def segment_store_tls(security: SecurityConfig) -> ssl.SSLContext | None:
    """The client context of the controller's segment-store connections:
    TLS when the controller itself serves TLS (a cluster is secured as a
    whole), trusting ``tls_ca_file`` (else the system's CAs)."""
    if not security.tls_enabled:
        return None
    return (client_context(security.tls_ca_file) if security.tls_ca_file
            else ssl.create_default_context())


class ControllerHost:
    """See the module docstring."""

    def __init__(self, config: ControllerHostConfig) -> None:
        self.config = config
        self.metadata: MetadataStore | None = None
        self.segments: RemoteSegmentStore | None = None
        self.controller: Controller | None = None
        self.view: ClusterView | None = None
        self.address = ""
        self.metrics_address: str | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        try:
            self.metadata = await open_leased_store(
                cfg.metadata_uri, cfg.lease_ms, **cfg.security.zookeeper.store_options())
            resolve = metadata_resolver(self.metadata, owner_address)

            async def locate(segment: str) -> NodeAddress:
                return split_address(await resolve(segment))

            tokens = cluster_signer(cfg.security)
            self.segments = RemoteSegmentStore(resolve, SegmentClientConfig(
                request_timeout_ms=cfg.segment_request_timeout_ms,
                retry_deadline_ms=cfg.segment_request_timeout_ms),
                tls=segment_store_tls(cfg.security),
                tokens=InternalTokens(tokens) if tokens is not None else NO_TOKENS)
            self.controller = Controller(
                self.segments, self._controller_config(), locate,
                cluster=MetadataCluster(self.metadata, cfg.advertised_address(cfg.port)),
                requests=ScaleRequests(self.metadata),
                security=server_security(cfg.security, self.metadata),
                tokens=tokens, rpc=cfg.rpc)
            self._add_page(self.controller, self.metadata)
            port = await self.controller.start(cfg.resolved_listen_host, cfg.port)
            self.address = cfg.advertised_address(port)
            if self.controller.metrics_port is not None:
                self.metrics_address = cfg.advertised_address(self.controller.metrics_port)
                if self.view is not None:
                    self.view.start()
        except BaseException:
            await self.stop()
            raise

    def _add_page(self, controller: Controller, metadata: MetadataStore) -> None:
        """The cluster page at /ui/ (quire.controller.page) and the REST API's
        reader-group listing, both reading the other processes over HTTP with
        this controller's TLS trust and, under auth, an internal token."""
        security = self.config.security
        tls = client_context(security.tls_ca_file) if security.tls_ca_file else None
        signer = TokenSigner.from_file(security.auth_token_secret_file) \
            if security.auth_enabled and security.auth_token_secret_file else None

        def authorization() -> str | None:
            return None if signer is None else f"Bearer {signer.internal_token(60)}"

        self.view = ClusterView(controller.core, metadata, PeerHttp(tls, authorization),
                                controller.reader_groups)
        controller.reader_groups.lister = self.view.segment_names
        authenticator = controller.security.authenticator
        controller.sessions = SessionStore() if authenticator is not None else None
        controller.http_routes = ClusterPage(self.view, authenticator, controller.sessions,
                                             secure_cookie=controller.security.tls is not None
                                             ).routes()

    def _controller_config(self) -> ControllerConfig:
        cfg = self.config
        return ControllerConfig(metrics_port=cfg.metrics_port,
                                retention_interval_ms=cfg.retention_interval_ms,
                                txn_max_lease_ms=cfg.txn_max_lease_ms,
                                txn_sweep_interval_ms=cfg.txn_sweep_interval_ms,
                                autoscale_interval_ms=cfg.autoscale_interval_ms,
                                autoscale_request_validity_ms=cfg.autoscale_request_validity_ms,
                                workflow_pause_ms=cfg.workflow_pause_ms)

    async def stop(self) -> None:
        """Stop serving, then drop the segment-store connections and the
        metadata session (idempotent)."""
        if self.view is not None:
            await self.view.close()
            self.view = None
        if self.controller is not None:
            await self.controller.close()
            self.controller = None
        if self.segments is not None:
            await self.segments.close()
            self.segments = None
        if self.metadata is not None:
            await self.metadata.close()
            self.metadata = None
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def ready_event(self) -> dict[str, Any]:
        cfg = self.config
        http = "https" if cfg.security.tls_enabled else "http"
        page = f"{http}://{self.metrics_address}/ui/" if self.metrics_address else None
        member = self.controller.core.cluster.member if self.controller is not None else None
        scheme = "tls" if cfg.security.tls_enabled else "tcp"
        port = self.address.rpartition(":")[2]
        return {"address": self.address,
                "uri": f"{scheme}://{cfg.resolved_advertised_host}:{port}",
                "metrics": self.metrics_address, "page": page, "member": member}


def run_controller(config: ControllerHostConfig) -> None:
    """Blocking entry point of ``quire controller start``."""
    run(lambda: ControllerHost(config))
