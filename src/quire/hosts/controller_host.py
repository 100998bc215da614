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
from quire.controller import Controller, ControllerConfig, NodeAddress
from quire.controller.interceptor import ControllerRpcConfig
from quire.errors import ConfigError
from quire.hosts.process import run
from quire.metadata import MetadataStore, open_store
from quire.security import SecurityConfig, TokenSigner, client_context
from quire.segmentstore import owner_address
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
class ControllerHostConfig:
    metadata_uri: str = "sqlite:///quire-sandbox/metadata.db"
    host: str = "127.0.0.1"
    port: int = 9090
    """The gRPC port (Pravega's default; 0: any free one)."""
    advertise_host: str = ""
    """The host name of the URI it announces when ready ("" : ``host``);
    under TLS a DNS name the certificate covers (e.g. ``localhost``)."""
    metrics_port: int = -1
    """``/metrics`` (Prometheus) on this port; 0: any free one; -1: off."""
    retention_interval_ms: int = 60_000
    """How often streams with a retention policy are truncated."""
    segment_request_timeout_ms: int = 30_000
    """How long one segment-store request may take (then its outcome is unknown)."""
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
        if self.segment_request_timeout_ms <= 0:
            raise ConfigError("segment_request_timeout_ms must be positive")


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
        self.address = ""
        self.metrics_address: str | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config
        try:
            self.metadata = await open_store(cfg.metadata_uri)
            resolve = metadata_resolver(self.metadata, owner_address)

            async def locate(segment: str) -> NodeAddress:
                return split_address(await resolve(segment))

            tokens = cluster_signer(cfg.security)
            self.segments = RemoteSegmentStore(resolve, SegmentClientConfig(
                request_timeout_ms=cfg.segment_request_timeout_ms,
                retry_deadline_ms=cfg.segment_request_timeout_ms),
                tls=segment_store_tls(cfg.security),
                tokens=InternalTokens(tokens) if tokens is not None else NO_TOKENS)
            self.controller = Controller(self.segments, self._controller_config(), locate,
                                         security=server_security(cfg.security, self.metadata),
                                         tokens=tokens, rpc=cfg.rpc)
            port = await self.controller.start(cfg.host, cfg.port)
            self.address = f"{cfg.host}:{port}"
            if self.controller.metrics_port is not None:
                self.metrics_address = f"{cfg.host}:{self.controller.metrics_port}"
        except BaseException:
            await self.stop()
            raise

    def _controller_config(self) -> ControllerConfig:
        cfg = self.config
        return ControllerConfig(metrics_port=cfg.metrics_port,
                                retention_interval_ms=cfg.retention_interval_ms)

    async def stop(self) -> None:
        """Stop serving, then drop the segment-store connections and the
        metadata session (idempotent)."""
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
        scheme = "tls" if cfg.security.tls_enabled else "tcp"
        port = self.address.rpartition(":")[2]
        return {"address": self.address,
                "uri": f"{scheme}://{cfg.advertise_host or cfg.host}:{port}",
                "metrics": self.metrics_address}


def run_controller(config: ControllerHostConfig) -> None:
    """Blocking entry point of ``quire controller start``."""
    run(lambda: ControllerHost(config))
